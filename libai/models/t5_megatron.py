"""LiBai's (Megatron-style) T5: the model LiBai's ``configs/common/models/t5.py`` builds.

Not Hugging Face's T5 (:mod:`libai.models.t5_model`): learned absolute position embeddings
shared by encoder and decoder, pre-LayerNorm blocks with biases, a GeLU (erf) MLP, scaled
init of the output projections (``std / sqrt(2 * hidden_layers)``), a final LayerNorm per
stack, and an LM head tied to the word embedding with a bias of its own. The masks are
LiBai's "extended" ones: ``encoder_attn_mask`` ``[batch, src, src]``,
``decoder_attn_mask`` ``[batch, tgt, tgt]`` (causal x padding) and
``encoder_decoder_attn_mask`` ``[batch, tgt, src]``, 1 = attend (a ``[batch, kv_len]``
padding mask is also accepted). The decoder's self-attention is causal whatever mask it is
given; LiBai's dataset mask is causal already, so the numbers are the same.

``T5Model(cfg=...)`` / ``T5ForPreTraining(cfg=...)`` build these classes when ``cfg``
carries LiBai's keys (:func:`is_libai_t5_config`). Layers are numbered encoder
``0 .. E-1`` and decoder ``E .. 2E-1`` (``pipeline_num_layers = 2 * hidden_layers``), as in
LiBai, and any pipeline split works: stages hand the next one ``(encoder hidden, decoder
hidden)`` and read LiBai's three masks from their own batch.
"""

from __future__ import annotations

import torch
from torch import nn

from libai import dist
from libai.config import configurable
from libai.layers import (
    LayerNorm,
    LMLogits,
    ParallelCrossEntropyLoss,
    TransformerLayer,
    init_method_normal,
    scaled_init_method_normal,
)
from libai.models.gpt_model import GPTEmbedding
from libai.models.libai_options import LIBAI_NO_EFFECT_MODEL_KEYS

#: keys of LiBai's T5 config that Hugging Face's T5 (libai.models.T5Model) does not have
LIBAI_T5_KEYS = ("intermediate_size", "max_position_embeddings", "hidden_dropout_prob")


def is_libai_t5_config(cfg, kwargs) -> bool:
    """Whether ``T5Model`` / ``T5ForPreTraining`` arguments are LiBai's (Megatron-style)."""
    keys = set(kwargs) | (set(cfg.keys()) if cfg is not None else set())
    return any(key in keys for key in LIBAI_T5_KEYS)


def extended_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """LiBai's ``ExtendedMask``: ``[batch, q, kv]`` -> ``[batch, 1, q, kv]`` bool (a
    ``[batch, kv]`` padding mask -> ``[batch, 1, 1, kv]``); True = attend."""
    if mask is None:
        return None
    if mask.dim() == 3:
        return mask.bool()[:, None]
    if mask.dim() == 2:
        return mask.bool()[:, None, None, :]
    raise ValueError(
        f"a T5 attention mask must be [batch, q_len, kv_len] or [batch, kv_len], got shape "
        f"{tuple(mask.shape)}"
    )


class MegatronT5Model(nn.Module):
    """LiBai's T5 encoder-decoder returning vocab-split logits ``[S(0), S(-1)]``.

    Args keep LiBai's names (``intermediate_size``, ``hidden_dropout_prob``,
    ``attention_probs_dropout_prob``, ``layernorm_eps``, ...). LiBai's fusion flags,
    ``apply_query_key_layer_scaling`` and ``amp_enabled`` are accepted and logged as having
    no effect (:data:`~libai.models.libai_options.LIBAI_NO_EFFECT_MODEL_KEYS`).
    ``apply_residual_post_layernorm`` applies to the encoder blocks, as in LiBai.
    """

    libai_no_effect_keys = LIBAI_NO_EFFECT_MODEL_KEYS

    @configurable
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        hidden_layers: int,
        num_attention_heads: int,
        intermediate_size: int,
        embedding_dropout_prob: float = 0.0,
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        max_position_embeddings: int = 512,
        initializer_range: float = 0.02,
        layernorm_eps: float = 1e-12,
        apply_residual_post_layernorm: bool = False,
    ):
        super().__init__()
        total = 2 * hidden_layers
        dist.check_model_num_layers(
            total, f"{hidden_layers} encoder + {hidden_layers} decoder layers"
        )
        self.hidden_layers = hidden_layers
        init_method = init_method_normal(initializer_range)
        output_init = scaled_init_method_normal(initializer_range, hidden_layers)
        # token + learned position embeddings, shared by encoder and decoder (LiBai's
        # T5Embedding is GPT's embedding block)
        self.embedding = GPTEmbedding(
            vocab_size,
            hidden_size,
            max_position_embeddings,
            init_method,
            embedding_dropout_prob,
        )

        def stack(first: int, is_decoder: bool) -> nn.Module:
            def block(i: int) -> TransformerLayer:
                return TransformerLayer(
                    hidden_size,
                    intermediate_size,
                    num_attention_heads,
                    is_decoder=is_decoder,
                    attention_dropout_prob=attention_probs_dropout_prob,
                    output_dropout_prob=hidden_dropout_prob,
                    layernorm_epsilon=layernorm_eps,
                    activation="gelu",
                    init_method=init_method,
                    output_layer_init_method=output_init,
                    attn_mask_type="causal" if is_decoder else "padding",
                    layer_idx=i,
                    apply_residual_post_layernorm=apply_residual_post_layernorm and not is_decoder,
                )

            module = nn.Module()
            # keyed by the index inside the stack: a pipeline stage drops the others, names stay
            module.layers = nn.ModuleDict({str(i): block(first + i) for i in range(hidden_layers)})
            module.final_layernorm = LayerNorm(
                hidden_size, eps=layernorm_eps, layer_idx=first + hidden_layers - 1
            )
            return module

        self.encoder = stack(0, is_decoder=False)
        self.decoder = stack(hidden_layers, is_decoder=True)
        self.lm_head = LMLogits(self.embedding.token_embeddings, bias=True, layer_idx=-1)

    def encode(self, encoder_input_ids, encoder_attn_mask=None) -> torch.Tensor:
        """The encoder output ``[batch, src_len, hidden]`` (after its final LayerNorm)."""
        return self.run_encoder(self.embedding(encoder_input_ids), encoder_attn_mask)

    def run_encoder(self, hidden, encoder_attn_mask=None) -> torch.Tensor:
        """This stage's encoder blocks (and the final LayerNorm, when it is here)."""
        mask = extended_mask(encoder_attn_mask)
        for layer in self.encoder.layers.values():
            hidden = layer(hidden, attention_mask=mask)
        norm = self.encoder.final_layernorm
        return hidden if norm is None else norm(hidden)

    def run_decoder(self, hidden, encoder_states, decoder_attn_mask, cross_mask) -> torch.Tensor:
        """This stage's decoder blocks (and the final LayerNorm, when it is here)."""
        self_mask, cross_mask = extended_mask(decoder_attn_mask), extended_mask(cross_mask)
        for layer in self.decoder.layers.values():
            hidden = layer(
                hidden,
                attention_mask=self_mask,
                encoder_states=encoder_states,
                encoder_attention_mask=cross_mask,
            )
        norm = self.decoder.final_layernorm
        return hidden if norm is None else norm(hidden)

    def forward(
        self,
        encoder_input_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        encoder_attn_mask: torch.Tensor | None = None,
        decoder_attn_mask: torch.Tensor | None = None,
        encoder_decoder_attn_mask: torch.Tensor | None = None,
        encoder_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Vocab-split logits ``[batch, tgt_len, vocab / tp]`` of the decoder positions.

        ``encoder_states``: a precomputed :meth:`encode` output, used instead of encoding.
        """
        if encoder_states is None:
            encoder_states = self.encode(encoder_input_ids, encoder_attn_mask)
        hidden = self.run_decoder(
            self.embedding(decoder_input_ids),
            encoder_states,
            decoder_attn_mask,
            encoder_decoder_attn_mask,
        )
        # [S(0), B] x [S(0), B]^T + [S(0)] -> [S(0), S(-1)]  (vocab-split, tied + bias)
        return self.lm_head(hidden)

    def pipeline_stage(self, *xs, encoder_mask=None, decoder_mask=None, cross_mask=None):
        """This pipeline stage's share: token ids ``(encoder, decoder)`` on the first stage,
        else ``(encoder hidden, decoder hidden)`` from the previous one. Encoder layers come
        before decoder layers, so a stage with decoder layers has the finished encoder
        output. Returns the pair for the next stage, or on the last one the logits."""
        enc, dec = xs
        if self.embedding is not None:
            enc, dec = self.embedding(enc), self.embedding(dec)
        if len(self.encoder.layers) or self.encoder.final_layernorm is not None:
            enc = self.run_encoder(enc, encoder_mask)
        if len(self.decoder.layers) or self.decoder.final_layernorm is not None:
            dec = self.run_decoder(dec, enc, decoder_mask, cross_mask)
        return (enc, dec) if self.lm_head is None else self.lm_head(dec)


class MegatronT5ForPreTraining(nn.Module):
    """LiBai's ``T5ForPreTraining``: the model plus LiBai's ``T5Loss``.

    With ``lm_labels``: ``{"masked_lm_loss"}``, the cross entropy averaged over the decoder
    positions whose ``loss_mask`` is 1 (LiBai's ``sum(loss * mask) / sum(mask)``; labels
    at masked-out positions, e.g. LiBai's -1 padding, are never read); in training the
    average is over the loss tokens of the whole data-parallel batch, as LiBai's global
    tensors give it. Without: ``{"prediction_scores"}``, the full-vocab logits.
    """

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        self.t5_model = MegatronT5Model(cfg=cfg, **kwargs)
        self.loss_func = ParallelCrossEntropyLoss()

    def forward(
        self,
        encoder_input_ids,
        decoder_input_ids,
        encoder_attn_mask=None,
        decoder_attn_mask=None,
        encoder_decoder_attn_mask=None,
        lm_labels=None,
        loss_mask=None,
    ) -> dict:
        logits = self.t5_model(
            encoder_input_ids,
            decoder_input_ids,
            encoder_attn_mask,
            decoder_attn_mask,
            encoder_decoder_attn_mask,
        )
        if lm_labels is None:
            return {"prediction_scores": self.t5_model.lm_head.gather(logits)}
        if loss_mask is not None:
            lm_labels = lm_labels.masked_fill(loss_mask == 0, self.loss_func.ignore_index)
        if not self.training:  # this batch's mean: the evaluators weight it by its tokens
            return {"masked_lm_loss": self.loss_func(logits, lm_labels)}
        return {"masked_lm_loss": self._global_token_mean(logits, lm_labels)}

    def _global_token_mean(self, logits, labels) -> torch.Tensor:
        """LiBai's T5Loss on its global batch: the sum of this rank's token losses over the
        loss tokens of *all* data-parallel ranks, times dp (the gradient sync averages over
        dp), so training equals one process on the global batch although ranks hold
        different numbers of loss tokens."""
        total = self.loss_func.token_losses(logits, labels).sum()
        count = (labels != self.loss_func.ignore_index).sum().to(torch.float32)
        group = self.loss_func._dist_util.dp_group
        if group is not None:
            count = count.clone()
            # [P] -> all-reduce over dp -> [B]: the global batch's loss tokens
            torch.distributed.all_reduce(count, group=group)
            count = count / torch.distributed.get_world_size(group)
        return total / count.clamp(min=1)

    # ---- pipeline contract (libai.runtime.parallel) --------------------------------------------
    def pipeline_inputs(self, batch) -> tuple:
        return batch["encoder_input_ids"], batch["decoder_input_ids"]

    def pipeline_stage_kwargs(self, batch) -> dict:
        """LiBai's three masks, which every stage reads from its own batch."""
        return {
            "encoder_mask": batch.get("encoder_attn_mask"),
            "decoder_mask": batch.get("decoder_attn_mask"),
            "cross_mask": batch.get("encoder_decoder_attn_mask"),
        }

    def pipeline_target(self, batch) -> torch.Tensor:
        labels, loss_mask = batch["lm_labels"], batch.get("loss_mask")
        if loss_mask is None:
            return labels
        return labels.masked_fill(loss_mask == 0, self.loss_func.ignore_index)

    def pipeline_forward(self, *xs, encoder_mask=None, decoder_mask=None, cross_mask=None):
        return self.t5_model.pipeline_stage(
            *xs, encoder_mask=encoder_mask, decoder_mask=decoder_mask, cross_mask=cross_mask
        )

    def pipeline_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The last stage's loss, as :meth:`forward`'s (the global-token mean in training)."""
        if self.training and torch.is_grad_enabled():
            return self._global_token_mean(logits, target)
        return self.loss_func(logits, target)
