"""FP8 training cases shared by the one-process tests (tests/unit/layers/test_float8.py) and
the two-process script (dist_scripts/fp8_layouts.py): a tiny GPT whose Linear dims all divide
by 16, trained through the runtime with ``train.amp.fp8``."""

from __future__ import annotations

import torch
from master_weights_cases import GPT

from libai.models import GPTForPreTraining
from libai.runtime.parallelize import parallelize, shard_optimizer_for
from libai.runtime.spec import AmpSpec, RunSpec, ZeroSpec


def batch_of(step: int, rows: int = 4) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, GPT["vocab_size"], (rows, 13), generator=g)
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}


def build(fp8, *, autocast=False, microbatches=1, zero=None, dist_cfg=None, lr=1e-3):
    """The tiny GPT (seed 0) parallelized with ``amp.fp8=fp8`` (every 16-divisible layer
    converts) and its AdamW."""
    torch.manual_seed(0)
    model = GPTForPreTraining(**GPT)
    spec = RunSpec(
        amp=AmpSpec(enabled=autocast, dtype="bf16", fp8=fp8, fp8_min_size=False),
        zero_optimization=ZeroSpec(enabled=zero is not None, stage=zero or 1),
        num_accumulation_steps=microbatches,
        dist=dict(dist_cfg or {}),
    )
    parts = parallelize(model, spec)
    optimizer = torch.optim.AdamW(parts.runner.model.parameters(), lr=lr, weight_decay=0.1)
    return parts, shard_optimizer_for(parts, optimizer)


def train(parts, optimizer, steps: int, *, dp=1, rank=0, rows=4, cycle=None):
    """Losses of ``steps`` steps; each global batch of ``rows`` rows split over ``dp``;
    ``cycle``: that many batches in turn."""
    losses = []
    for step in range(steps):
        global_batch = batch_of(step % cycle if cycle else step, rows)
        batch = {k: v.chunk(dp)[rank] for k, v in global_batch.items()}
        losses.append(float(parts.runner.forward_backward(batch)))
        parts.runner.optimizer_step(optimizer, max_grad_norm=1.0)
    return losses
