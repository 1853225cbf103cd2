"""Rotary position embedding (RoPE), the half-split convention used by Llama / Qwen2 / NeoX."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Computes ``(cos, sin)`` tables for given positions; shared by every attention layer.

    It holds no parameters (only the ``inv_freq`` buffer), so it lives on every pipeline stage.
    """

    def __init__(self, head_size: int, base: float = 10000.0, inv_freq: torch.Tensor | None = None):
        super().__init__()
        if inv_freq is None:
            inv_freq = 1.0 / (
                base ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
            )
        self.head_size = head_size
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype = torch.float32):
        """``position_ids`` [b, s] -> ``(cos, sin)`` each [b, s, head_size]."""
        freqs = position_ids.float().unsqueeze(-1) * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [b, heads, s, head_size] by the tables from :class:`RotaryEmbedding`."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin
