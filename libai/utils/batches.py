"""Cutting a batch into micro-batches (gradient accumulation, pipeline micro-batches)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["split_batch"]


def _split(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    if t.shape[0] % n:
        raise ValueError(f"local batch size {t.shape[0]} is not divisible by num_microbatches={n}")
    return list(t.chunk(n, dim=0))


def split_batch(batch, n: int) -> list:
    """``batch`` cut into ``n`` micro-batches along dim 0 of every tensor, keeping its
    structure (mappings, lists and tuples; other leaves are shared by all micro-batches)."""
    if isinstance(batch, torch.Tensor):
        return _split(batch, n)
    if isinstance(batch, Mapping):
        parts = {k: split_batch(v, n) for k, v in batch.items()}
        return [type(batch)((k, v[i]) for k, v in parts.items()) for i in range(n)]
    if isinstance(batch, (list, tuple)):
        parts = [split_batch(v, n) for v in batch]
        return [type(batch)(p[i] for p in parts) for i in range(n)]
    return [batch] * n
