"""GPT-2: learned positions, pre-LN blocks, GELU MLP, head tied to the word embedding.

Hyper-parameters keep LiBai's names. Labels are expected already shifted (``labels[t]`` is the
token after ``input_ids[t]``), as LiBai's GPT dataset produces them.
"""

from __future__ import annotations

import torch
from torch import nn

from libai import dist
from libai.config import configurable
from libai.layers import (
    Embedding,
    LayerNorm,
    LMLogits,
    MoEConfig,
    ParallelCrossEntropyLoss,
    TransformerLayer,
    VocabEmbedding,
    collect_moe_losses,
    init_method_normal,
    scaled_init_method_normal,
)
from libai.layers.chunked_loss import check_loss_chunk_size, chunked_lm_loss, lm_head_input
from libai.layers.kv_cache import (
    check_no_cache_under_sequence_parallel,
    layer_past,
    past_length,
)
from libai.models.libai_options import LIBAI_NO_EFFECT_MODEL_KEYS
from libai.models.utils.hf_kwargs import accepts_hf_keywords


class GPTEmbedding(nn.Module):
    """Token (vocab-parallel) + learned position embeddings, then dropout.

    With ``sequence_parallel`` the output is this rank's share of the sequence: the token
    lookups are reduce-scattered and only this rank's positions are looked up.
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        max_seq_length,
        init_method,
        dropout_prob,
        sequence_parallel=False,
    ):
        super().__init__()
        self.layer_idx = 0
        self.max_seq_length = max_seq_length
        sp = dict(layer_idx=0, sequence_parallel=sequence_parallel)
        self.token_embeddings = VocabEmbedding(vocab_size, hidden_size, init_method, **sp)
        self.position_embeddings = Embedding(max_seq_length, hidden_size, init_method, **sp)
        self.dropout = nn.Dropout(dropout_prob)

    def forward(self, input_ids, position_ids=None, past_length: int = 0):
        seq_len = input_ids.shape[1]
        if past_length + seq_len > self.max_seq_length:
            raise ValueError(
                f"sequence of {past_length + seq_len} positions exceeds max_seq_length="
                f"{self.max_seq_length}"
            )
        if position_ids is None:
            position_ids = torch.arange(
                past_length, past_length + seq_len, device=input_ids.device
            ).unsqueeze(0)
        # [S(0), B] (sequence parallel: [S(0), S(1)], this rank's positions)
        hidden = self.token_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.dropout(hidden) if self.dropout.p > 0 else hidden  # skip the identity call


class Transformer(nn.Module):
    """The stack of blocks plus the final LayerNorm (``layernorm_f``)."""

    def __init__(
        self, num_layers: int, layer_factory, hidden_size: int, eps: float, sequence_parallel=False
    ):
        super().__init__()
        # A ModuleDict keyed by layer index: a pipeline stage drops the others, names stay.
        self.layers = nn.ModuleDict({str(i): layer_factory(i) for i in range(num_layers)})
        self.layernorm_f = LayerNorm(
            hidden_size, eps=eps, layer_idx=-1, sequence_parallel=sequence_parallel
        )


class GPTModel(nn.Module):
    """GPT-2 backbone returning vocab-split logits ``[S(0), S(-1)]``.

    As a pipeline stage, parts of other stages are ``None`` and ``forward`` takes and returns
    hidden states instead of token ids / logits.

    Under ``train.dist.sequence_parallel`` the hidden states between the embedding and the
    head (and between pipeline stages) are this rank's share of the sequence.

    ``moe`` (the keys of :class:`~libai.layers.MoEConfig`, e.g. ``dict(num_experts=8,
    top_k=2)``) makes the feed-forward of the blocks it selects a Mixture of Experts (the
    experts are split over ``train.dist.expert_parallel_size`` data-parallel ranks); the
    weighted balancing losses join the training output as ``moe_*_loss`` terms.
    """

    #: LiBai's model keys that change nothing here (accepted, named in one log line)
    libai_no_effect_keys = LIBAI_NO_EFFECT_MODEL_KEYS

    @configurable
    def __init__(
        self,
        hidden_layers: int,
        vocab_size: int,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        max_seq_length: int = 1024,
        embedding_dropout_prob: float = 0.0,
        attention_dropout_prob: float = 0.0,
        output_dropout_prob: float = 0.0,
        layernorm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        activation: str = "gelu_tanh",
        loss_chunk_size: int | None = None,
        use_scaled_init_for_output_weights: bool = True,
        apply_residual_post_layernorm: bool = False,
        moe: dict | None = None,
    ):
        super().__init__()
        dist.check_model_num_layers(hidden_layers, f"hidden_layers={hidden_layers}")
        init_method = init_method_normal(initializer_range)
        output_init = init_method
        if use_scaled_init_for_output_weights:  # std / sqrt(2 x layers), as GPT-2 / LiBai
            output_init = scaled_init_method_normal(initializer_range, hidden_layers)
        self.num_layers = hidden_layers
        self.moe = moe = MoEConfig.of(moe)
        self.sequence_parallel = sp = dist.is_sequence_parallel()
        self.embeddings = GPTEmbedding(
            vocab_size, hidden_size, max_seq_length, init_method, embedding_dropout_prob, sp
        )

        def block(i):
            return TransformerLayer(
                hidden_size,
                ffn_hidden_size,
                num_attention_heads,
                attention_dropout_prob=attention_dropout_prob,
                output_dropout_prob=output_dropout_prob,
                layernorm_epsilon=layernorm_epsilon,
                activation=activation,
                init_method=init_method,
                output_layer_init_method=output_init,
                attn_mask_type="causal",
                layer_idx=i,
                sequence_parallel=sp,
                apply_residual_post_layernorm=apply_residual_post_layernorm,
                moe=moe if moe is not None and moe.is_moe_layer(i) else None,
            )

        self.transformer = Transformer(hidden_layers, block, hidden_size, layernorm_epsilon, sp)
        self.lm_head = LMLogits(
            self.embeddings.token_embeddings, layer_idx=-1, sequence_parallel=sp
        )
        #: tokens per chunk of the training loss (:func:`~libai.layers.chunked_lm_loss`):
        #: head + cross entropy without all the logits at once; None = the plain loss
        self.loss_chunk_size = check_loss_chunk_size(loss_chunk_size)

    @accepts_hf_keywords
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        logits_to_keep: int | torch.Tensor = 0,
        return_hidden: bool = False,
    ):
        """Args:
        input_ids: ``[batch, seq]`` token ids (hidden states on a later pipeline stage).
        attention_mask: ``[batch, kv_len]`` with 1 for real tokens (left padding allowed).
        past_key_values: a :class:`~libai.layers.KVCache` (extended in place), or the legacy
            per-layer pairs of a previous call with ``use_cache=True``.
        logits_to_keep: compute the head for the last this many positions only (0 = all),
            or, a LongTensor, for those positions.
        return_hidden: stop before the head: the last stage returns the final hidden states
            (for a chunked loss; this rank's sequence shard under sequence parallel).

        Returns the vocab-split logits (hidden states on a non-last stage), and with
        ``use_cache=True`` a tuple ``(logits, presents)``.
        """
        check_no_cache_under_sequence_parallel(
            self.sequence_parallel,
            past_key_values,
            use_cache or isinstance(logits_to_keep, torch.Tensor) or bool(logits_to_keep),
        )
        hidden = input_ids
        if self.embeddings is not None:
            hidden = self.embeddings(input_ids, position_ids, past_length(past_key_values))
        mask = None
        if attention_mask is not None:
            mask = attention_mask.bool()[:, None, None, :]
        presents = []
        for i, layer in enumerate(self.transformer.layers.values()):
            past = layer_past(past_key_values, i, layer)
            hidden = layer(hidden, attention_mask=mask, past_key_value=past, use_cache=use_cache)
            if use_cache:
                hidden, present = hidden
                presents.append(present)
        if self.lm_head is not None and isinstance(logits_to_keep, torch.Tensor):
            hidden = hidden[:, logits_to_keep]  # the positions asked for
        elif self.lm_head is not None and logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        if self.transformer.layernorm_f is not None:
            hidden = self.transformer.layernorm_f(hidden)
        if self.lm_head is not None and not return_hidden:
            hidden = self.lm_head(hidden)
        return (hidden, presents) if use_cache else hidden


class GPTForPreTraining(nn.Module):
    """GPT-2 with the language-modelling loss computed inside the model.

    ``model(input_ids, labels)`` returns ``{"lm_loss": loss}`` (plus ``"logits"`` in eval
    mode); without labels ``{"logits": full-vocab logits}``.

    With ``loss_chunk_size`` set, the training loss is :func:`~libai.layers.chunked_lm_loss`
    (the same value and gradients without the ``[tokens, vocab]`` logits); under pipeline
    parallelism the last stage then returns its hidden states while autograd records (the
    schedule's training step) and ``pipeline_loss`` applies the head chunked. Evaluation and
    generation keep the logits.
    """

    #: pipeline contract (libai.runtime.parallel): batch key fed to the first stage, key of
    #: the target handed to the loss on the last stage
    pipeline_input_key = "input_ids"
    pipeline_target_key = "labels"
    #: runs with train.dist.sequence_parallel (checked by the ModelRunner)
    supports_sequence_parallel = True
    #: runs with train.dist.context_parallel_size > 1 (libai.runtime.context_parallel): the
    #: batch keys cut along the sequence (labels are already shifted in GPT's batches)
    supports_context_parallel = True
    context_parallel_keys = ("input_ids", "labels")

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        self.GPT_model = GPTModel(cfg=cfg, **kwargs)
        self.loss_func = ParallelCrossEntropyLoss()

    @accepts_hf_keywords
    def forward(self, input_ids, labels=None, attention_mask=None, position_ids=None):
        chunk = self.GPT_model.loss_chunk_size
        if labels is not None and self.training and chunk:  # training returns the loss only
            hidden = self.GPT_model(
                input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                return_hidden=True,
            )
            lm_head, ignore_index = self.GPT_model.lm_head, self.loss_func.ignore_index
            loss = chunked_lm_loss(hidden, lm_head, labels, chunk, ignore_index)
            return {"lm_loss": loss, **collect_moe_losses(self)}
        logits = self.GPT_model(input_ids, attention_mask=attention_mask, position_ids=position_ids)
        if labels is None:
            return {"logits": self.GPT_model.lm_head.gather(logits)}
        out = {"lm_loss": self.loss_func(logits, labels)}
        if not self.training:
            out["logits"] = self.GPT_model.lm_head.gather(logits)
            return out
        return {**out, **collect_moe_losses(self)}

    def pipeline_stage_kwargs(self, batch) -> dict:
        """The global ``position_ids`` of a context-parallel share (``None``, dropped,
        otherwise): the first stage's position embeddings read them."""
        return {"position_ids": batch.get("position_ids")}

    def pipeline_forward(
        self, x: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One pipeline stage: token ids or hidden states in, hidden states or logits out.
        With ``loss_chunk_size`` and autograd recording (a training step; eval and predict
        run under no_grad), the last stage returns its hidden states as the head reads them
        (:func:`~libai.layers.lm_head_input`) and ``pipeline_loss`` applies the head."""
        if self.GPT_model.loss_chunk_size and torch.is_grad_enabled():
            if self.GPT_model.lm_head is not None:
                hidden = self.GPT_model(x, position_ids=position_ids, return_hidden=True)
                return lm_head_input(hidden, self.GPT_model.lm_head)
        return self.GPT_model(x, position_ids=position_ids)

    def pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The last stage's loss: of vocab-split logits, or (chunked) of the hidden states
        ``pipeline_forward`` returned in a training step, told apart by their autograd
        history (logits predicted under no_grad, e.g. for an evaluator, have none)."""
        chunk = self.GPT_model.loss_chunk_size
        if chunk and logits.requires_grad:
            lm_head, ignore_index = self.GPT_model.lm_head, self.loss_func.ignore_index
            return chunked_lm_loss(logits, lm_head, labels, chunk, ignore_index, prepared=True)
        return self.loss_func(logits, labels)

    # ---- generation (libai.inference.generation) ---------------------------------------------
    def decode_stage(self, x, attention_mask=None, position_ids=None, cache=None, logits_at=None):
        """One pipeline stage of a decoding step with the KV cache ``cache``: token ids or
        hidden states in; hidden states out, or on the last stage the full-vocab logits of
        the last position ``[batch, vocab]`` (with ``logits_at``, a LongTensor of positions:
        the logits at those positions ``[batch, len(logits_at), vocab]``)."""
        keep = 1 if logits_at is None else logits_at
        out = self.GPT_model(x, attention_mask, position_ids, cache, logits_to_keep=keep)
        if self.GPT_model.lm_head is None:
            return out
        out = self.GPT_model.lm_head.gather(out)
        return out if logits_at is not None else out[:, -1]
