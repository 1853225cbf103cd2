"""ERNIE (1.0 / 3.0 as in transformers' ``ErnieModel`` and FleetX's): BERT
(:mod:`libai.models.bert_model`) plus, with ``use_task_id``, a task-type embedding added to
the word + position + token-type embeddings before their LayerNorm.

The task type of every token is ``task_id`` (FleetX's ``Model.task_id``; transformers uses 0
when no ``task_type_ids`` are given). Everything else -- encoder, pooler, masked-LM and
sentence-pair heads, losses, pipeline contract -- is BERT's.
"""

from __future__ import annotations

import torch

from libai.layers import Embedding, init_method_normal
from libai.models.bert_model import (
    BertEmbeddings,
    BertForClassification,
    BertForPreTraining,
    BertModel,
)

#: ERNIE's hyper-parameters on top of BERT's, with their defaults
ERNIE_KEYS = {"use_task_id": False, "task_type_vocab_size": 3, "task_id": 0}


class ErnieEmbeddings(BertEmbeddings):
    """BERT's embeddings; :class:`ErnieModel` adds ``task_type_embeddings`` when asked."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.task_type_embeddings = None
        self.task_id = 0

    def extra_embeddings(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        if self.task_type_embeddings is None:
            return hidden
        task_type_ids = torch.full_like(input_ids, self.task_id)
        return hidden + self.task_type_embeddings(task_type_ids)


class ErnieModel(BertModel):
    """The ERNIE encoder: :class:`BertModel`'s hyper-parameters plus ``use_task_id``,
    ``task_type_vocab_size`` and ``task_id`` (see :data:`ERNIE_KEYS`)."""

    embeddings_class = ErnieEmbeddings

    def __init__(self, cfg=None, **kwargs):
        cfg = {**(cfg or {}), **kwargs}
        ernie = {key: cfg.pop(key, default) for key, default in ERNIE_KEYS.items()}
        super().__init__(cfg=cfg)
        if ernie["use_task_id"]:
            task_types = int(ernie["task_type_vocab_size"])
            if not 0 <= int(ernie["task_id"]) < task_types:
                raise ValueError(
                    f"Model.task_id={ernie['task_id']} is outside the task type vocabulary "
                    f"(task_type_vocab_size={task_types}); use 0 .. {task_types - 1}"
                )
            self.embeddings.task_type_embeddings = Embedding(
                task_types,
                self.libai_cfg["hidden_size"],
                init_method_normal(self.libai_cfg["initializer_range"]),
                layer_idx=0,
            )
            self.embeddings.task_id = int(ernie["task_id"])
        self.__dict__["libai_cfg"] = {**self.libai_cfg, **ernie}


class ErnieForPreTraining(BertForPreTraining):
    """ERNIE with masked-LM and sentence-pair heads (transformers' ``ErnieForPreTraining``):
    :class:`~libai.models.bert_model.BertForPreTraining` on an :class:`ErnieModel`, same
    inputs and outputs (``lm_loss``, ``sop_loss``)."""

    backbone_class = ErnieModel


class ErnieForClassification(BertForClassification):
    """ERNIE with a sequence-classification head (transformers'
    ``ErnieForSequenceClassification``): :class:`~libai.models.bert_model.BertForClassification`
    on an :class:`ErnieModel`, same inputs, outputs and head options."""

    backbone_class = ErnieModel
