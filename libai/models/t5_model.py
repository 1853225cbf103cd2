"""T5 and mT5: encoder-decoder of pre-RMSNorm blocks with bucketed relative position biases.

Both are built from :class:`libai.layers.TransformerLayer` (no biases, unscaled attention —
T5 folds the 1/sqrt(d) into the query's initialization), with a vocab-parallel embedding
shared by encoder and decoder. v1.0 (``feed_forward_proj="relu"``) ties the LM head to the
embedding and scales the decoder output by ``hidden_size ** -0.5``; v1.1 and mT5
(``"gated-gelu"``) have an untied ``lm_head`` and no rescaling.

**Pipeline parallelism.** Layers are numbered encoder ``0 .. E-1``, then decoder
``E .. E+D-1`` (``pipeline_num_layers = E + D``), and every split is supported. The first
stage owns the embedding and embeds both the encoder and the decoder tokens; stages hand
the next one a tuple:

- while the encoder runs: ``(encoder_hidden, decoder_embeddings, encoder_position_bias)``;
- once it has finished (after the stage owning layer ``E-1`` and the final encoder norm):
  ``(encoder_output, decoder_hidden[, decoder_position_bias])`` (the bias once layer ``E``
  has computed it).

The padding masks are not handed on: every stage reads ``encoder_attn_mask`` and
``decoder_attn_mask`` from its own batch (the model's stage keyword inputs).

So the encoder output travels through every decoder stage, and a stage holding the last
encoder layer and decoder layers runs both in turn. Position biases are computed by the
first layer of each stack (as in transformers) and passed on with their gradients.
"""

from __future__ import annotations

import torch
from torch import nn

from libai import dist
from libai.config import configurable
from libai.config.configurable import init_signature
from libai.layers import (
    LMLogits,
    ParallelCrossEntropyLoss,
    RMSLayerNorm,
    TransformerLayer,
    VocabEmbedding,
    init_method_normal,
    local_value,
)
from libai.layers.kv_cache import is_static, layer_past, past_length
from libai.layers.relative_position import RelativePositionBias
from libai.models.t5_megatron import (
    MegatronT5ForPreTraining,
    MegatronT5Model,
    is_libai_t5_config,
)
from libai.models.utils.hf_kwargs import accepts_hf_keywords

#: activation names of transformers' ``dense_act_fn`` -> libai's
ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
}


def parse_feed_forward_proj(feed_forward_proj: str) -> tuple[str, bool]:
    """``"relu"`` -> ``("relu", False)``, ``"gated-gelu"`` -> ``("gelu_tanh", True)``: the
    libai activation and whether the MLP is gated (transformers' reading of the string)."""
    gated = feed_forward_proj.startswith("gated-")
    name = feed_forward_proj.removeprefix("gated-")
    if feed_forward_proj == "gated-gelu":  # transformers' backward-compatible special case
        name = "gelu_new"
    if name not in ACTIVATIONS:
        raise ValueError(
            f"feed_forward_proj={feed_forward_proj!r} is not supported; use one of "
            f"{sorted(ACTIVATIONS)}, optionally prefixed by 'gated-'"
        )
    return ACTIVATIONS[name], gated


def _padding_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``[batch, kv_len]`` 1/0 -> ``[batch, 1, 1, kv_len]`` bool (True = attend)."""
    return None if mask is None else mask.bool()[:, None, None, :]


class T5Stack(nn.Module):
    """One side of T5: blocks ``first_layer_idx ..``, the relative position bias of the
    first block (shared by all blocks) and the final RMSNorm (owned by the last block)."""

    def __init__(self, num_layers, first_layer_idx, layer_factory, bias_factory, hidden_size, eps):
        super().__init__()
        last = first_layer_idx + num_layers - 1
        self.relative_attention_bias = bias_factory(first_layer_idx)
        # keyed by the index inside the stack (a pipeline stage drops the others)
        self.layers = nn.ModuleDict(
            {str(i): layer_factory(first_layer_idx + i) for i in range(num_layers)}
        )
        self.final_layernorm = RMSLayerNorm(hidden_size, eps=eps, layer_idx=last)

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        position_bias=None,
        encoder_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        use_cache: bool = False,
    ):
        """Run this stage's blocks. Returns ``(hidden, position_bias, presents)``; ``hidden``
        is normalized if the final norm is here. ``position_bias`` is computed when the first
        block is here (else it must be given)."""
        if self.relative_attention_bias is not None:
            q_len, past = hidden_states.shape[1], past_length(past_key_values)
            if is_static(past_key_values):  # the written slots against every slot
                position_bias = self.relative_attention_bias(
                    q_len,
                    past_key_values.max_length,
                    query_positions=past_key_values.cache_position,
                )
            else:
                position_bias = self.relative_attention_bias(q_len, past + q_len, past)
        presents = []
        for key, layer in self.layers.items():
            out = layer(
                hidden_states,
                attention_mask=attention_mask,
                encoder_states=encoder_states,
                encoder_attention_mask=encoder_attention_mask,
                past_key_value=layer_past(past_key_values, int(key), layer),
                use_cache=use_cache,
                position_bias=position_bias,
            )
            if use_cache:
                out, present = out
                presents.append(present)
            hidden_states = out
        if self.final_layernorm is not None:
            hidden_states = self.final_layernorm(hidden_states)
        return hidden_states, position_bias, presents


class T5Model(nn.Module):
    """T5 / mT5 encoder-decoder (transformers' ``T5Model``).

    ``forward`` returns ``{"last_hidden_state": decoder output, "encoder_last_hidden_state"}``
    (plus ``"past_key_values"`` with ``use_cache=True``). ``tie_word_embeddings``,
    ``scale_decoder_outputs`` and ``model_type`` (``"t5"`` / ``"mt5"``) only matter to the
    LM head of :class:`T5ForPreTraining` and to the Hugging Face export.

    A ``cfg`` with LiBai's keys (``intermediate_size``, ``max_position_embeddings``, ...:
    LiBai's ``configs/common/models/t5.py``) builds LiBai's Megatron-style T5 instead,
    :class:`~libai.models.t5_megatron.MegatronT5Model`.
    """

    def __new__(cls, *args, cfg=None, **kwargs):
        if cls is T5Model and is_libai_t5_config(cfg, kwargs):
            return MegatronT5Model(*args, cfg=cfg, **kwargs)
        return super().__new__(cls)

    @configurable
    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        hidden_layers: int,
        num_attention_heads: int,
        ffn_hidden_size: int,
        head_size: int | None = None,
        num_decoder_layers: int | None = None,
        relative_attention_num_buckets: int = 32,
        relative_attention_max_distance: int = 128,
        dropout_prob: float = 0.1,
        layernorm_epsilon: float = 1e-6,
        initializer_factor: float = 1.0,
        feed_forward_proj: str = "relu",
        tie_word_embeddings: bool = True,
        scale_decoder_outputs: bool | None = None,
        model_type: str = "t5",
        pad_token_id: int = 0,
        eos_token_id: int = 1,
        decoder_start_token_id: int = 0,
    ):
        super().__init__()
        tp = dist.get_tensor_parallel_size()
        if num_attention_heads % tp:
            raise ValueError(
                f"num_attention_heads={num_attention_heads} is not divisible by "
                f"tensor_parallel_size={tp}; use a tensor_parallel_size that divides "
                f"{num_attention_heads}."
            )
        if model_type not in ("t5", "mt5"):
            raise ValueError(f"model_type must be 't5' or 'mt5', got {model_type!r}")
        activation, gated = parse_feed_forward_proj(feed_forward_proj)
        num_decoder_layers = hidden_layers if num_decoder_layers is None else num_decoder_layers
        total = hidden_layers + num_decoder_layers
        dist.check_model_num_layers(
            total, f"{hidden_layers} encoder + {num_decoder_layers} decoder layers"
        )
        head_size = head_size or hidden_size // num_attention_heads
        inner = num_attention_heads * head_size
        self.hidden_layers, self.num_decoder_layers = hidden_layers, num_decoder_layers
        f = initializer_factor
        # transformers' T5 init: projections reading the residual N(0, f / sqrt(d)), the
        # attention output N(0, f / sqrt(inner)); queries and the MLP output are rescaled below
        in_init = init_method_normal(f * hidden_size**-0.5)
        out_init = init_method_normal(f * inner**-0.5)
        self.word_embeddings = VocabEmbedding(
            vocab_size, hidden_size, init_method_normal(f), layer_idx=0
        )
        self.dropout = nn.Dropout(dropout_prob)

        def block(is_decoder):
            def build(i):
                layer = TransformerLayer(
                    hidden_size,
                    ffn_hidden_size,
                    num_attention_heads,
                    head_size=head_size,
                    is_decoder=is_decoder,
                    attention_dropout_prob=dropout_prob,
                    output_dropout_prob=dropout_prob,
                    layernorm_epsilon=layernorm_epsilon,
                    norm_type="rmsnorm",
                    pre_norm=True,
                    activation=activation,
                    gated_mlp=gated,
                    bias=False,
                    init_method=in_init,
                    output_layer_init_method=out_init,
                    scale_attention=False,
                    attn_mask_type="causal" if is_decoder else "padding",
                    layer_idx=i,
                )
                _rescale_init(layer, head_size, inner, ffn_hidden_size)
                return layer

            return build

        def bias(is_decoder):
            return lambda i: RelativePositionBias(
                num_attention_heads,
                relative_attention_num_buckets,
                relative_attention_max_distance,
                bidirectional=not is_decoder,
                init_method=in_init,
                layer_idx=i,
            )

        self.encoder = T5Stack(
            hidden_layers, 0, block(False), bias(False), hidden_size, layernorm_epsilon
        )
        self.decoder = T5Stack(
            num_decoder_layers,
            hidden_layers,
            block(True),
            bias(True),
            hidden_size,
            layernorm_epsilon,
        )

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (then dropout), for the encoder or the decoder."""
        hidden = self.word_embeddings(input_ids)
        return self.dropout(hidden) if self.dropout.p > 0 else hidden

    def _finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dropout(hidden) if self.dropout.p > 0 else hidden

    def encode(self, encoder_input_ids, encoder_attn_mask=None) -> torch.Tensor:
        """The encoder output ``[batch, src_len, hidden]`` (no pipeline parallelism)."""
        hidden, _, _ = self.encoder(self.embed(encoder_input_ids), _padding_mask(encoder_attn_mask))
        return self._finish(hidden)

    @accepts_hf_keywords
    def forward(
        self,
        encoder_input_ids: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_attn_mask: torch.Tensor | None = None,
        decoder_attn_mask: torch.Tensor | None = None,
        encoder_states: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
    ) -> dict:
        """Args:
        encoder_input_ids / decoder_input_ids: ``[batch, seq]`` token ids.
        encoder_attn_mask / decoder_attn_mask: ``[batch, seq]`` 1 = token, 0 = padding (the
            decoder mask covers the cached positions too); causality is added here.
        encoder_states: a precomputed encoder output (generation), instead of encoding.
        past_key_values: per decoder layer ``(self_kv, cross_kv)`` from a previous call with
            ``use_cache=True``; then ``decoder_input_ids`` are only the new tokens.
        """
        if encoder_states is None:
            if encoder_input_ids is None:
                raise ValueError("T5Model needs encoder_input_ids or encoder_states")
            encoder_states = self.encode(encoder_input_ids, encoder_attn_mask)
        hidden, _, presents = self.decoder(
            self.embed(decoder_input_ids),
            _padding_mask(decoder_attn_mask),
            encoder_states=encoder_states,
            encoder_attention_mask=_padding_mask(encoder_attn_mask),
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        out = {
            "last_hidden_state": self._finish(hidden),
            "encoder_last_hidden_state": encoder_states,
        }
        if use_cache:
            out["past_key_values"] = presents
        return out

    def pipeline_stage(self, *xs, encoder_mask=None, decoder_mask=None):
        """This pipeline stage's share of the forward (see the module docstring for the
        tuples handed between stages; the masks come from this stage's own batch). The last
        stage returns the decoder output."""
        if self.word_embeddings is not None:  # first stage: token ids
            encoder_ids, decoder_ids = xs
            xs = (self.embed(encoder_ids), self.embed(decoder_ids))
        if len(self.encoder.layers):
            enc, dec, *rest = xs
            enc, enc_bias, _ = self.encoder(
                enc, _padding_mask(encoder_mask), position_bias=rest[0] if rest else None
            )
            if self.encoder.final_layernorm is None:  # the encoder goes on after this stage
                return enc, dec, enc_bias
            xs = (self._finish(enc), dec)
        enc, dec, *rest = xs
        dec, dec_bias, _ = self.decoder(
            dec,
            _padding_mask(decoder_mask),
            position_bias=rest[0] if rest else None,
            encoder_states=enc,
            encoder_attention_mask=_padding_mask(encoder_mask),
        )
        if self.decoder.final_layernorm is not None:
            return self._finish(dec)
        tail = () if dec_bias is None else (dec_bias,)
        return (enc, dec, *tail)


@torch.no_grad()
def _rescale_init(layer: TransformerLayer, head_size: int, inner: int, ffn_hidden_size: int):
    """transformers' T5 init for what one init method per block cannot express: queries
    N(0, f / sqrt(d * head_size)), the MLP output N(0, f / sqrt(ffn)). Scaling this rank's
    shard element-wise keeps the init independent of the layout."""
    attn = layer.self_attention
    qkv = local_value(attn.query_key_value.weight)
    if qkv.is_meta:  # another pipeline stage's block
        return
    grouped = qkv.view(attn.local_kv_heads, attn.group_size + 2, head_size, -1)
    grouped[:, : attn.group_size].mul_(head_size**-0.5)
    if layer.is_decoder:
        local_value(layer.cross_attention.query.weight).mul_(head_size**-0.5)
    local_value(layer.mlp.dense_4h_to_h.weight).mul_((inner / ffn_hidden_size) ** 0.5)


class T5ForPreTraining(nn.Module):
    """T5 with the LM head and the loss (transformers' ``T5ForConditionalGeneration``).

    ``model(encoder_input_ids, decoder_input_ids, encoder_attn_mask, decoder_attn_mask,
    lm_labels, loss_mask)`` returns ``{"lm_loss"}`` in training (mean cross entropy over the
    labels that are not -100 and whose ``loss_mask`` is 1; plus ``"logits"`` in eval mode);
    without labels ``{"logits", "encoder_last_hidden_state"}`` (and ``"past_key_values"``
    with ``use_cache=True``, for step-by-step decoding with ``encoder_states``).

    A ``cfg`` with LiBai's keys builds LiBai's Megatron-style T5 and its loss instead,
    :class:`~libai.models.t5_megatron.MegatronT5ForPreTraining`.
    """

    def __new__(cls, cfg=None, **kwargs):
        if cls is T5ForPreTraining and is_libai_t5_config(cfg, kwargs):
            return MegatronT5ForPreTraining(cfg=cfg, **kwargs)
        return super().__new__(cls)

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        self.t5_model = T5Model(cfg=cfg, **kwargs)
        c = self.t5_model.libai_cfg
        tie = c["tie_word_embeddings"]
        scale = c["scale_decoder_outputs"]
        self.output_scale = c["hidden_size"] ** -0.5 if (tie if scale is None else scale) else None
        if tie:
            self.lm_head = LMLogits(self.t5_model.word_embeddings, layer_idx=-1)
        else:
            self.lm_head = LMLogits(
                None,
                vocab_size=c["vocab_size"],
                hidden_size=c["hidden_size"],
                init_method=init_method_normal(c["initializer_factor"]),
                layer_idx=-1,
            )
        self.loss_func = ParallelCrossEntropyLoss()

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.output_scale is not None:
            hidden = hidden * self.output_scale
        return self.lm_head(hidden)  # [S(0), S(-1)] vocab-split

    @staticmethod
    def _targets(lm_labels: torch.Tensor, loss_mask: torch.Tensor | None) -> torch.Tensor:
        if loss_mask is None:
            return lm_labels
        return lm_labels.masked_fill(loss_mask == 0, -100)

    @accepts_hf_keywords
    def forward(
        self,
        encoder_input_ids=None,
        decoder_input_ids=None,
        encoder_attn_mask=None,
        decoder_attn_mask=None,
        lm_labels=None,
        loss_mask=None,
        encoder_states=None,
        past_key_values=None,
        use_cache: bool = False,
    ) -> dict:
        out = self.t5_model(
            encoder_input_ids,
            decoder_input_ids,
            encoder_attn_mask,
            decoder_attn_mask,
            encoder_states=encoder_states,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        logits = self._logits(out["last_hidden_state"])
        if lm_labels is None:
            result = {
                "logits": self.lm_head.gather(logits),
                "encoder_last_hidden_state": out["encoder_last_hidden_state"],
            }
            if use_cache:
                result["past_key_values"] = out["past_key_values"]
            return result
        result = {"lm_loss": self.loss_func(logits, self._targets(lm_labels, loss_mask))}
        if not self.training:
            result["logits"] = self.lm_head.gather(logits)
        return result

    # ---- pipeline contract (libai.runtime.parallel) --------------------------------------------
    def pipeline_inputs(self, batch) -> tuple:
        return batch["encoder_input_ids"], batch["decoder_input_ids"]

    def pipeline_stage_kwargs(self, batch) -> dict:
        """The padding masks, which every stage reads from its own batch."""
        return {
            "encoder_mask": batch.get("encoder_attn_mask"),
            "decoder_mask": batch.get("decoder_attn_mask"),
        }

    def pipeline_target(self, batch) -> torch.Tensor:
        return self._targets(batch["lm_labels"], batch.get("loss_mask"))

    def pipeline_forward(self, *xs, encoder_mask=None, decoder_mask=None):
        """One stage: see :meth:`T5Model.pipeline_stage`; the last stage returns logits."""
        out = self.t5_model.pipeline_stage(
            *xs, encoder_mask=encoder_mask, decoder_mask=decoder_mask
        )
        return self._logits(out) if self.lm_head is not None else out

    def pipeline_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss_func(logits, target)

    # ---- generation (libai.inference.generation) ---------------------------------------------
    def encode_stage(self, x, encoder_mask, position_bias=None):
        """One pipeline stage of the encoder pass: token ids (first stage) or hidden states in,
        ``(hidden, encoder_mask, position_bias)`` out; stages past the encoder hand the
        finished output on unchanged. The last stage returns the encoder output."""
        t5 = self.t5_model
        if t5.word_embeddings is not None:
            x = t5.embed(x)
        hidden, position_bias, _ = t5.encoder(x, _padding_mask(encoder_mask), position_bias)
        if t5.encoder.final_layernorm is not None:
            hidden, position_bias = t5._finish(hidden), None
        return hidden if self.lm_head is not None else (hidden, encoder_mask, position_bias)

    def decode_stage(self, x, position_bias=None, *, cache, encoder_states, encoder_mask):
        """One pipeline stage of a decoding step with the KV cache ``cache`` (self- and
        cross-attention keys/values): decoder token ids (first stage) or hidden states in;
        ``(hidden, position_bias)`` out, or on the last stage the full-vocab logits of the
        last position ``[batch, vocab]``."""
        t5 = self.t5_model
        if t5.word_embeddings is not None:
            x = t5.embed(x)
        hidden, position_bias, _ = t5.decoder(
            x,
            None,
            position_bias=position_bias,
            encoder_states=encoder_states,
            encoder_attention_mask=_padding_mask(encoder_mask),
            past_key_values=cache,
        )
        if self.lm_head is None:
            return hidden, position_bias
        hidden = t5._finish(hidden[:, -1:])
        return self.lm_head.gather(self._logits(hidden))[:, -1]


# ``inspect.signature`` of the classes shows ``__init__``'s parameters, not the dispatching
# ``__new__``'s
T5Model.__signature__ = init_signature(T5Model)
T5ForPreTraining.__signature__ = init_signature(T5ForPreTraining)
