"""FleetX's GPT fine-tuning on GLUE as a task module: ``Model.module: GPTFinetuneModule``
(FleetX's ``finetune_gpt_345M_single_card_glue.yaml``)."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from libai.fleetx.modules.gpt import GPTModule
from libai.models import GPTForPreTraining, GPTModel

logger = logging.getLogger(__name__)

__all__ = ["GPTFinetuneModule", "GPTSequenceClassifier"]

#: Model keys of this module (the rest are GPT's hyper-parameters)
FINETUNE_KEYS = ("num_classes", "loss", "metric")
LOSSES = ("CrossEntropyLoss",)
METRICS = ("Accuracy",)


class GPTSequenceClassifier(nn.Module):
    """A GPT with a bias-free linear ``score`` head read at each row's last real token
    (the one before the right padding ``pad_token_id``): ``model(input_ids)`` returns
    ``{"logits": [batch, num_classes]}``, with ``labels`` also ``{"loss"}``."""

    def __init__(self, gpt: GPTModel, num_classes: int, pad_token_id: int, init_std: float):
        super().__init__()
        self.gpt, self.pad_token_id = gpt, int(pad_token_id)
        hidden = gpt.embeddings.token_embeddings.embedding_dim
        self.score = nn.Linear(hidden, int(num_classes), bias=False)
        nn.init.normal_(self.score.weight, std=init_std)

    def last_positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Index of each row's last token that is not padding."""
        return ((input_ids != self.pad_token_id).sum(-1) - 1).clamp(min=0)

    def forward(self, input_ids, labels=None):
        hidden = self.gpt(input_ids, return_hidden=True)  # [B, S, H], after the final norm
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        logits = self.score(hidden[rows, self.last_positions(input_ids)])
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.float(), labels)
        return out


class GPTFinetuneModule(GPTModule):
    """FleetX's ``GPTFinetuneModule``: GLUE sequence classification with a GPT.

    ``Model`` keys: GPT's hyper-parameters, ``num_classes``, ``pretrained`` (a Hugging Face
    GPT-2 directory; FleetX's Paddle ``.pdparams`` cannot be read here: convert it, or
    fine-tune from a checkpoint of this library with ``Engine.save_load.ckpt_dir``),
    ``loss: {train: {name: CrossEntropyLoss}, eval: ...}`` and ``metric: {eval: {name:
    Accuracy}}`` (the ones that exist here). Data: FleetX's GLUE names (``SST2``,
    ``CoLA``, ... :mod:`libai.data.datasets.glue`) under their local ``root``.

    Evaluation reports the loss and ``acc``. One process or data parallel (FleetX's runs on
    one card only)."""

    libai_model = False  # the head reads one position per row: data parallel / sharding
    module_keys = FINETUNE_KEYS

    def process_configs(self, configs):
        model = OmegaConf.to_container(configs.Model, resolve=True)
        for part, allowed in (("loss", LOSSES), ("metric", METRICS)):
            for split, spec in (model.get(part) or {}).items():
                name = (spec or {}).get("name")
                if name not in allowed:
                    raise ValueError(
                        f"Model.{part}.{split}.name={name!r} is not supported here; use one of "
                        f"{', '.join(allowed)}"
                    )
        self.num_classes = int(model.get("num_classes", 2))
        return configs

    def get_model(self):
        kwargs = self.model_kwargs()
        pretrained = self.cfg.Model.get("pretrained")
        if pretrained:
            from libai.models.utils import load_huggingface

            gpt = load_huggingface(str(pretrained), GPTForPreTraining, **kwargs).GPT_model
        else:
            if kwargs.get("ffn_hidden_size") is None and kwargs.get("hidden_size"):
                kwargs["ffn_hidden_size"] = 4 * int(kwargs["hidden_size"])
            gpt = GPTModel(**kwargs)
        std = float(self.cfg.Model.get("initializer_range", 0.02))
        return GPTSequenceClassifier(gpt, self.num_classes, self.tokenizer.eos_token_id, std)

    def pretreating_batch(self, batch):
        return batch

    def validation_step(self, batch):
        out = self.model(**batch)
        correct = (out["logits"].argmax(-1) == batch["labels"]).sum()
        return {"loss": out["loss"], "correct": correct, "count": batch["labels"].numel()}

    def validation_epoch_end(self, log_dict):
        sums = log_dict.get("sums") or {}
        if not sums.get("count"):
            return None
        acc = sums["correct"] / sums["count"]
        logger.info("[Eval] epoch: %d, acc: %.5f", log_dict.get("epoch", 0), acc)
        return {"acc": acc}

    def input_spec(self):
        from libai.fleetx.module import InputSpec

        vocab = self.model.gpt.embeddings.token_embeddings.num_embeddings
        return [InputSpec([None, None], "int64", "input_ids", high=vocab)]
