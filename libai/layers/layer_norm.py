"""LayerNorm and RMSNorm with replicated ``[B, B]`` parameters.

With ``sequence_parallel=True`` a norm sits in the sequence-parallel region (its input is
``[S(0), S(1)]``, this rank's share of the sequence): the computation is unchanged, its
parameters are marked so that their partial gradients are all-reduced over tp.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai.layers.param import (
    create_parameter,
    local_value,
    mark_sequence_parallel,
    ones,
    zeros,
)


class LayerNorm(nn.Module):
    """``F.layer_norm`` over the last dims; weight and bias replicated on every rank."""

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        bias: bool = True,
        *,
        layer_idx=0,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape, self.eps, self.layer_idx = tuple(normalized_shape), eps, layer_idx
        self.weight = create_parameter(self.normalized_shape, ones, layer_idx=layer_idx)
        self.bias = (
            create_parameter(self.normalized_shape, zeros, layer_idx=layer_idx) if bias else None
        )
        if sequence_parallel:
            mark_sequence_parallel(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [S(0), B] -> [S(0), B]  ([S(0), S(1)] -> [S(0), S(1)] under sequence parallel)
        bias = None if self.bias is None else local_value(self.bias)
        return F.layer_norm(x, self.normalized_shape, local_value(self.weight), bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, layer_idx={self.layer_idx}"


class RMSLayerNorm(nn.Module):
    """Root-mean-square norm (T5, Llama): statistics in fp32, scale by a replicated weight."""

    def __init__(
        self, hidden_size: int, eps: float = 1e-6, *, layer_idx=0, sequence_parallel: bool = False
    ):
        super().__init__()
        self.hidden_size, self.eps, self.layer_idx = hidden_size, eps, layer_idx
        self.weight = create_parameter((hidden_size,), ones, layer_idx=layer_idx)
        if sequence_parallel:
            mark_sequence_parallel(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [S(0), B] -> [S(0), B]  ([S(0), S(1)] -> [S(0), S(1)] under sequence parallel)
        normed = F.rms_norm(x.float(), (self.hidden_size,), eps=self.eps).to(x.dtype)
        return local_value(self.weight) * normed

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, layer_idx={self.layer_idx}"
