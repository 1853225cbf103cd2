"""BERT / RoBERTa sequence classification as a task module:
``Model.module: SequenceClassificationModule``."""

from __future__ import annotations

from libai.fleetx.module import InputSpec
from libai.fleetx.modules.base import AccuracyModule, tokenizer_from
from libai.models import BertForClassification, BertModel

__all__ = ["SequenceClassificationModule"]


class SequenceClassificationModule(AccuracyModule):
    """:class:`~libai.models.BertForClassification` or ``RobertaForClassification`` on
    ``TextClassificationDataset`` batches (``input_ids``, ``attention_mask``,
    ``tokentype_ids``, ``labels``); evaluation reports the loss and accuracy.

    ``Model`` keys: ``model_type`` (``bert`` or ``roberta``; default: ``config.json`` of
    ``pretrained``, else ``bert``), ``pretrained`` (a Hugging Face directory; a pretraining
    checkpoint gets a fresh classifier), ``tokenizer`` (default the pretrained directory),
    ``num_labels``, ``classifier_dropout``, and BERT's hyper-parameters for a model from
    scratch.
    """

    config_class = BertModel
    head_keys = ("num_labels", "classifier_dropout", "model_type")

    def __init__(self, cfg):
        model_cfg = cfg.Model
        pretrained = model_cfg.get("pretrained")
        model_type = model_cfg.get("model_type")
        if model_type is None and pretrained:
            from libai.models.utils import read_hf_config

            model_type = read_hf_config(str(pretrained)).get("model_type")
        self.model_type = str(model_type or "bert")
        if self.model_type not in ("bert", "roberta"):
            raise ValueError(
                f"Model.model_type must be 'bert' or 'roberta', got {self.model_type!r}"
            )
        self.model_class = _classifier(self.model_type)
        self.tokenizer = tokenizer_from(model_cfg.get("tokenizer"), pretrained)
        super().__init__(cfg)

    def model_kwargs(self) -> dict:
        kwargs = super().model_kwargs()
        kwargs.pop("model_type", None)
        return kwargs

    def input_spec(self):
        vocab = self.model.backbone.embeddings.vocab_embeddings.num_embeddings
        return [InputSpec([None, None], "int64", "input_ids", high=vocab)]


def _classifier(model_type: str):
    if model_type == "roberta":
        from libai.models import RobertaForClassification

        return RobertaForClassification
    return BertForClassification
