"""One configurable Transformer block for every model (GPT-2, BERT, T5, Llama, ViT)."""

from __future__ import annotations

import functools

import torch
from torch import nn

from libai.layers.attention import KVPair, MultiheadAttention
from libai.layers.checkpointing import checkpointed
from libai.layers.kv_cache import LayerKVCache
from libai.layers.latent_attention import LatentAttention
from libai.layers.layer_norm import LayerNorm, RMSLayerNorm
from libai.layers.mlp import MLP
from libai.layers.moe import MoE, MoEConfig
from libai.layers.param import InitMethod, default_init_method


def build_norm(
    norm_type: str, hidden_size: int, eps: float, *, layer_idx: int, sequence_parallel=False
) -> nn.Module:
    """``"layernorm"`` or ``"rmsnorm"``."""
    sp = dict(layer_idx=layer_idx, sequence_parallel=sequence_parallel)
    if norm_type == "layernorm":
        return LayerNorm(hidden_size, eps=eps, **sp)
    if norm_type == "rmsnorm":
        return RMSLayerNorm(hidden_size, eps=eps, **sp)
    raise ValueError(f"norm_type must be 'layernorm' or 'rmsnorm', got {norm_type!r}")


class TransformerLayer(nn.Module):
    """Self-attention (+ cross-attention when ``is_decoder``) + MLP, pre- or post-norm.

    - ``pre_norm=True`` (GPT-2, Llama, T5, ViT): ``x + f(norm(x))``.
    - ``pre_norm=False`` (BERT): ``norm(x + f(x))``.

    ``forward`` returns the hidden states, or ``(hidden_states, present)`` with
    ``use_cache=True``, where ``present`` is ``(self_kv, cross_kv)`` (``cross_kv`` is None
    for non-decoders).

    ``bias`` sets the biases of the attention output and the MLP; ``qkv_bias`` /
    ``mlp_bias`` override it for the q/k/v projections / the MLP (e.g. Qwen2: q/k/v only).

    ``qk_norm`` (``"head"``: Qwen3; ``"full"``: OLMoE) RMS-normalizes the self-attention's
    queries and keys (see :class:`~libai.layers.MultiheadAttention`); ``latent_attention``
    (:data:`~libai.layers.latent_attention.LATENT_KEYS`) makes it DeepSeek's multi-head
    latent attention (:class:`~libai.layers.latent_attention.LatentAttention`).

    ``moe`` (a :class:`~libai.layers.moe.MoEConfig`) makes the feed-forward a Mixture of
    Experts (:class:`~libai.layers.moe.MoE`, experts of ``ffn_hidden_size`` unless the config
    sets theirs) with the MLP's activation and gating.

    ``sequence_parallel=True`` (Megatron's sequence parallel, ``train.dist.sequence_parallel``;
    not with ``is_decoder``): ``hidden_states`` and the output are this rank's share of the
    sequence ``[batch, seq / tp, hidden]``, so norms, dropout and residuals hold 1/tp of the
    activations; attention and MLP gather the sequence on entry and reduce-scatter it on exit.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_key_value_heads: int | None = None,
        head_size: int | None = None,
        is_decoder: bool = False,
        attention_dropout_prob: float = 0.0,
        output_dropout_prob: float = 0.0,
        layernorm_epsilon: float = 1e-5,
        norm_type: str = "layernorm",
        pre_norm: bool = True,
        activation: str = "gelu",
        gated_mlp: bool = False,
        bias: bool = True,
        qkv_bias: bool | None = None,
        init_method: InitMethod = default_init_method,
        output_layer_init_method: InitMethod | None = None,
        scale_attention: bool = True,
        attn_mask_type: str = "padding",
        *,
        layer_idx: int = 0,
        mlp_bias: bool | None = None,
        sequence_parallel: bool = False,
        apply_residual_post_layernorm: bool = False,
        moe: MoEConfig | None = None,
        qk_norm: str | None = None,
        latent_attention: dict | None = None,
    ):
        super().__init__()
        if sequence_parallel and is_decoder:
            raise ValueError(
                "a decoder block with cross-attention does not support sequence parallel "
                "(train.dist.sequence_parallel=True); set it to False for this model."
            )
        self.layer_idx, self.pre_norm, self.is_decoder = layer_idx, pre_norm, is_decoder
        self.sequence_parallel = sequence_parallel
        #: LiBai's option (pre-norm): the residual branch starts after the norm,
        #: ``norm(x) + fn(norm(x))``, instead of ``x + fn(norm(x))``
        self.apply_residual_post_layernorm = bool(apply_residual_post_layernorm)
        #: recompute in backward instead of keeping activations: False, "full" or "selective"
        #: (the block), "full_attn" (the attention sub-layer) or "core_attn" (the attention
        #: core); set by ``train.activation_checkpoint``, see libai.layers.checkpointing
        self.activation_checkpointing = False
        attn_kwargs = dict(
            num_key_value_heads=num_key_value_heads,
            head_size=head_size,
            attention_dropout_prob=attention_dropout_prob,
            output_dropout_prob=output_dropout_prob,
            bias=bias,
            qkv_bias=qkv_bias,
            init_method=init_method,
            output_layer_init_method=output_layer_init_method,
            scale_attention=scale_attention,
            layer_idx=layer_idx,
        )
        sp = dict(layer_idx=layer_idx, sequence_parallel=sequence_parallel)
        self.input_layernorm = build_norm(norm_type, hidden_size, layernorm_epsilon, **sp)
        if latent_attention is not None:  # DeepSeek's multi-head latent attention
            self.self_attention = LatentAttention(
                hidden_size,
                num_attention_heads,
                **latent_attention,
                attention_dropout_prob=attention_dropout_prob,
                output_dropout_prob=output_dropout_prob,
                bias=bias,
                init_method=init_method,
                output_layer_init_method=output_layer_init_method,
                attn_mask_type=attn_mask_type,
                layer_idx=layer_idx,
                sequence_parallel=sequence_parallel,
            )
        else:
            self.self_attention = MultiheadAttention(
                hidden_size,
                num_attention_heads,
                attn_mask_type=attn_mask_type,
                sequence_parallel=sequence_parallel,
                qk_norm=qk_norm,
                qk_norm_eps=layernorm_epsilon,
                **attn_kwargs,
            )
        if is_decoder:
            self.post_attention_layernorm = build_norm(
                norm_type, hidden_size, layernorm_epsilon, layer_idx=layer_idx
            )
            self.cross_attention = MultiheadAttention(
                hidden_size, num_attention_heads, is_cross_attention=True, **attn_kwargs
            )
        self.post_cross_attention_layernorm = build_norm(
            norm_type, hidden_size, layernorm_epsilon, **sp
        )
        if moe is not None:
            self.mlp = MoE(
                hidden_size,
                ffn_hidden_size,
                moe,
                activation,
                gated_mlp,
                init_method,
                output_layer_init_method,
                **sp,
            )
            return
        self.mlp = MLP(
            hidden_size,
            ffn_hidden_size,
            output_dropout_prob,
            activation,
            gated_mlp,
            bias if mlp_bias is None else mlp_bias,
            init_method,
            output_layer_init_method,
            **sp,
        )

    def _residual(self, x, norm, fn):
        """Pre-norm ``x + fn(norm(x))`` (``norm(x) + fn(norm(x))`` with
        ``apply_residual_post_layernorm``) or post-norm ``norm(x + fn(x))``; passes a cache
        on."""
        if not self.pre_norm:
            out = fn(x)
            out, present = out if isinstance(out, tuple) else (out, None)
            return norm(x + out), present
        normed = norm(x)
        out = fn(normed)
        out, present = out if isinstance(out, tuple) else (out, None)
        return (normed if self.apply_residual_post_layernorm else x) + out, present

    @property
    def activation_checkpointing(self):
        return self._activation_checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, mode) -> None:
        mode = "full" if mode is True else mode
        self.__dict__["_activation_checkpointing"] = mode
        for name in ("self_attention", "cross_attention"):
            attention = self._modules.get(name) if "_modules" in self.__dict__ else None
            if attention is not None:
                attention.checkpoint_core = mode == "core_attn"

    def _recomputing(self) -> bool:
        return self.training and torch.is_grad_enabled()

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        """See :meth:`_forward`; with activation checkpointing of the block ("full" /
        "selective") it is recomputed in backward."""
        mode = self.activation_checkpointing
        if mode in ("full", "selective") and self._recomputing():
            return checkpointed(self._forward, mode, hidden_states, *args, **kwargs)
        return self._forward(hidden_states, *args, **kwargs)

    def _forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_value: LayerKVCache | tuple[KVPair | None, KVPair | None] | None = None,
        use_cache: bool = False,
        rotary_pos_emb=None,
        position_bias: torch.Tensor | None = None,
        encoder_position_bias: torch.Tensor | None = None,
    ):
        if isinstance(past_key_value, LayerKVCache):  # one object serves both attentions
            self_past = cross_past = past_key_value
        else:
            self_past, cross_past = past_key_value if past_key_value is not None else (None, None)

        def attend(x):
            return self.self_attention(
                x,
                attention_mask=attention_mask,
                past_key_value=self_past,
                use_cache=use_cache,
                rotary_pos_emb=rotary_pos_emb,
                position_bias=position_bias,
            )

        if self.activation_checkpointing == "full_attn" and self._recomputing():
            attend = functools.partial(checkpointed, attend, "full")  # the attention sub-layer
        h, self_present = self._residual(hidden_states, self.input_layernorm, attend)
        cross_present = None
        if self.is_decoder:
            h, cross_present = self._residual(
                h,
                self.post_attention_layernorm,
                lambda x: self.cross_attention(
                    x,
                    encoder_states=encoder_states,
                    attention_mask=encoder_attention_mask,
                    past_key_value=cross_past,
                    use_cache=use_cache,
                    position_bias=encoder_position_bias,
                ),
            )
        h, _ = self._residual(h, self.post_cross_attention_layernorm, self.mlp)
        return (h, (self_present, cross_present)) if use_cache else h
