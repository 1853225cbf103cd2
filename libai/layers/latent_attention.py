"""Multi-head latent attention (MLA, DeepSeek-V2 / V3): keys and values from a low-rank
latent, a rotary part shared by the heads.

Per token ``x [H]``:

- queries: ``q = q_b(norm(q_a(x)))`` (or ``q_proj(x)`` without ``q_lora_rank``), per head
  ``[nope | rope]``;
- keys and values: ``[c | k_rope] = kv_a(x)``; ``[k_nope | v] = kv_b(norm(c))`` per head; the
  key of a head is ``[k_nope | k_rope]`` with ``k_rope`` shared by every head;
- the rope parts of q and k are rotated (DeepSeek's interleaved pairs by default), the
  scores scaled by ``(nope + rope)^-0.5``.

Layout: the heads are split over tensor-parallel ranks: ``q_b`` / ``q_proj`` and ``kv_b``
are column-parallel, ``dense`` (``o_proj``) row-parallel; ``q_a`` and ``kv_a`` (small, before
the per-head split) are replicated. The attention core, masks and KV cache are
:class:`~libai.layers.MultiheadAttention`'s (the cache holds the expanded keys and values).
Not with sequence parallel, context parallel or a static KV cache (keys and values of
different widths).
"""

from __future__ import annotations

import torch
from torch import nn

from libai import dist
from libai.layers.attention import MultiheadAttention
from libai.layers.collectives import copy_to_tp
from libai.layers.layer_norm import RMSLayerNorm
from libai.layers.linear import Linear
from libai.layers.param import InitMethod, default_init_method
from libai.layers.rotary import apply_rotary_pos_emb

__all__ = ["LatentAttention", "LATENT_KEYS"]

#: the settings a model's ``latent_attention=dict(...)`` takes
LATENT_KEYS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "rope_interleave",
    "softmax_scale",
)


def apply_interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """DeepSeek's rotary layout: dims in pairs ``(x0, x1), (x2, x3), ...`` each rotated by
    one frequency, the result de-interleaved (evens' rotation, then odds')."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half].unsqueeze(1), sin[..., :half].unsqueeze(1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LatentAttention(MultiheadAttention):
    """MLA self-attention (the module doc); ``forward`` is :class:`MultiheadAttention`'s."""

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_interleave: bool = True,
        softmax_scale: float | None = None,
        attention_dropout_prob: float = 0.0,
        output_dropout_prob: float = 0.0,
        bias: bool = False,
        init_method: InitMethod = default_init_method,
        output_layer_init_method: InitMethod | None = None,
        attn_mask_type: str = "causal",
        layer_idx: int = 0,
        sequence_parallel: bool = False,
        norm_eps: float = 1e-6,
    ):
        nn.Module.__init__(self)
        util = self._dist_util = dist.capture_mesh()
        if sequence_parallel or util.context_parallel_size > 1:
            raise ValueError(
                "multi-head latent attention (DeepSeek's MLA) does not support sequence or "
                "context parallel yet; set train.dist.sequence_parallel=False and "
                "context_parallel_size=1"
            )
        tp = util.tensor_parallel_size
        if num_attention_heads % tp:
            raise ValueError(
                f"num_attention_heads={num_attention_heads} is not divisible by "
                f"tensor_parallel_size={tp}"
            )
        self.hidden_size, self.layer_idx = hidden_size, layer_idx
        self.num_heads = self.num_kv_heads = num_attention_heads
        self.local_kv_heads, self.group_size = num_attention_heads // tp, 1
        self.nope, self.rope, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.kv_lora_rank, self.q_lora_rank = kv_lora_rank, q_lora_rank
        self.head_size = qk_nope_head_dim + qk_rope_head_dim  # of queries and keys
        self.rope_interleave = rope_interleave
        self.checkpoint_core = False
        self.is_cross_attention, self.causal = False, attn_mask_type == "causal"
        self.attention_dropout_prob = attention_dropout_prob
        self.scale = softmax_scale if softmax_scale is not None else self.head_size**-0.5
        self.qk_norm = None
        heads = num_attention_heads
        rank = dict(layer_idx=layer_idx)
        if q_lora_rank is None:
            self.q_proj = Linear(
                hidden_size, heads * self.head_size, False, "col", init_method, **rank
            )
        else:
            # [S(0), B] x [B, B]^T -> [S(0), B] -> norm -> x [B, S(0)]^T -> [S(0), S(-1)]
            self.q_a_proj = Linear(hidden_size, q_lora_rank, bias, "data", init_method, **rank)
            self.q_a_layernorm = RMSLayerNorm(q_lora_rank, eps=norm_eps, **rank)
            self.q_b_proj = Linear(
                q_lora_rank, heads * self.head_size, False, "col", init_method, **rank
            )
        # [S(0), B] x [B, B]^T -> [S(0), B]: the latent and the shared rope key, replicated
        self.kv_a_proj_with_mqa = Linear(
            hidden_size, kv_lora_rank + qk_rope_head_dim, bias, "data", init_method, **rank
        )
        self.kv_a_layernorm = RMSLayerNorm(kv_lora_rank, eps=norm_eps, **rank)
        # [S(0), B] x [B, S(0)]^T -> [S(0), S(-1)]: this rank's heads' k_nope and v
        self.kv_b_proj = Linear(
            kv_lora_rank, heads * (qk_nope_head_dim + v_head_dim), False, "col", init_method, **rank
        )
        # [S(0), S(-1)] x [B, S(1)]^T -> [S(0), P] -> all-reduce -> [S(0), B]
        self.dense = Linear(
            heads * v_head_dim,
            hidden_size,
            bias,
            "row",
            output_layer_init_method or init_method,
            **rank,
        )
        self.output_dropout = nn.Dropout(output_dropout_prob)

    def _project(self, hidden_states, encoder_states, past_key_value):
        b, s, _ = hidden_states.shape
        h = self.local_kv_heads
        if self.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q = q.view(b, s, h, self.head_size).transpose(1, 2)
        latent, k_rope = self.kv_a_proj_with_mqa(hidden_states).split(
            (self.kv_lora_rank, self.rope), dim=-1
        )
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, s, h, self.nope + self.v_dim)
        k_nope, v = kv.transpose(1, 2).split((self.nope, self.v_dim), dim=-1)
        # the rope key is shared by every head, this rank's and the others': its gradient
        # sums over tp  ([S(0), B] -> [S(0), B], all-reduce backward)
        k_rope = copy_to_tp(k_rope, self._dist_util.tp_group)
        k_rope = k_rope.reshape(b, 1, s, self.rope).expand(b, h, s, self.rope)
        return q, torch.cat((k_nope, k_rope), dim=-1), v.contiguous()

    def _rotate(self, q, k, rotary_pos_emb):
        """Only the rope part (the last ``qk_rope_head_dim`` dims) turns."""
        rotate = apply_interleaved_rotary if self.rope_interleave else apply_rotary_pos_emb

        def turn(x):
            return torch.cat(
                (x[..., : self.nope], rotate(x[..., self.nope :], *rotary_pos_emb)), -1
            )

        return turn(q), turn(k)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
            f"q_lora_rank={self.q_lora_rank}, nope={self.nope}, rope={self.rope}, "
            f"v={self.v_dim}, layer_idx={self.layer_idx}"
        )
