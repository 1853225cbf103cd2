"""Stochastic depth (LiBai's ``DropPath``): drop a residual branch per sample while training."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DropPath", "drop_path"]


def drop_path(
    x: torch.Tensor, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True
) -> torch.Tensor:
    """``x`` with each sample (dim 0) zeroed with probability ``drop_prob`` while training,
    the kept ones divided by ``1 - drop_prob`` (``scale_by_keep``) so the mean is unchanged."""
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    mask = (torch.rand(shape, device=x.device) < keep).to(x.dtype)
    if keep > 0.0 and scale_by_keep:
        mask = mask / keep
    return x * mask


class DropPath(nn.Module):
    """:func:`drop_path` as a module (active in training mode only)."""

    def __init__(self, drop_prob: float = 0.0, scale_by_keep: bool = True):
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"DropPath: drop_prob must be in [0, 1), got {drop_prob}")
        self.drop_prob, self.scale_by_keep = drop_prob, scale_by_keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training, self.scale_by_keep)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"
