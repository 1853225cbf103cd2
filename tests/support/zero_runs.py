"""The tiny GPT trained with AdamW and global-norm clipping under a ZeRO stage, on the
current mesh (shared by the ZeRO layout and resharding tests and their dist scripts)."""

from __future__ import annotations

import torch
from gpt_reference import MAX_GRAD_NORM, build_model, make_batch

from libai import dist
from libai.runtime.parallel import ModelRunner
from libai.runtime.zero import prepare_model, shard_optimizer

ADAMW = dict(lr=0.01, weight_decay=0.1, eps=1e-6)
#: the step whose batch (never trained on) :func:`predict` runs on
PREDICT_STEP = 99


def make_run(stage=None, num_microbatches=1, *, hsdp_replicate_size=1, **runner_kwargs):
    """Model, runner and (ZeRO-wrapped) AdamW for ZeRO ``stage`` (None: without ZeRO)."""
    model = build_model()
    runner = ModelRunner(model, num_microbatches=num_microbatches, **runner_kwargs)
    prepare_model(runner, stage, hsdp_replicate_size=hsdp_replicate_size)
    params = list(model.parameters())
    # two groups (same hyper-parameters, same numbers as one), the second of one parameter:
    # the other dp ranks of a ZeRO 1/2 run own nothing in it, which checkpoints must handle
    optimizer = torch.optim.AdamW([{"params": params[:-1]}, {"params": params[-1:]}], **ADAMW)
    if stage is not None:
        optimizer = shard_optimizer(runner, optimizer, stage)
    return model, runner, optimizer


def train(runner, optimizer, steps, *, on_synced=None) -> tuple[list[float], list[float]]:
    """The given steps (each on its own global batch, split over dp); losses and norms."""
    util = dist.get_dist_util()
    dp = util.layout.data_parallel_size
    losses, norms = [], []
    for step in steps:
        batch = {k: v.chunk(dp)[util.data_parallel_rank] for k, v in make_batch(step).items()}
        losses.append(float(runner.forward_backward(batch)))
        if on_synced is not None:
            on_synced(step)
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, norms


def predict(runner) -> torch.Tensor | None:
    """Full-vocab logits of ``runner.predict`` in eval mode (what an evaluator that needs
    predictions gets) for this rank's dp share of an unseen batch; ``None`` on the ranks of
    pipeline stages other than the last."""
    util = dist.get_dist_util()
    dp = util.layout.data_parallel_size
    batch = make_batch(PREDICT_STEP)
    batch = {k: v.chunk(dp)[util.data_parallel_rank] for k, v in batch.items()}
    runner.model.eval()
    logits = runner.predict(batch)
    runner.model.train()
    return None if logits is None else runner.model.GPT_model.lm_head.gather(logits).clone()
