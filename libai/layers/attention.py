"""Multi-head attention: self or cross, causal or padded, MHA / GQA / MQA, RoPE, KV cache."""

from __future__ import annotations

import enum
import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from libai import dist
from libai.layers.context_parallel import (
    causal_keep,
    causal_share_attention,
    gather_sequence,
    shard_positions,
)
from libai.layers.kv_cache import LayerKVCache, StaticLayerKVCache
from libai.layers.layer_norm import RMSLayerNorm
from libai.layers.linear import Linear
from libai.layers.paged_kv_cache import PagedLayerKVCache
from libai.layers.param import InitMethod, default_init_method, mark_sequence_parallel
from libai.layers.rotary import apply_rotary_pos_emb

KVPair = tuple[torch.Tensor, torch.Tensor]


def _divisible(name: str, value: int, tp: int) -> None:
    if value % tp:
        raise ValueError(
            f"{name}={value} is not divisible by tensor_parallel_size={tp}; choose a "
            f"tensor_parallel_size that divides {name}."
        )


class AttnMaskType(enum.Enum):
    """LiBai's names of the two masks (``attn_mask_type=AttnMaskType.causal``); the layers
    here take either these or the strings ``"padding"`` / ``"causal"``."""

    padding = 1
    causal = 2


class MultiheadAttention(nn.Module):
    """Attention whose heads are split over tensor-parallel ranks.

    Self-attention uses one fused column-parallel ``query_key_value`` projection whose rows
    are grouped per key/value head: ``[q x (heads // kv_heads), k, v]`` per group, so a
    contiguous tp shard holds whole groups. Cross-attention uses ``query`` and ``key_value``.
    The output projection ``dense`` is row-parallel.

    ``forward`` takes an explicit KV cache, ``past_key_value``: this layer's
    :class:`~libai.layers.kv_cache.LayerKVCache` (extended in place), or a legacy pair
    ``(k, v)``, each ``[batch, local_kv_heads, past_len, head_size]``; with ``use_cache=True``
    it returns ``(output, present_key_value)``. The module itself keeps no state. With a
    :class:`~libai.layers.kv_cache.StaticLayerKVCache` (causal self-attention), attention
    runs over all of its ``max_length`` slots behind the cache's ``keep`` mask (the query
    written at slot i keeps key slot j iff ``j <= i`` and j is no padding, computed once per
    step by :meth:`~libai.layers.kv_cache.StaticKVCache.step`); an ``attention_mask``, if
    given, must cover every slot.

    With ``sequence_parallel=True`` (self-attention only) ``hidden_states`` and the output
    are this rank's share of the sequence ``[S(0), S(1)]``: the q/k/v projection all-gathers
    the sequence and ``dense`` reduce-scatters it (see :class:`~libai.layers.Linear`).

    ``qk_norm`` RMS-normalizes queries and keys before the rotary embedding: ``"head"`` per
    head over ``head_size`` with one weight shared by the heads (Qwen3, ``q_norm`` /
    ``k_norm``), ``"full"`` over the whole projection, ``heads x head_size`` (OLMoE; one
    tensor-parallel rank only).
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        num_key_value_heads: int | None = None,
        head_size: int | None = None,
        is_cross_attention: bool = False,
        attention_dropout_prob: float = 0.0,
        output_dropout_prob: float = 0.0,
        bias: bool = True,
        qkv_bias: bool | None = None,
        init_method: InitMethod = default_init_method,
        output_layer_init_method: InitMethod | None = None,
        scale_attention: bool = True,
        attn_mask_type: str = "padding",
        *,
        layer_idx: int = 0,
        sequence_parallel: bool = False,
        qk_norm: str | None = None,
        qk_norm_eps: float = 1e-6,
    ):
        super().__init__()
        if qk_norm not in (None, "head", "full"):
            raise ValueError(f"qk_norm must be None, 'head' or 'full', got {qk_norm!r}")
        if sequence_parallel and is_cross_attention:
            raise ValueError(
                "cross-attention does not support sequence parallel (train.dist."
                "sequence_parallel=True): its keys/values come from the encoder's full sequence"
            )
        if isinstance(attn_mask_type, AttnMaskType):
            attn_mask_type = attn_mask_type.name
        if attn_mask_type not in ("padding", "causal"):
            raise ValueError(
                f"attn_mask_type must be 'padding' or 'causal', got {attn_mask_type!r}"
            )
        num_key_value_heads = num_key_value_heads or num_attention_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={num_attention_heads} is not a multiple of "
                f"num_key_value_heads={num_key_value_heads}"
            )
        if head_size is None:
            if hidden_size % num_attention_heads:
                raise ValueError(
                    f"hidden_size={hidden_size} is not divisible by "
                    f"num_attention_heads={num_attention_heads}"
                )
            head_size = hidden_size // num_attention_heads
        #: the mesh this layer was built on (its cp group gathers keys and values)
        self._dist_util = dist.capture_mesh()
        tp = self._dist_util.tensor_parallel_size
        _divisible("hidden_size", hidden_size, tp)
        _divisible("num_attention_heads", num_attention_heads, tp)
        _divisible("num_key_value_heads", num_key_value_heads, tp)
        self.hidden_size, self.head_size, self.layer_idx = hidden_size, head_size, layer_idx
        self.num_heads, self.num_kv_heads = num_attention_heads, num_key_value_heads
        self.local_kv_heads = num_key_value_heads // tp
        self.group_size = num_attention_heads // num_key_value_heads
        #: recompute the attention core (softmax(q k^T) v) in backward instead of keeping
        #: what it saves (FleetX's recompute_granularity: core_attn; set by TransformerLayer)
        self.checkpoint_core = False
        self.is_cross_attention, self.causal = is_cross_attention, attn_mask_type == "causal"
        self.attention_dropout_prob = attention_dropout_prob
        self.scale = head_size**-0.5 if scale_attention else 1.0
        qkv_bias = bias if qkv_bias is None else qkv_bias
        q_out = num_attention_heads * head_size
        kv_out = num_key_value_heads * head_size
        if is_cross_attention:
            self.query = Linear(
                hidden_size, q_out, qkv_bias, "col", init_method, layer_idx=layer_idx
            )
            self.key_value = Linear(
                hidden_size, 2 * kv_out, qkv_bias, "col", init_method, layer_idx=layer_idx
            )
        else:
            self.query_key_value = Linear(
                hidden_size,
                q_out + 2 * kv_out,
                qkv_bias,
                "col",
                init_method,
                layer_idx=layer_idx,
                sequence_parallel=sequence_parallel,
            )
        self.dense = Linear(
            q_out,
            hidden_size,
            bias,
            "row",
            output_layer_init_method or init_method,
            layer_idx=layer_idx,
            sequence_parallel=sequence_parallel,
        )
        self.output_dropout = nn.Dropout(output_dropout_prob)
        self.qk_norm = qk_norm
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            if qk_norm == "full" and tp > 1:
                raise ValueError(
                    "qk_norm='full' (a norm over all heads' queries, OLMoE's) with "
                    f"tensor_parallel_size={tp}: the heads are split over tp; use "
                    "tensor_parallel_size=1 for this model"
                )
            q_width, k_width = (head_size, head_size) if qk_norm == "head" else (q_out, kv_out)
            self.q_norm = RMSLayerNorm(q_width, eps=qk_norm_eps, layer_idx=layer_idx)
            self.k_norm = RMSLayerNorm(k_width, eps=qk_norm_eps, layer_idx=layer_idx)
            # each tp rank normalizes its own heads with the shared weights: partial
            # gradients, summed over tp by the runtime
            mark_sequence_parallel(self.q_norm.weight, self.k_norm.weight)

    def _normalize_qk(self, q, k):
        """``q [b, heads, s, d]``, ``k [b, kv_heads, s, d]`` through ``q_norm`` / ``k_norm``."""
        if self.qk_norm == "head":
            return self.q_norm(q), self.k_norm(k)

        def full(x, norm):  # over heads x head_size, in the projection's order
            b, h, s, d = x.shape
            return norm(x.transpose(1, 2).reshape(b, s, h * d)).view(b, s, h, d).transpose(1, 2)

        return full(q, self.q_norm), full(k, self.k_norm)

    def _rotate(self, q, k, rotary_pos_emb):
        """``q`` and ``k`` rotated by the positions' ``(cos, sin)`` (every head dim)."""
        return apply_rotary_pos_emb(q, *rotary_pos_emb), apply_rotary_pos_emb(k, *rotary_pos_emb)

    def _project(self, hidden_states, encoder_states, past_key_value):
        kvh, g, hd = self.local_kv_heads, self.group_size, self.head_size
        if not self.is_cross_attention:
            # [S(0), B] x [B, S(0)]^T -> [S(0), S(-1)]: whole kv groups per rank
            # (sequence parallel: [S(0), S(1)] -> all-gather -> [S(0), B] first)
            qkv = self.query_key_value(hidden_states)
            b, s = qkv.shape[:2]  # the whole sequence, also under sequence parallel
            qkv = qkv.view(b, s, kvh, g + 2, hd)
            # unbind / split, whose backward is one stack / cat (indexing would zero-fill a
            # full-size gradient per index and add them up)
            if g == 1:
                q, k, v = qkv.unbind(dim=3)
            else:
                q, k, v = qkv.split((g, 1, 1), dim=3)
                q, k, v = q.reshape(b, s, kvh * g, hd), k.squeeze(3), v.squeeze(3)
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        b, s, _ = hidden_states.shape
        q = self.query(hidden_states).view(b, s, kvh * g, hd).transpose(1, 2)
        cached = _cached_cross(past_key_value)
        if cached is not None:  # encoder keys/values were computed on the first step
            return q, cached[0], cached[1]
        kv = self.key_value(encoder_states).view(b, encoder_states.shape[1], kvh, 2, hd)
        k, v = kv.unbind(dim=3)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if isinstance(past_key_value, LayerKVCache):
            past_key_value.cross = (k, v)
        return q, k, v

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_value: KVPair | None = None,
        use_cache: bool = False,
        rotary_pos_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | None = None,
    ):
        """Args:
        hidden_states: ``[batch, seq, hidden]`` (replicated over tp).
        encoder_states: keys/values source for cross-attention.
        attention_mask: broadcastable to ``[batch, heads, q_len, kv_len]``; bool or 0/1
            integers (1 = attend), or an additive float bias. Combined with the causal
            mask if ``attn_mask_type`` is causal.
        rotary_pos_emb: ``(cos, sin)`` for the query positions (keys share them).
        position_bias: additive bias for this rank's heads, e.g. T5's relative positions.
        """
        if (
            self.is_cross_attention
            and encoder_states is None
            and _cached_cross(past_key_value) is None
        ):
            raise ValueError("cross-attention needs encoder_states (or a cached past_key_value)")
        q, k, v = self._project(hidden_states, encoder_states, past_key_value)
        if self.qk_norm is not None:
            q, k = self._normalize_qk(q, k)
        if rotary_pos_emb is not None:
            q, k = self._rotate(q, k, rotary_pos_emb)
        if isinstance(past_key_value, PagedLayerKVCache):  # serving: packed sequences
            # [1, S(heads), N, d] per rank: each sequence over its own pages
            context = past_key_value.attend(
                q, k, v, scale=self.scale, enable_gqa=self.group_size > 1
            )
            return self._output(context, None, use_cache)
        query_positions = None  # context parallel: the global positions of the queries
        if self._dist_util.cp_group is not None and not self.is_cross_attention:
            query_positions, k, v = self._gather_context(q, k, v, past_key_value, use_cache)
        static_keep = None  # a static cache: which slots each query attends to
        if past_key_value is not None and not self.is_cross_attention:
            if isinstance(past_key_value, StaticLayerKVCache):
                static_keep = past_key_value.owner.keep
            if isinstance(past_key_value, LayerKVCache):
                k, v = past_key_value.update(k, v)
            else:
                k = torch.cat((past_key_value[0], k), dim=2)
                v = torch.cat((past_key_value[1], v), dim=2)
        present = (k, v) if use_cache else None
        sdpa = dict(
            dropout_p=self.attention_dropout_prob if self.training else 0.0,
            scale=self.scale,
            enable_gqa=self.group_size > 1,  # kv heads shared by query groups, no copies
        )
        unmasked = attention_mask is None and position_bias is None
        if query_positions is not None and self.causal and unmasked:
            # context parallel: each query chunk against the keys up to its end
            util = self._dist_util
            cp, rank = util.context_parallel_size, util.context_parallel_rank
            core = functools.partial(causal_share_attention, cp=cp, rank=rank, **sdpa)
        else:
            mask, is_causal = self._attention_bias(
                q, k, attention_mask, position_bias, static_keep, query_positions
            )
            # [S(0), S(heads)] per rank: attention is local to this rank's heads
            core = functools.partial(
                F.scaled_dot_product_attention, attn_mask=mask, is_causal=is_causal, **sdpa
            )
        if self.checkpoint_core and self.training and torch.is_grad_enabled():
            context = checkpoint(core, q, k, v, use_reentrant=False)
        else:
            context = core(q, k, v)
        return self._output(context, present, use_cache)

    def _output(self, context, present, use_cache):
        """``context [batch, local heads, seq, d]`` through the output projection."""
        b, _, s, _ = context.shape
        context = context.transpose(1, 2).reshape(b, s, -1)
        # [S(0), S(-1)] x [B, S(1)]^T -> [S(0), P] -> all-reduce -> [S(0), B]
        # (sequence parallel: [S(0), P] -> reduce-scatter -> [S(0), S(1)])
        out = self.dense(context)
        if self.output_dropout.p > 0:  # skip the identity call: ~5 us a time on CPU
            out = self.output_dropout(out)
        return (out, present) if use_cache else out

    def _gather_context(self, q, k, v, past_key_value, use_cache):
        """Context parallel: ``(query positions, keys, values)``, the keys and values of the
        whole sequence gathered from the cp ranks (:mod:`libai.layers.context_parallel`)."""
        if past_key_value is not None or use_cache:
            raise ValueError(
                "a KV cache under context parallel is not supported: generate with "
                "train.dist.context_parallel_size=1"
            )
        util = self._dist_util
        cp = util.context_parallel_size
        positions = shard_positions(
            q.shape[2] * cp, cp, util.context_parallel_rank, device=q.device
        )
        # [S(0), S(2)] over (dp, cp) -> all-gather -> [S(0), B]  (reduce-scatter backward);
        # keys and values in one collective
        k, v = gather_sequence(torch.stack((k, v)), util.cp_group, 3).unbind(0)
        return positions, k, v

    def _attention_bias(
        self, q, k, attention_mask, position_bias, static_keep=None, query_positions=None
    ):
        """Return ``(attn_mask, is_causal)`` for SDPA; masked scores get the dtype's min.
        ``static_keep``: a static cache's bool mask over its slots (instead of causality);
        ``query_positions``: the queries' global positions (context parallel)."""
        q_len, kv_len = q.shape[2], k.shape[2]
        causal = self.causal and not self.is_cross_attention and q_len > 1
        if query_positions is not None:
            causal = self.causal  # one query of a shard still sees only its past
            if causal and static_keep is None:
                static_keep = causal_keep(query_positions, kv_len)
        if attention_mask is None and position_bias is None and static_keep is None:
            if causal and q_len == kv_len:
                return None, True
            if not causal:
                return None, False
        keep = static_keep
        if keep is None and causal:  # query i sits at absolute position kv_len - q_len + i
            keep = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - q_len)
        bias = None
        if attention_mask is not None:
            if not attention_mask.is_floating_point():  # 0/1 integer masks mean keep/drop
                attention_mask = attention_mask.bool()
            if attention_mask.dtype == torch.bool:
                keep = attention_mask if keep is None else keep & attention_mask
            else:
                bias = attention_mask.to(q.dtype)
        if position_bias is not None:
            bias = position_bias.to(q.dtype) if bias is None else bias + position_bias.to(q.dtype)
        if keep is None:
            return bias, False
        base = torch.zeros((), dtype=q.dtype, device=q.device) if bias is None else bias
        masked = torch.tensor(torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device)
        return torch.where(keep, base, masked), False


def _cached_cross(past_key_value) -> KVPair | None:
    """Cross-attention keys/values already computed: a cache's ``cross`` or a legacy pair."""
    if isinstance(past_key_value, LayerKVCache):
        return past_key_value.cross
    return past_key_value
