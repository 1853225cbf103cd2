"""BERT: word + position + token-type embeddings, encoder blocks, pooler, heads.

Two layouts, picked by the config:

- **Hugging Face / Google BERT** (default): LayerNorm after the embeddings, post-LN blocks
  ``norm(x + f(x))``, every weight initialised with ``normal(initializer_range)``.
- **LiBai's (Megatron's) BERT**, when the config gives ``apply_residual_post_layernorm``
  (``False`` or ``True``; LiBai's configs always carry it): no embedding LayerNorm, pre-LN
  blocks ``x + f(norm(x))`` (``norm(x) + f(norm(x))`` with ``True``), a final LayerNorm,
  output projections initialised with ``normal(initializer_range / sqrt(2 * layers))``, the
  masked-LM head's LayerNorm with LiBai's fixed eps 1e-5 (transformers'
  ``MegatronBertForPreTraining`` with ``apply_residual_post_layernorm=False``).

Hyper-parameters keep LiBai's names (``hidden_layers``, ``num_tokentypes``, ...). Outputs use
transformers' key names (``last_hidden_state``, ``pooler_output``, ``prediction_logits``,
``seq_relationship_logits``, ``logits``); losses LiBai's: ``lm_loss`` and ``sop_loss`` (the
next-sentence task, ``ns_labels = 0`` meaning "B follows A").

Masked-LM loss is the mean over the positions where ``lm_labels != -100`` and, when given,
``loss_mask == 1`` (LiBai's ``-1`` labels off the mask are fine); in training the mean is over
the whole data-parallel batch, as LiBai's global loss (``data_parallel_token_mean``).

Pipeline contract (``libai.runtime.parallel``): the first stage takes ``input_ids``; every
stage reads ``attention_mask`` and ``tokentype_ids`` from its own batch (stage keyword
inputs); every stage but the last hands its hidden states to the next; targets are packed
into one tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.config import configurable
from libai.layers import (
    Embedding,
    LayerNorm,
    Linear,
    LMLogits,
    ParallelCrossEntropyLoss,
    TransformerLayer,
    VocabEmbedding,
    init_method_normal,
    scaled_init_method_normal,
)
from libai.layers.mlp import ACTIVATIONS
from libai.models.encoder_outputs import EncoderLayers, EncoderOutput
from libai.models.libai_options import LIBAI_NO_EFFECT_MODEL_KEYS
from libai.models.utils.hf_kwargs import accepts_hf_keywords

IGNORE_INDEX = -100


def _no_grad_at(embedded: torch.Tensor, ids: torch.Tensor, padding_idx: int | None):
    """``nn.Embedding(padding_idx=...)`` semantics: the padding row is used in the forward but
    gets no gradient (as in transformers' BERT / RoBERTa embeddings)."""
    if padding_idx is None or not torch.is_grad_enabled():
        return embedded
    return torch.where((ids != padding_idx).unsqueeze(-1), embedded, embedded.detach())


class BertEmbeddings(nn.Module):
    """Word (vocab-parallel) + position + token-type embeddings, LayerNorm, dropout."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        num_tokentypes: int,
        init_method,
        dropout_prob: float,
        layernorm_eps: float,
        pad_token_id: int | None,
        layernorm: bool = True,
    ):
        super().__init__()
        self.layer_idx = 0
        self.pad_token_id = pad_token_id
        self.max_position_embeddings = max_position_embeddings
        self.vocab_embeddings = VocabEmbedding(vocab_size, hidden_size, init_method, layer_idx=0)
        self.position_embeddings = Embedding(
            max_position_embeddings, hidden_size, init_method, layer_idx=0
        )
        self.tokentype_embeddings = (
            Embedding(num_tokentypes, hidden_size, init_method, layer_idx=0)
            if num_tokentypes > 0
            else None
        )
        # LiBai's layout has no LayerNorm here (its blocks normalise their inputs)
        self.layernorm = (
            LayerNorm(hidden_size, eps=layernorm_eps, layer_idx=0) if layernorm else None
        )
        self.dropout = nn.Dropout(dropout_prob)

    #: row of the position table that gets no gradient (RoBERTa's padding position)
    position_padding_idx: int | None = None
    #: the first position id (RoBERTa: ``pad_token_id + 1``)
    position_offset: int = 0

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``0 .. seq - 1`` for every row (BERT)."""
        return torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)

    def extra_embeddings(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """More embeddings added before the LayerNorm (ERNIE's task type); none for BERT."""
        return hidden

    def forward(self, input_ids, tokentype_ids=None, position_ids=None):
        if position_ids is None:
            need = input_ids.shape[1] + self.position_offset
            if need > self.max_position_embeddings:  # checked on shapes: no device sync
                raise ValueError(
                    f"a sequence of {input_ids.shape[1]} tokens needs max_position_embeddings "
                    f">= {need}, got {self.max_position_embeddings}"
                )
            position_ids = self.position_ids(input_ids)
        words = _no_grad_at(self.vocab_embeddings(input_ids), input_ids, self.pad_token_id)
        positions = _no_grad_at(
            self.position_embeddings(position_ids), position_ids, self.position_padding_idx
        )
        hidden = words + positions
        if self.tokentype_embeddings is not None:
            if tokentype_ids is None:
                tokentype_ids = torch.zeros_like(input_ids)
            hidden = hidden + self.tokentype_embeddings(tokentype_ids)
        hidden = self.extra_embeddings(hidden, input_ids)
        if self.layernorm is not None:
            hidden = self.layernorm(hidden)
        return self.dropout(hidden) if self.dropout.p > 0 else hidden


class BertPooler(nn.Module):
    """``tanh(dense(hidden[:, 0]))``: the [CLS] representation."""

    def __init__(self, hidden_size: int, init_method):
        super().__init__()
        self.layer_idx = -1
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
        self.dense = Linear(hidden_size, hidden_size, True, "data", init_method, layer_idx=-1)

    def forward(self, hidden_states):
        return torch.tanh(self.dense(hidden_states[:, 0]))


class BertLMHead(nn.Module):
    """Masked-LM head: ``dense -> activation -> LayerNorm -> tied decoder + bias``.

    Returns vocab-split logits ``[S(0), S(-1)]`` (see :class:`libai.layers.LMLogits`).
    """

    def __init__(self, word_embeddings, hidden_size, init_method, activation, layernorm_eps):
        super().__init__()
        self.layer_idx = -1
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
        self.dense = Linear(hidden_size, hidden_size, True, "data", init_method, layer_idx=-1)
        self.act = ACTIVATIONS[activation]
        self.layernorm = LayerNorm(hidden_size, eps=layernorm_eps, layer_idx=-1)
        self.lm_logits = LMLogits(word_embeddings, bias=True, layer_idx=-1)

    def forward(self, hidden_states):
        return self.lm_logits(self.layernorm(self.act(self.dense(hidden_states))))


class BertModel(nn.Module):
    """The BERT encoder; ``forward`` returns an :class:`EncoderOutput`: LiBai's
    ``(encoder_output, pooled_output)``, also ``out["last_hidden_state"]`` /
    ``out["pooler_output"]`` (the latter only with ``add_pooling_layer``).

    ``attn_mask_type="causal"`` makes the self-attention causal (transformers'
    ``is_decoder=True`` without cross-attention, used by ``RobertaForCausalLM``).
    ``apply_residual_post_layernorm`` other than None selects LiBai's layout (module doc).
    """

    #: the embedding module (RoBERTa swaps in its padding-aware positions)
    embeddings_class = BertEmbeddings
    #: LiBai's model keys that change nothing here (accepted, named in one log line)
    libai_no_effect_keys = {
        **LIBAI_NO_EFFECT_MODEL_KEYS,
        "add_binary_head": "a BertForPreTraining option; the bare encoder has no heads",
    }

    @configurable
    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        num_tokentypes: int = 2,
        add_pooling_layer: bool = True,
        initializer_range: float = 0.02,
        layernorm_eps: float = 1e-12,
        activation: str = "gelu",
        pad_token_id: int | None = 0,
        attn_mask_type: str = "padding",
        apply_residual_post_layernorm: bool | None = None,
    ):
        super().__init__()
        dist.check_model_num_layers(hidden_layers, f"hidden_layers={hidden_layers}")
        #: LiBai's Megatron layout (pre-LN blocks, final LayerNorm; see the module doc)
        self.libai_layout = apply_residual_post_layernorm is not None
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        init_method = init_method_normal(initializer_range)
        output_init = init_method
        if self.libai_layout:  # std / sqrt(2 x layers) for the output projections, as LiBai
            output_init = scaled_init_method_normal(initializer_range, hidden_layers)
        self.num_layers = hidden_layers
        self.embeddings = self.embeddings_class(
            vocab_size,
            hidden_size,
            max_position_embeddings,
            num_tokentypes,
            init_method,
            hidden_dropout_prob,
            layernorm_eps,
            pad_token_id,
            layernorm=not self.libai_layout,
        )
        # keyed by layer index: a pipeline stage drops the others, names stay
        self.encoders = EncoderLayers(
            {
                str(i): TransformerLayer(
                    hidden_size,
                    intermediate_size,
                    num_attention_heads,
                    attention_dropout_prob=attention_probs_dropout_prob,
                    output_dropout_prob=hidden_dropout_prob,
                    layernorm_epsilon=layernorm_eps,
                    pre_norm=self.libai_layout,
                    activation=activation,
                    init_method=init_method,
                    output_layer_init_method=output_init,
                    attn_mask_type=attn_mask_type,
                    layer_idx=i,
                    apply_residual_post_layernorm=bool(apply_residual_post_layernorm),
                )
                for i in range(hidden_layers)
            }
        )
        self.final_layernorm = (
            LayerNorm(hidden_size, eps=layernorm_eps, layer_idx=-1) if self.libai_layout else None
        )
        self.pooler = BertPooler(hidden_size, init_method) if add_pooling_layer else None

    @staticmethod
    def extended_attn_mask(attention_mask: torch.Tensor) -> torch.Tensor:
        """LiBai's name: the ``[batch, seq]`` padding mask (1 for tokens) as the layers take
        it, ``[batch, 1, 1, seq]`` bool over the keys. (LiBai's also masks padded query rows;
        their outputs are padding either way.)"""
        return attention_mask.bool()[:, None, None, :]

    def stage_forward(self, x, attention_mask=None, tokentype_ids=None):
        """This pipeline stage's part: embeddings (token ids in, on the first stage) and the
        encoder layers it holds; returns hidden states ``[S(0), B]``."""
        hidden = x if self.embeddings is None else self.embeddings(x, tokentype_ids)
        mask = None if attention_mask is None else self.extended_attn_mask(attention_mask)
        for layer in self.encoders.values():
            hidden = layer(hidden, attention_mask=mask)
        if self.final_layernorm is not None:  # LiBai's layout, on the last stage
            hidden = self.final_layernorm(hidden)
        return hidden

    @accepts_hf_keywords
    def forward(self, input_ids, attention_mask=None, tokentype_ids=None):
        """Args:
        input_ids: ``[batch, seq]`` token ids.
        attention_mask: ``[batch, seq]``, 1 for tokens, 0 for padding.
        tokentype_ids: ``[batch, seq]`` segment ids (zeros when omitted).
        """
        hidden = self.stage_forward(input_ids, attention_mask, tokentype_ids)
        return EncoderOutput(hidden, None if self.pooler is None else self.pooler(hidden))


class BertPipelineMixin:
    """Pipeline contract shared by the BERT / RoBERTa heads.

    A head defines ``backbone`` (its BertModel), ``head_name`` (the attribute of its head
    module, ``layer_idx=-1`` so that only the last stage keeps it), ``head_forward(hidden)``
    (the last stage's output), ``pipeline_target(batch)`` and ``pipeline_loss(output,
    target)``.
    """

    head_name: str

    def pipeline_inputs(self, batch) -> tuple:
        return (batch["input_ids"],)

    def pipeline_stage_kwargs(self, batch) -> dict:
        """The padding mask and token type ids, which every stage reads from its own batch."""
        return {
            "attention_mask": batch.get("attention_mask"),
            "tokentype_ids": batch.get("tokentype_ids"),
        }

    def pipeline_forward(self, x, attention_mask=None, tokentype_ids=None):
        """One stage: ids (or hidden states) in; hidden states or the head output out."""
        hidden = self.backbone.stage_forward(x, attention_mask, tokentype_ids)
        if getattr(self, self.head_name) is None:  # not the last stage
            return hidden
        return self.head_forward(hidden)


def masked_lm_labels(lm_labels: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """``lm_labels`` with ``-100`` wherever ``loss_mask`` is 0 (when given)."""
    if loss_mask is None:
        return lm_labels
    return lm_labels.masked_fill(loss_mask == 0, IGNORE_INDEX)


class BertPreTrainingHeads(nn.Module):
    """Masked-LM head (``predictions``) + sentence-pair head (``seq_relationship``; ``None``
    without ``binary_head``, LiBai's ``add_binary_head=False``)."""

    def __init__(
        self, word_embeddings, hidden_size, init_method, activation, layernorm_eps, binary_head
    ):
        super().__init__()
        self.layer_idx = -1
        self.predictions = BertLMHead(
            word_embeddings, hidden_size, init_method, activation, layernorm_eps
        )
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
        self.seq_relationship = (
            Linear(hidden_size, 2, True, "data", init_method, layer_idx=-1) if binary_head else None
        )

    def forward(self, hidden_states, pooled):
        seq = None if self.seq_relationship is None else self.seq_relationship(pooled)
        return self.predictions(hidden_states), seq


class BertForPreTraining(BertPipelineMixin, nn.Module):
    """BERT with masked-LM and next-sentence heads (transformers' ``BertForPreTraining``).

    ``forward(input_ids, attention_mask, tokentype_ids, ns_labels, lm_labels, loss_mask)``:
    in training ``{"lm_loss", "sop_loss"}`` (``sop_loss`` only with ``ns_labels``); in eval
    also ``prediction_logits`` and ``seq_relationship_logits``; without labels only those.

    ``add_binary_head`` (LiBai's key, default True): ``False`` drops the sentence-pair head
    and its loss (for data built with ``binary_head=False``).
    """

    head_name = "cls_head"
    #: the encoder class (ERNIE's adds a task-type embedding)
    backbone_class: type = BertModel

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        cfg = {**(cfg or {}), **kwargs}
        self.add_binary_head = bool(cfg.pop("add_binary_head", True))
        self.bert = self.backbone_class(cfg={**cfg, "add_pooling_layer": True})
        cfg = self.bert.libai_cfg
        self.cls_head = BertPreTrainingHeads(
            self.bert.embeddings.vocab_embeddings,
            cfg["hidden_size"],
            init_method_normal(cfg["initializer_range"]),
            cfg["activation"],
            # LiBai's BERT head LayerNorm keeps its default eps
            1e-5 if self.bert.libai_layout else cfg["layernorm_eps"],
            self.add_binary_head,
        )
        self.loss_func = ParallelCrossEntropyLoss()

    @property
    def libai_cfg(self) -> dict:
        """The backbone's hyper-parameters plus ``add_binary_head``."""
        return {**self.bert.libai_cfg, "add_binary_head": self.add_binary_head}

    @property
    def backbone(self) -> BertModel:
        return self.bert

    def head_forward(self, hidden):
        return self.cls_head(hidden, self.bert.pooler(hidden))

    def losses(self, prediction_scores, seq_relationship_score, lm_labels, ns_labels):
        # training: the token mean over the whole data-parallel batch, as LiBai's global loss
        out = {"lm_loss": self.loss_func(prediction_scores, lm_labels, self.training)}
        if seq_relationship_score is None:
            return out
        if ns_labels is not None and not bool((ns_labels == IGNORE_INDEX).all()):
            out["sop_loss"] = F.cross_entropy(
                seq_relationship_score.float(), ns_labels, ignore_index=IGNORE_INDEX
            )
        return out

    @accepts_hf_keywords
    def forward(
        self,
        input_ids,
        attention_mask=None,
        tokentype_ids=None,
        ns_labels=None,
        lm_labels=None,
        loss_mask=None,
    ):
        hidden = self.bert(input_ids, attention_mask, tokentype_ids)["last_hidden_state"]
        scores, seq_score = self.head_forward(hidden)
        out = {}
        if lm_labels is not None:
            labels = masked_lm_labels(lm_labels, loss_mask)
            out.update(self.losses(scores, seq_score, labels, ns_labels))
        if lm_labels is None or not self.training:
            out["prediction_logits"] = self.cls_head.predictions.lm_logits.gather(scores)
            if seq_score is not None:
                out["seq_relationship_logits"] = seq_score
        return out

    def pipeline_target(self, batch) -> torch.Tensor:
        """``[batch, seq + 1]``: the masked-LM labels, then the next-sentence label."""
        labels = masked_lm_labels(batch["lm_labels"], batch.get("loss_mask"))
        ns = batch.get("ns_labels")
        ns = torch.full_like(labels[:, 0], IGNORE_INDEX) if ns is None else ns
        return torch.cat([labels, ns.reshape(-1, 1).to(labels.dtype)], dim=1)

    def pipeline_loss(self, output, target) -> torch.Tensor:
        scores, seq_score = output
        losses = self.losses(scores, seq_score, target[:, :-1], target[:, -1])
        return sum(losses.values())


class BertForClassification(BertPipelineMixin, nn.Module):
    """Pooled [CLS] -> dropout -> ``classifier`` (transformers' ``BertForSequenceClassification``).

    ``forward(input_ids, attention_mask, tokentype_ids, labels)`` returns ``{"logits"}``, and
    ``{"loss"}`` with labels (cross entropy; mean squared error when ``num_labels == 1``,
    transformers' regression). As LiBai's, it also takes a pretraining batch: ``ns_labels``
    are the labels when ``labels`` is not given, ``lm_labels`` / ``loss_mask`` are ignored. ``num_labels`` and ``classifier_dropout`` (``None`` = the
    hidden dropout) are head options next to the backbone's hyper-parameters.
    """

    head_name = "classifier"
    #: the encoder class (ERNIE's adds a task-type embedding)
    backbone_class: type = BertModel

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        cfg = self._pop_head_options(cfg, kwargs)
        self.bert = self.backbone_class(cfg={**cfg, "add_pooling_layer": True})
        bert_cfg = self.bert.libai_cfg
        p = self.classifier_dropout
        self.dropout = nn.Dropout(bert_cfg["hidden_dropout_prob"] if p is None else p)
        # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
        self.classifier = Linear(
            bert_cfg["hidden_size"],
            self.num_labels,
            True,
            "data",
            init_method_normal(bert_cfg["initializer_range"]),
            layer_idx=-1,
        )

    def _pop_head_options(self, cfg, kwargs) -> dict:
        """Set ``num_labels`` / ``classifier_dropout`` from the config; returns the rest."""
        cfg = {**(cfg or {}), **kwargs}
        self.num_labels = int(cfg.pop("num_labels", 2))
        self.classifier_dropout = cfg.pop("classifier_dropout", None)
        return cfg

    @property
    def libai_cfg(self) -> dict:
        """The backbone's hyper-parameters plus ``num_labels`` and ``classifier_dropout``."""
        return {
            **self.backbone.libai_cfg,
            "num_labels": self.num_labels,
            "classifier_dropout": self.classifier_dropout,
        }

    @property
    def backbone(self) -> BertModel:
        return self.bert

    def head_forward(self, hidden):
        pooled = self.bert.pooler(hidden)
        return self.classifier(self.dropout(pooled) if self.dropout.p > 0 else pooled)

    def loss(self, logits, labels):
        if self.num_labels == 1:
            return F.mse_loss(logits.float().squeeze(-1), labels.float())
        return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)

    @accepts_hf_keywords
    def forward(
        self,
        input_ids,
        attention_mask=None,
        tokentype_ids=None,
        labels=None,
        ns_labels=None,
        lm_labels=None,
        loss_mask=None,
    ):
        labels = ns_labels if labels is None else labels
        hidden = self.backbone(input_ids, attention_mask, tokentype_ids)["last_hidden_state"]
        logits = self.head_forward(hidden)
        if labels is None:
            return {"logits": logits}
        out = {"loss": self.loss(logits, labels)}
        if not self.training:
            out["logits"] = logits
        return out

    def pipeline_target(self, batch) -> torch.Tensor:
        return batch["labels"] if "labels" in batch else batch["ns_labels"]

    def pipeline_loss(self, logits, labels) -> torch.Tensor:
        return self.loss(logits, labels)
