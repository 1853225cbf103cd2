"""Forward-only passes of a :class:`~libai.runtime.parallel.ModelRunner`: the evaluation
loss and the model's outputs (an evaluator's logits), on any layout.

Under pipeline parallel both go through the runner's schedule
(:class:`~libai.runtime.pipeline_schedule.PipelineSchedule`); under context parallel each
rank runs its share of the sequences (through the schedule too), the loss is averaged over
the shares, and predicting outputs is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as torch_dist

from libai.runtime.fsdp import fsdp_forward_method
from libai.runtime.pipeline_split import pipeline_inputs, pipeline_stage_kwargs


@torch.no_grad()
def eval_loss(runner, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """This data-parallel rank's mean loss on ``batch`` (the same on its tp, cp and pp ranks)."""
    util = runner.util
    if runner.pipeline:
        loss = runner.stage_schedule.eval_loss(runner._context_share(batch))
    else:
        with runner.autocast():
            loss = runner._loss(runner._context_share(batch)).float()
    if util.cp_group is not None:  # each cp rank holds its share of the mean
        torch_dist.all_reduce(loss, group=util.cp_group)
        loss /= util.context_parallel_size
    return loss


@torch.no_grad()
def predict(runner, batch: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The last stage's ``pipeline_forward`` output for ``batch`` (``None`` on the ranks of
    other stages); without pp ``model.pipeline_forward(*inputs)`` on every rank (under
    ZeRO-3 inside FSDP2's root hooks, which gather the parameters outside the blocks). A
    model without ``pipeline_forward`` (LiBai's project models: their eval-mode ``forward``
    returns the outputs by name, e.g. ``{"prediction_scores": ...}``) gives that mapping."""
    if runner.util.cp_group is not None:
        raise ValueError(
            "predicting outputs (an evaluator's logits) under context parallel is not "
            "supported yet: evaluate by loss, or with train.dist.context_parallel_size=1"
        )
    if runner.pipeline:
        return runner.stage_schedule.predict(batch)
    model = runner.model
    if not hasattr(model, "pipeline_forward"):
        with runner.autocast():
            return model(**batch)
    forward = fsdp_forward_method(model, "pipeline_forward")
    with runner.autocast():
        return forward(*pipeline_inputs(model, batch), **pipeline_stage_kwargs(model, batch))
