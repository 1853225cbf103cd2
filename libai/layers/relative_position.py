"""Bucketed relative position bias (T5 / mT5): a learned scalar per (bucket, head) added to
the attention scores."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers.param import InitMethod, create_parameter, default_init_method, local_value


def relative_position_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """Map ``key_position - query_position`` to a bucket id in ``[0, num_buckets)``.

    Mesh TensorFlow's scheme (as in transformers' ``T5Attention``): half of the buckets hold
    exact small distances, the other half logarithmically wider ranges up to ``max_distance``
    (everything farther shares the last bucket). ``bidirectional`` (encoders) spends half of
    the buckets on keys after the query; otherwise (causal decoders) keys after the query all
    map to bucket 0.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # the clamp keeps log() finite for the small distances, which are not taken from here
    large = (
        max_exact
        + (
            torch.log(distance.float().clamp(min=1) / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """``[1, heads, q_len, k_len]`` attention bias from a ``[num_buckets, heads]`` table.

    The table is split over tensor-parallel ranks by heads (``[B, S(1)]``), so each rank
    computes the bias of the heads its :class:`~libai.layers.MultiheadAttention` holds, with
    no communication; pass the result as ``position_bias``.

    Args:
        num_heads: attention heads (divisible by tensor_parallel_size).
        num_buckets: ``relative_attention_num_buckets``.
        max_distance: ``relative_attention_max_distance``.
        bidirectional: True for an encoder, False for a causal decoder.
    """

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        init_method: InitMethod = default_init_method,
        *,
        layer_idx: int = 0,
    ):
        super().__init__()
        tp = dist.get_tensor_parallel_size()
        if num_heads % tp:
            raise ValueError(
                f"num_heads={num_heads} is not divisible by tensor_parallel_size={tp}; "
                f"choose a tensor_parallel_size that divides {num_heads}."
            )
        self.num_heads, self.num_buckets, self.max_distance = num_heads, num_buckets, max_distance
        self.bidirectional, self.layer_idx = bidirectional, layer_idx
        self.weight = create_parameter(
            (num_buckets, num_heads), init_method, layer_idx=layer_idx, tp_split_dim=1
        )

    def forward(
        self,
        query_length: int,
        key_length: int,
        past_length: int = 0,
        query_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Bias for queries at positions ``past_length + [0, query_length)`` (or the tensor
        ``query_positions``, e.g. a static KV cache's ``cache_position``) against keys at
        ``[0, key_length)``: ``[1, local_heads, query_length, key_length]``."""
        weight = local_value(self.weight)
        device = weight.device
        if query_positions is not None:
            query = query_positions.to(device)[:, None]
        else:
            query = torch.arange(past_length, past_length + query_length, device=device)[:, None]
        key = torch.arange(key_length, device=device)[None, :]
        buckets = relative_position_bucket(
            key - query, self.bidirectional, self.num_buckets, self.max_distance
        )
        # [q, k] ids x [B, S(1)] table -> [q, k, S(heads)]: this rank's heads, no comm
        values = F.embedding(buckets, weight)
        return values.permute(2, 0, 1).unsqueeze(0).contiguous()  # sent between pp stages

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}, "
            f"layer_idx={self.layer_idx}"
        )
