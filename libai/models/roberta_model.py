"""RoBERTa: BERT (:mod:`libai.models.bert_model`) with padding-aware positions and one
token type, a masked-LM head, a causal-LM head and a sequence-classification head.

Positions start at ``pad_token_id + 1`` and skip padding tokens (padding gets position
``pad_token_id``), as transformers' ``create_position_ids_from_input_ids``.
"""

from __future__ import annotations

import torch
from torch import nn

from libai.layers import Linear, ParallelCrossEntropyLoss, init_method_normal
from libai.models.bert_model import (
    BertEmbeddings,
    BertForClassification,
    BertLMHead,
    BertModel,
    BertPipelineMixin,
    masked_lm_labels,
)
from libai.models.utils.hf_kwargs import accepts_hf_keywords

#: RoBERTa's defaults where they differ from BERT's (roberta-base)
ROBERTA_DEFAULTS = dict(
    vocab_size=50265,
    max_position_embeddings=514,
    num_tokentypes=1,
    layernorm_eps=1e-5,
    pad_token_id=1,
)


def create_position_ids_from_input_ids(input_ids: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """``padding_idx + 1, padding_idx + 2, ...`` over real tokens; ``padding_idx`` on padding."""
    mask = input_ids.ne(padding_idx).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + padding_idx


class RobertaEmbeddings(BertEmbeddings):
    """BERT embeddings whose positions skip padding; the padding position gets no gradient."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.pad_token_id is None:
            raise ValueError("RoBERTa needs pad_token_id (positions are counted past padding)")
        self.position_padding_idx = self.pad_token_id
        self.position_offset = self.pad_token_id + 1

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return create_position_ids_from_input_ids(input_ids, self.pad_token_id)


class RobertaModel(BertModel):
    """The RoBERTa encoder: :class:`BertModel` with :data:`ROBERTA_DEFAULTS` and
    :class:`RobertaEmbeddings`; same hyper-parameters and outputs."""

    embeddings_class = RobertaEmbeddings

    def __init__(self, cfg=None, **kwargs):
        super().__init__(cfg={**ROBERTA_DEFAULTS, **(cfg or {})}, **kwargs)


class RobertaForPreTraining(BertPipelineMixin, nn.Module):
    """RoBERTa with the masked-LM head (transformers' ``RobertaForMaskedLM``).

    ``forward(input_ids, attention_mask, tokentype_ids, lm_labels, loss_mask)``: in training
    ``{"lm_loss"}``; in eval also ``logits``; without labels ``{"logits"}`` (full vocab).
    """

    head_name = "lm_head"
    #: backbone settings the head imposes
    backbone_overrides: dict = {"add_pooling_layer": False}

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        self.roberta = RobertaModel(cfg=cfg, **{**kwargs, **self.backbone_overrides})
        cfg = self.roberta.libai_cfg
        self.lm_head = BertLMHead(
            self.roberta.embeddings.vocab_embeddings,
            cfg["hidden_size"],
            init_method_normal(cfg["initializer_range"]),
            cfg["activation"],
            cfg["layernorm_eps"],
        )
        self.loss_func = ParallelCrossEntropyLoss()

    @property
    def backbone(self) -> RobertaModel:
        return self.roberta

    def head_forward(self, hidden):
        return self.lm_head(hidden)

    def lm_loss(self, logits, labels):
        """Mean cross entropy over the positions whose label is not -100 (in training, over the
        whole data-parallel batch, as LiBai's global loss)."""
        return self.loss_func(logits, labels, self.training)

    def _outputs(self, input_ids, attention_mask, tokentype_ids, labels):
        hidden = self.roberta(input_ids, attention_mask, tokentype_ids)["last_hidden_state"]
        logits = self.lm_head(hidden)
        out = {}
        if labels is not None:
            out["lm_loss"] = self.lm_loss(logits, labels)
        if labels is None or not self.training:
            out["logits"] = self.lm_head.lm_logits.gather(logits)
        return out

    @accepts_hf_keywords
    def forward(
        self, input_ids, attention_mask=None, tokentype_ids=None, lm_labels=None, loss_mask=None
    ):
        labels = None if lm_labels is None else masked_lm_labels(lm_labels, loss_mask)
        return self._outputs(input_ids, attention_mask, tokentype_ids, labels)

    def pipeline_target(self, batch) -> torch.Tensor:
        return masked_lm_labels(batch["lm_labels"], batch.get("loss_mask"))

    def pipeline_loss(self, logits, labels) -> torch.Tensor:
        return self.lm_loss(logits, labels)


class RobertaForCausalLM(RobertaForPreTraining):
    """RoBERTa as a causal LM (transformers' ``RobertaForCausalLM`` with ``is_decoder=True``).

    ``forward(input_ids, attention_mask, tokentype_ids, labels)``: ``labels`` are NOT shifted
    (``-100`` = no loss); the model predicts ``labels[t + 1]`` from position ``t``, as
    transformers does. Returns ``{"lm_loss"}`` in training, plus ``logits`` in eval;
    ``{"logits"}`` without labels.
    """

    backbone_overrides = {"add_pooling_layer": False, "attn_mask_type": "causal"}

    def lm_loss(self, logits, labels):
        return self.loss_func(logits[:, :-1], labels[:, 1:])

    @accepts_hf_keywords
    def forward(self, input_ids, attention_mask=None, tokentype_ids=None, labels=None):
        return self._outputs(input_ids, attention_mask, tokentype_ids, labels)

    def pipeline_target(self, batch) -> torch.Tensor:
        return batch["labels"]


class RobertaClassificationHead(nn.Module):
    """The <s> token -> dropout -> ``dense`` -> tanh -> dropout -> ``out_proj``
    (transformers' ``RobertaClassificationHead``; RoBERTa has no pooler)."""

    def __init__(self, hidden_size: int, num_labels: int, init_method, dropout_prob: float):
        super().__init__()
        self.layer_idx = -1
        self.dropout = nn.Dropout(dropout_prob)
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
        self.dense = Linear(hidden_size, hidden_size, True, "data", init_method, layer_idx=-1)
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
        self.out_proj = Linear(hidden_size, num_labels, True, "data", init_method, layer_idx=-1)

    def _drop(self, x):
        return self.dropout(x) if self.dropout.p > 0 else x

    def forward(self, hidden_states):
        x = self._drop(hidden_states[:, 0])
        return self.out_proj(self._drop(torch.tanh(self.dense(x))))


class RobertaForClassification(BertForClassification):
    """RoBERTa with :class:`RobertaClassificationHead` as ``classifier`` (transformers'
    ``RobertaForSequenceClassification``).

    The contract of :class:`BertForClassification`, whose loss, ``forward``, ``libai_cfg``
    and pipeline methods it inherits: ``forward(input_ids, attention_mask, tokentype_ids,
    labels)`` returns ``{"logits"}``, and ``{"loss"}`` with labels (cross entropy; mean
    squared error when ``num_labels == 1``); ``num_labels`` and ``classifier_dropout``
    (``None`` = the hidden dropout) are head options.
    """

    def __init__(self, cfg=None, **kwargs):
        nn.Module.__init__(self)  # not BertForClassification's: it builds a BERT backbone
        cfg = self._pop_head_options(cfg, kwargs)
        self.roberta = RobertaModel(cfg={**cfg, "add_pooling_layer": False})
        backbone_cfg = self.roberta.libai_cfg
        p = self.classifier_dropout
        self.classifier = RobertaClassificationHead(
            backbone_cfg["hidden_size"],
            self.num_labels,
            init_method_normal(backbone_cfg["initializer_range"]),
            backbone_cfg["hidden_dropout_prob"] if p is None else p,
        )

    @property
    def backbone(self) -> RobertaModel:
        return self.roberta

    def head_forward(self, hidden):
        return self.classifier(hidden)
