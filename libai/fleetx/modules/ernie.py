"""ERNIE as task modules by FleetX's names: ``ErnieModule`` (pretraining) and
``ErnieSeqClsModule`` (sequence classification)."""

from __future__ import annotations

import os

from omegaconf import OmegaConf, open_dict

from libai.fleetx.module import InputSpec
from libai.fleetx.modules.base import AccuracyModule, ZooModule
from libai.models.bert_model import BertModel
from libai.models.ernie_model import ERNIE_KEYS, ErnieForClassification, ErnieForPreTraining

__all__ = ["ErnieModule", "ErnieSeqClsModule", "ernie_tokenizer", "from_fleetx_batch"]


class ErnieModule(ZooModule):
    """:class:`~libai.models.ernie_model.ErnieForPreTraining` (BERT's encoder and heads plus
    ERNIE's task-type embedding) from FleetX's ERNIE ``Model`` keys.

    ``Model`` keys: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``intermediate_size`` (unset or null = 4 x ``hidden_size``, as FleetX), ``hidden_act``,
    ``hidden_dropout_prob``, ``attention_probs_dropout_prob``, ``max_position_embeddings``,
    ``type_vocab_size``, ``initializer_range``, ``pad_token_id``, ``vocab_size``,
    ``use_task_id`` / ``task_type_vocab_size`` / ``task_id`` (the task-type embedding), and
    ``pretrained`` (a transformers ERNIE directory). ``Global.binary_head`` (default True)
    adds the sentence-pair loss (``sop_loss``) to the masked-LM loss, as FleetX's criterion.

    Batches: ``{"input_ids", "tokentype_ids", "attention_mask", "lm_labels", "ns_labels"}``
    (``lm_labels`` -100 where there is no masked-LM target).
    """

    model_class = ErnieForPreTraining
    config_class = BertModel
    head_keys = tuple(ERNIE_KEYS)
    aliases = {
        "num_hidden_layers": "hidden_layers",
        "hidden_act": "activation",
    }
    #: FleetX's ``type_vocab_size`` is a no-effect key for GPT (base.MODULE_KEYS); here it is
    #: the token-type vocabulary, read in :meth:`model_kwargs`
    module_keys = ()

    @property
    def binary_head(self) -> bool:
        """FleetX's ``Global.binary_head``: the sentence-pair (NSP / SOP) loss is on."""
        value = OmegaConf.select(self.cfg, "Global.binary_head", default=True)
        return True if value is None else bool(value)

    def __init__(self, cfg):
        # a plain attribute, before the model: the Engine hands it to ErnieDataset (FleetX's
        # files give every split the same tokenizer_type; the first split's is used)
        self.tokenizer = None
        for mode in ("Train", "Eval", "Test"):
            key = f"Data.{mode}.dataset.tokenizer_type"
            if OmegaConf.select(cfg, key) is not None:
                self.tokenizer = ernie_tokenizer(OmegaConf.select(cfg, key), key)
                break
        super().__init__(cfg)

    def process_configs(self, configs):
        """As FleetX: each split's ``ErnieDataset`` builds sentence pairs when
        ``Global.binary_head`` is on (unless the dataset section says otherwise)."""
        binary_head = OmegaConf.select(configs, "Global.binary_head", default=True)
        for mode in ("Train", "Eval", "Test"):
            dataset = OmegaConf.select(configs, f"Data.{mode}.dataset")
            if dataset is not None and dataset.get("name") == "ErnieDataset":
                if dataset.get("binary_head") is None:
                    with open_dict(dataset):
                        dataset.binary_head = True if binary_head is None else bool(binary_head)
        return configs

    def model_kwargs(self) -> dict:
        kwargs = super().model_kwargs()
        model_cfg = self.cfg.Model
        if model_cfg.get("type_vocab_size") is not None:
            kwargs["num_tokentypes"] = int(model_cfg.type_vocab_size)
        if kwargs.get("intermediate_size") is None and kwargs.get("hidden_size"):
            kwargs["intermediate_size"] = 4 * int(kwargs["hidden_size"])  # FleetX's default
        return kwargs

    def get_model(self):
        kwargs = self.model_kwargs()
        pretrained = self.cfg.Model.get("pretrained")
        if pretrained:
            from libai.models.utils import load_huggingface

            return load_huggingface(str(pretrained), self.model_class, **kwargs)
        return self.model_class(**kwargs)

    def pretreating_batch(self, batch):
        """FleetX's 6-field batches (see :func:`from_fleetx_batch`) become mappings; without
        ``Global.binary_head`` the sentence-pair labels are dropped (masked-LM loss only, as
        FleetX's criterion with ``with_nsp_loss=False``)."""
        if isinstance(batch, (list, tuple)) and len(batch) == 6:
            batch = from_fleetx_batch(*batch)
        if not self.binary_head and isinstance(batch, dict) and "ns_labels" in batch:
            batch = {k: v for k, v in batch.items() if k != "ns_labels"}
        return batch

    def input_spec(self):
        vocab = self.model.bert.embeddings.vocab_embeddings.num_embeddings
        return [InputSpec([None, None], "int64", "input_ids", high=vocab)]


class ErnieSeqClsModule(AccuracyModule, ErnieModule):
    """:class:`~libai.models.ernie_model.ErnieForClassification` (ERNIE's pooled [CLS] ->
    dropout -> classifier, FleetX's ``ErnieForSequenceClassification``) from the same
    ``Model`` keys as :class:`ErnieModule`, plus ``num_classes`` (default 2, FleetX's) and
    ``dropout`` (the classifier dropout; null = ``hidden_dropout_prob``). Cross-entropy loss
    (mean squared error with one class), accuracy in evaluation.

    Batches: ``{"input_ids", "tokentype_ids" (or ``token_type_ids``), "attention_mask",
    "labels"}``, e.g. ``Data.*.dataset.name: TextClassificationDataset`` on local files
    (FleetX's ``ErnieSeqClsDataset`` downloads PaddleNLP data sets by name, which is not
    done here).
    """

    model_class = ErnieForClassification
    head_keys = (*ERNIE_KEYS, "num_labels", "classifier_dropout")
    aliases = {**ErnieModule.aliases, "num_classes": "num_labels", "dropout": "classifier_dropout"}


def ernie_tokenizer(tokenizer_type: str, key: str = "Data.Train.dataset.tokenizer_type"):
    """A libai BERT WordPiece tokenizer from a local ``vocab.txt`` (or a directory holding
    one). FleetX's PaddleNLP hub names are not downloaded here."""
    from libai.tokenizer import BertTokenizer

    path = str(tokenizer_type)
    if os.path.isdir(path):
        path = os.path.join(path, "vocab.txt")
    if not os.path.isfile(path):
        raise ValueError(
            f"{key}={tokenizer_type!r} is not a local file: FleetX "
            "downloads PaddleNLP's tokenizers by name, this library does not; give the path "
            f"of the ERNIE vocab.txt (or its directory), e.g. -o {key}=/path/to/vocab.txt"
        )
    return BertTokenizer(path, do_lower_case=True)


def from_fleetx_batch(input_ids, segment_ids, input_mask, positions, labels, next_sentence):
    """FleetX's ``ErnieCollateData`` batch -> this library's: ``input_mask`` is additive
    (0 for tokens, -1e4 for padding, any shape with ``batch x seq`` elements);
    ``masked_lm_positions`` index the flattened ``[batch x seq]`` tokens, padded with
    labels -1; ``next_sentence_labels`` is ``[batch, 1]``."""
    import torch

    batch, seq = input_ids.shape
    labels = torch.as_tensor(labels).reshape(-1).long()
    positions = torch.as_tensor(positions).reshape(-1).long()
    real = labels != -1
    lm_labels = torch.full((batch * seq,), -100, dtype=torch.long, device=input_ids.device)
    lm_labels[positions[real]] = labels[real]
    return {
        "input_ids": input_ids,
        "tokentype_ids": segment_ids,
        "attention_mask": (torch.as_tensor(input_mask).reshape(batch, seq) == 0).long(),
        "lm_labels": lm_labels.reshape(batch, seq),
        "ns_labels": torch.as_tensor(next_sentence).reshape(-1).long(),
    }
