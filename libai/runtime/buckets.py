"""Grouping tensors into buckets for fewer, larger collectives (dp gradient sync, ZeRO)."""

from __future__ import annotations

import torch


def bucket_tensors(tensors: list[torch.Tensor], bucket_bytes: int = 25 * 2**20):
    """Group same-dtype tensors, in order, into buckets of about ``bucket_bytes``."""
    bucket, size = [], 0
    for t in tensors:
        if bucket and (
            size + t.numel() * t.element_size() > bucket_bytes or t.dtype != bucket[0].dtype
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket
