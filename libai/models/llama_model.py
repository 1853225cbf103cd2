"""Llama 2 / Llama 3 / Qwen2: pre-RMSNorm blocks, SwiGLU MLP, grouped-query attention, RoPE.

One pair of classes serves the family (``model_type`` ``llama`` and ``qwen2`` of Hugging Face
checkpoints); they differ only in hyper-parameters: Qwen2 has biases on the q/k/v projections
(``qkv_bias=True``), Llama 3 scales RoPE (``rope_scaling={"rope_type": "llama3", ...}``),
small models tie the LM head to the word embedding (``tie_word_embeddings``).

Labels are *not* shifted (``labels[t]`` is the token at ``input_ids[t]``, -100 = ignored), as in
transformers and in the SFT dataset; the model shifts them inside, so the loss equals
``transformers``' ``LlamaForCausalLM(labels=...)`` loss (mean over the non-ignored targets).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.config import configurable
from libai.layers import (
    LMLogits,
    MoEConfig,
    ParallelCrossEntropyLoss,
    RMSLayerNorm,
    RotaryEmbedding,
    TransformerLayer,
    VocabEmbedding,
    collect_moe_losses,
    init_method_normal,
)
from libai.layers.chunked_loss import check_loss_chunk_size, chunked_lm_loss, lm_head_input
from libai.layers.kv_cache import (
    check_no_cache_under_sequence_parallel,
    layer_past,
    past_length,
)
from libai.layers.latent_attention import LATENT_KEYS
from libai.layers.rotary import rope_type
from libai.models.utils.hf_kwargs import accepts_hf_keywords

IGNORE_INDEX = -100
MODEL_TYPES = (
    "llama",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "deepseek_v3",
)


def shift_labels(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """``labels[:, 1:]`` padded with ``ignore_index``: position t is scored on token t + 1
    and the last position on nothing (transformers' shift, without copying the logits)."""
    return F.pad(labels[:, 1:], (0, 1), value=ignore_index)


_shift = shift_labels  # the forward's ``shift_labels`` argument shadows the name


def check_latent_attention(settings) -> dict:
    """``latent_attention`` as a plain dict; an unknown key raises naming the valid ones."""
    settings = {str(k): v for k, v in dict(settings).items()}
    unknown = sorted(set(settings) - set(LATENT_KEYS))
    if unknown:
        raise ValueError(f"unknown latent_attention key(s) {unknown}; valid: {list(LATENT_KEYS)}")
    return settings


def check_tensor_parallel(num_attention_heads: int, num_key_value_heads: int) -> None:
    """Raise before anything is built if tp does not divide the (key/value) heads."""
    tp = dist.get_tensor_parallel_size()
    for name, value in (
        ("num_attention_heads", num_attention_heads),
        ("num_key_value_heads", num_key_value_heads),
    ):
        if value % tp:
            raise ValueError(
                f"{name}={value} is not divisible by tensor_parallel_size={tp}; use a "
                f"tensor_parallel_size that divides {value} (grouped-query attention splits "
                "whole key/value heads over tensor-parallel ranks)."
            )


class LlamaModel(nn.Module):
    """The Llama / Qwen2 backbone: ``embed_tokens`` -> ``layers`` -> final RMSNorm ``norm``.

    ``forward`` returns ``{"last_hidden_state"}`` (plus ``"past_key_values"`` with
    ``use_cache=True``). As a pipeline stage, the parts of other stages are ``None``.
    Under ``train.dist.sequence_parallel`` the hidden states (also between pipeline stages
    and the returned ones) are this rank's share of the sequence ``[batch, seq / tp, hidden]``.

    Args:
        hidden_layers, vocab_size, hidden_size, intermediate_size, num_attention_heads:
            the shapes (LiBai's / transformers' names).
        num_key_value_heads: key/value heads of grouped-query attention (default: all).
        head_dim: per-head size (default ``hidden_size // num_attention_heads``).
        max_position_embeddings: the trained context (used by dynamic RoPE scaling).
        rope_theta, rope_scaling: RoPE base and scaling dict (``rope_type`` in
            ``"linear"``, ``"dynamic"``, ``"llama3"``), see :func:`libai.layers.rope_inv_freq`.
        attention_bias: biases on q, k, v and o (transformers' Llama ``attention_bias``).
        qkv_bias: biases on q, k, v only (Qwen2).
        mlp_bias: biases in the MLP (transformers' Llama ``mlp_bias``).
        tie_word_embeddings: read by :class:`LlamaForCausalLM` (and the Hugging Face export).
        model_type: ``"llama"``, ``"qwen2"``, ``"qwen3"``, ``"mixtral"``, ``"qwen2_moe"``,
            ``"qwen3_moe"`` or ``"olmoe"``: which Hugging Face family an export writes.
        loss_chunk_size: read by :class:`LlamaForCausalLM`: tokens per chunk of its training
            loss (:func:`~libai.layers.chunked_lm_loss`, the head + cross entropy without all
            the ``[tokens, vocab]`` logits at once); ``None`` = the plain loss. Not exported.
        moe: Mixture-of-Experts blocks (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): the keys of
            :class:`~libai.layers.MoEConfig` (``num_experts``, ``top_k``, ...); ``None``: dense.
        qk_norm: RMS norm of queries and keys: ``"head"`` (Qwen3's per-head ``q_norm`` /
            ``k_norm``) or ``"full"`` (OLMoE's, over all heads); ``None``: none.
        padding_idx: the embedding row that gets no gradient (transformers' ``pad_token_id``
            of these families: ``nn.Embedding(..., padding_idx)``).
        latent_attention: DeepSeek-V3's multi-head latent attention instead of grouped-query
            attention: ``dict(kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
            q_lora_rank=None, rope_interleave=True, softmax_scale=None)``
            (:class:`~libai.layers.latent_attention.LatentAttention`).
    """

    @configurable
    def __init__(
        self,
        hidden_layers: int,
        vocab_size: int,
        hidden_size: int,
        intermediate_size: int,
        num_attention_heads: int,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        max_position_embeddings: int = 2048,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        qkv_bias: bool = False,
        mlp_bias: bool = False,
        attention_dropout_prob: float = 0.0,
        tie_word_embeddings: bool = False,
        model_type: str = "llama",
        loss_chunk_size: int | None = None,
        moe: dict | None = None,
        qk_norm: str | None = None,
        padding_idx: int | None = None,
        latent_attention: dict | None = None,
    ):
        super().__init__()
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
        num_key_value_heads = num_key_value_heads or num_attention_heads
        check_tensor_parallel(num_attention_heads, num_key_value_heads)
        rope_type(rope_scaling)  # raises on an unsupported scaling type, before any build
        dist.check_model_num_layers(hidden_layers, f"hidden_layers={hidden_layers}")
        head_dim = head_dim or hidden_size // num_attention_heads
        if latent_attention is not None:  # MLA: the rotary part of each head only
            latent_attention = check_latent_attention(latent_attention)
            head_dim = int(latent_attention["qk_rope_head_dim"])
        init_method = init_method_normal(initializer_range)
        self.num_layers = hidden_layers
        self.moe = moe = MoEConfig.of(moe)
        self.sequence_parallel = sp = dist.is_sequence_parallel()
        #: the mesh this model is built on (a sequence-parallel forward's tp size)
        self._dist_util = util = dist.capture_mesh()
        self.embed_tokens = VocabEmbedding(
            vocab_size,
            hidden_size,
            init_method,
            layer_idx=0,
            sequence_parallel=sp,
            padding_idx=padding_idx,
        )

        def block(i):
            return TransformerLayer(
                hidden_size,
                intermediate_size,
                num_attention_heads,
                num_key_value_heads=num_key_value_heads,
                head_size=head_dim,
                attention_dropout_prob=attention_dropout_prob,
                layernorm_epsilon=rms_norm_eps,
                norm_type="rmsnorm",
                pre_norm=True,
                activation="silu",
                gated_mlp=True,  # SwiGLU: silu(gate(x)) * up(x)
                bias=attention_bias,
                qkv_bias=qkv_bias or attention_bias,
                mlp_bias=mlp_bias,
                init_method=init_method,
                attn_mask_type="causal",
                layer_idx=i,
                sequence_parallel=sp,
                moe=moe if moe is not None and moe.is_moe_layer(i) else None,
                qk_norm=qk_norm,
                latent_attention=latent_attention,
            )

        # A ModuleDict keyed by layer index: a pipeline stage drops the others, names stay.
        self.layers = nn.ModuleDict({str(i): block(i) for i in range(hidden_layers)})
        self.norm = RMSLayerNorm(hidden_size, eps=rms_norm_eps, layer_idx=-1, sequence_parallel=sp)
        self.loss_chunk_size = check_loss_chunk_size(loss_chunk_size)
        # no parameters, so no layer_idx: every stage keeps it
        self.rotary_emb = RotaryEmbedding(
            head_dim,
            rope_theta,
            scaling=rope_scaling,
            max_position_embeddings=max_position_embeddings,
        ).to(util.device)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
    ):
        """``(hidden_states, presents)``: token ids (hidden states on a later pipeline stage)
        through this stage's layers; the final norm is applied on the last stage.

        ``attention_mask`` is ``[batch, past + seq]`` with 1 for real tokens (left padding
        allowed); ``position_ids`` default to ``past .. past + seq - 1`` (pass them, e.g.
        ``attention_mask.cumsum(-1) - 1``, for left-padded batches). ``presents`` is the list
        of per-layer caches with ``use_cache=True``, else None.
        """
        check_no_cache_under_sequence_parallel(self.sequence_parallel, past_key_values, use_cache)
        hidden = input_ids if self.embed_tokens is None else self.embed_tokens(input_ids)
        if position_ids is None:
            seq, past = hidden.shape[1], past_length(past_key_values)
            if self.sequence_parallel:  # hidden holds this rank's share of the sequence
                seq *= self._dist_util.tensor_parallel_size
            position_ids = torch.arange(past, past + seq, device=hidden.device).unsqueeze(0)
        rotary = self.rotary_emb(position_ids, dtype=hidden.dtype)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        presents = [] if use_cache else None
        for i, layer in enumerate(self.layers.values()):
            past = layer_past(past_key_values, i, layer)
            hidden = layer(
                hidden,
                attention_mask=mask,
                past_key_value=past,
                use_cache=use_cache,
                rotary_pos_emb=rotary,
            )
            if use_cache:
                hidden, present = hidden
                presents.append(present)
        if self.norm is not None:
            hidden = self.norm(hidden)
        return hidden, presents

    @accepts_hf_keywords
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
    ) -> dict:
        """``{"last_hidden_state": [batch, seq, hidden]}`` (+ ``"past_key_values"``)."""
        hidden, presents = self.hidden_states(
            input_ids, attention_mask, position_ids, past_key_values, use_cache
        )
        out = {"last_hidden_state": hidden}
        if use_cache:
            out["past_key_values"] = presents
        return out


class LlamaForCausalLM(nn.Module):
    """:class:`LlamaModel` + LM head (tied to ``embed_tokens`` or its own vocab-split weight)
    with the causal-LM loss computed inside.

    ``model(input_ids, attention_mask=None, position_ids=None, labels=None,
    past_key_values=None, use_cache=False)`` returns ``{"lm_loss"}`` in training with labels;
    otherwise ``{"logits"}`` (full vocabulary, plus ``"lm_loss"`` with labels and
    ``"past_key_values"`` with ``use_cache=True``). Takes the same ``cfg`` / keyword
    hyper-parameters as :class:`LlamaModel`.

    Pipeline contract (:class:`libai.runtime.parallel.ModelRunner`): the first stage takes
    ``input_ids`` (and ``attention_mask`` when the batch has one, handed on to later stages),
    the last returns vocab-split logits, and the loss shifts the unshifted ``labels``.

    With ``loss_chunk_size`` set, the training loss is :func:`~libai.layers.chunked_lm_loss`
    (the same value and gradients without the ``[tokens, vocab]`` logits); under pipeline
    parallelism the last stage then returns its hidden states while autograd records (the
    schedule's training step) and ``pipeline_loss`` applies the head chunked. Evaluation and
    generation keep the logits.

    ``shift_labels`` (transformers' name) gives the targets already shifted (position t
    scored on its entry, no shift inside): context parallel shifts the whole sequence's
    labels before cutting it (:meth:`context_parallel_batch`).
    """

    #: runs with train.dist.sequence_parallel (checked by the ModelRunner)
    supports_sequence_parallel = True
    #: runs with train.dist.context_parallel_size > 1 (libai.runtime.context_parallel):
    #: the batch keys cut along the sequence, after :meth:`context_parallel_batch`
    supports_context_parallel = True
    context_parallel_keys = ("input_ids", "shift_labels")

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        self.model = LlamaModel(cfg=cfg, **kwargs)
        c, sp = self.model.libai_cfg, self.model.sequence_parallel
        if c["tie_word_embeddings"]:
            self.lm_head = LMLogits(self.model.embed_tokens, layer_idx=-1, sequence_parallel=sp)
        else:
            self.lm_head = LMLogits(
                None,
                vocab_size=c["vocab_size"],
                hidden_size=c["hidden_size"],
                init_method=init_method_normal(c["initializer_range"]),
                layer_idx=-1,
                sequence_parallel=sp,
            )
        self.loss_func = ParallelCrossEntropyLoss(ignore_index=IGNORE_INDEX)

    @accepts_hf_keywords
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        shift_labels: torch.Tensor | None = None,
    ) -> dict:
        hidden, presents = self.model.hidden_states(
            input_ids, attention_mask, position_ids, past_key_values, use_cache
        )
        targets = shift_labels
        if targets is None and labels is not None:
            targets = _shift(labels)
        chunk = self.model.loss_chunk_size
        if targets is not None and self.training and not use_cache and chunk:  # the loss only
            loss = chunked_lm_loss(hidden, self.lm_head, targets, chunk, IGNORE_INDEX)
            return {"lm_loss": loss, **collect_moe_losses(self)}
        logits = self.lm_head(hidden)  # [S(0), S(-1)]: this rank's vocab shard
        out = {}
        if targets is not None:
            out["lm_loss"] = self.loss_func(logits, targets)
            if self.training and not use_cache:
                return {**out, **collect_moe_losses(self)}
        out["logits"] = self.lm_head.gather(logits)
        if use_cache:
            out["past_key_values"] = presents
        return out

    def context_parallel_batch(self, batch) -> dict:
        """The batch with ``labels`` shifted over the whole sequence (as ``shift_labels``),
        before context parallel cuts it: a share's last token is scored on the next share's
        first."""
        out = dict(batch)
        labels = out.pop("labels", None)
        if labels is not None:
            out["shift_labels"] = _shift(labels)
        return out

    # ---- pipeline contract ------------------------------------------------------------------
    def pipeline_inputs(self, batch) -> tuple:
        return (batch["input_ids"],)

    def pipeline_stage_kwargs(self, batch) -> dict:
        """The padding mask and, for a context-parallel share, the global ``position_ids``
        (if any: ``None`` is dropped), which every stage reads from its own batch (each
        stage's rotary embedding needs the positions)."""
        return {
            "attention_mask": batch.get("attention_mask"),
            "position_ids": batch.get("position_ids"),
        }

    def pipeline_target(self, batch) -> torch.Tensor:
        """The shifted labels: ``shift_labels`` of a context-parallel share (shifted over the
        whole sequence before the cut), else ``labels`` shifted here."""
        if batch.get("shift_labels") is not None:
            return batch["shift_labels"]
        return shift_labels(batch["labels"])

    def pipeline_forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ):
        """One stage: ids or hidden states in; hidden states to the next stage, or
        vocab-split logits on the last. With ``loss_chunk_size`` and autograd
        recording (a training step; eval and predict run under no_grad), the last stage
        returns its hidden states as the head reads them (:func:`~libai.layers.lm_head_input`)
        and ``pipeline_loss`` applies the head."""
        hidden, _ = self.model.hidden_states(x, attention_mask, position_ids)
        if self.lm_head is not None:
            if self.model.loss_chunk_size and torch.is_grad_enabled():
                return lm_head_input(hidden, self.lm_head)
            return self.lm_head(hidden)
        return hidden

    def pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The last stage's loss against ``labels``, the shifted targets of
        :meth:`pipeline_target`: of vocab-split logits, or (chunked) of the hidden states
        ``pipeline_forward`` returned in a training step, told apart by their autograd
        history (logits predicted under no_grad, e.g. for an evaluator, have none)."""
        chunk = self.model.loss_chunk_size
        if chunk and logits.requires_grad:
            return chunked_lm_loss(logits, self.lm_head, labels, chunk, IGNORE_INDEX, prepared=True)
        return self.loss_func(logits, labels)

    # ---- generation (libai.inference.generation) ---------------------------------------------
    def decode_stage(self, x, attention_mask=None, position_ids=None, cache=None, logits_at=None):
        """One pipeline stage of a decoding step with the KV cache ``cache``: token ids or
        hidden states in; hidden states out, or on the last stage the full-vocab logits of
        the last position ``[batch, vocab]`` (with ``logits_at``, a LongTensor of positions:
        the logits at those positions ``[batch, len(logits_at), vocab]``)."""
        hidden, _ = self.model.hidden_states(x, attention_mask, position_ids, cache)
        if self.lm_head is None:
            return hidden
        if logits_at is not None:
            return self.lm_head.gather(self.lm_head(hidden[:, logits_at]))
        return self.lm_head.gather(self.lm_head(hidden[:, -1:]))[:, -1]
