"""What ``ModelRunner`` hands to ``torch.distributed.pipelining``, the same on every release.

Supported releases differ inside ``torch.distributed.pipelining`` (2.10 / 2.11 against
2.13 and newer). This module keeps libai's pipeline runs equal across them:

- :class:`StageModule` adapts a model's pipeline contract to the ``forward(*args,
  **kwargs)`` a stage calls, hands contiguous tensors on, and refuses a non-floating-point
  tensor handed to the next stage (with the fix: read it from the batch on every stage);
- :class:`LibaiPipelineStage` makes a stage's received activations require grad whenever
  the step runs backward, and checks no last-stage output against its first run's shapes;
- :func:`check_schedule_microbatches` refuses, before any stage is built, a micro-batch
  count the chosen schedule cannot run.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed import pipelining

_TORCH = tuple(int(v) for v in torch.__version__.split(".")[:2])


class GPipeAnyCount(pipelining.ScheduleGPipe):
    """GPipe with any micro-batch count on every supported release.

    torch 2.10's single-stage base class refuses fewer micro-batches than stages for every
    schedule, although GPipe's fill-drain loop needs no more (torch >= 2.11 accepts them):
    there it is built for ``num_stages`` micro-batches and then set to run ``n``."""

    def __init__(self, stage, n_microbatches: int, **kwargs):
        short = _TORCH < (2, 11) and n_microbatches < stage.num_stages
        super().__init__(stage, stage.num_stages if short else n_microbatches, **kwargs)
        if short:
            self._n_microbatches = n_microbatches
            self.pipeline_order = self._get_pipeline_order()


#: schedule name -> (class, holds several stages per rank)
PIPELINE_SCHEDULES = {
    "GPipe": (GPipeAnyCount, False),
    "1F1B": (pipelining.Schedule1F1B, False),
    "Interleaved1F1B": (pipelining.ScheduleInterleaved1F1B, True),
    "LoopedBFS": (pipelining.ScheduleLoopedBFS, True),
    "InterleavedZeroBubble": (pipelining.ScheduleInterleavedZeroBubble, True),
}

#: releases whose stages fix the receive buffers' ``requires_grad`` when first built
_RECV_GRAD_FIXED_AT_BUILD = _TORCH < (2, 13)


def contiguous(value):
    """``value`` (a tensor, or a tuple / list of them) in the contiguous layout the pipeline
    stages were built with: before torch 2.13, ``torch.distributed.pipelining`` rejects a
    tensor whose strides differ from the ones it inferred (e.g. a ``tokens[:, :-1]`` view
    of a ``seq + 1`` buffer). A no-op for tensors that are contiguous already."""
    if isinstance(value, torch.Tensor):
        return value.contiguous()
    if isinstance(value, (tuple, list)):
        return type(value)(contiguous(v) for v in value)
    return value


def check_schedule_microbatches(
    schedule: str, num_microbatches: int, pipeline_size: int, virtual_size: int = 1
) -> None:
    """Raise ``ValueError`` naming the setting when ``schedule`` cannot run
    ``num_microbatches`` micro-batches over ``pipeline_size`` ranks (the same rules on every
    supported release; checked before any stage or schedule is built, on every rank alike).

    GPipe and LoopedBFS run any count. 1F1B needs at least one micro-batch per stage. The
    interleaved schedules group micro-batches into rounds of ``pipeline_size``: the count must
    be below ``pipeline_size`` or a multiple of its rounds (``num_microbatches //
    pipeline_size``)."""
    fix = (
        "set train.num_accumulation_steps (the pipeline's micro-batches per step) accordingly, "
        "or train.dist.pipeline_schedule='GPipe', which runs any count"
    )
    if schedule == "1F1B" and num_microbatches < pipeline_size:
        raise ValueError(
            f"pipeline schedule 1F1B needs at least one micro-batch per stage: got "
            f"{num_microbatches} micro-batch(es) for {pipeline_size} stages; {fix}"
        )
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, num_microbatches // pipeline_size)
        if num_microbatches % rounds:
            raise ValueError(
                f"pipeline schedule {schedule} needs a micro-batch count that is a multiple of "
                f"its rounds (count // pipeline_parallel_size = {rounds}): got "
                f"{num_microbatches} on {pipeline_size} ranks x {virtual_size} virtual stages; "
                f"{fix}"
            )


class StageModule(nn.Module):
    """Adapts a model's pipeline contract to the ``forward(*args, **kwargs)`` a stage calls:
    ``args`` are the first stage's inputs or the previous stage's outputs, ``kwargs`` the
    model's stage keyword inputs (read by every stage from its own batch)."""

    def __init__(self, model: nn.Module, runner, is_last: bool):
        super().__init__()
        self.model = model
        self.is_last = is_last
        self.__dict__["_runner"] = runner  # a reference, not a submodule

    def forward(self, *args, **stage_kwargs):
        with self._runner.autocast():
            out = contiguous(self.model.pipeline_forward(*args, **stage_kwargs))
        if not self.is_last:
            check_stage_outputs(type(self.model).__name__, out)
        return out


def check_stage_outputs(model_name: str, out) -> None:
    """Refuse a stage output that is not floating point: activations sent to the next stage
    carry gradients back, and integer tensors cannot (torch 2.10 / 2.11 fail deep inside
    the schedule on them). Per-sample integer inputs (masks, ids) belong in the model's
    ``pipeline_stage_kwargs``, which every stage reads from its own batch."""
    for i, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
        if isinstance(t, torch.Tensor) and not (t.is_floating_point() or t.is_complex()):
            raise TypeError(
                f"{model_name}.pipeline_forward hands the next pipeline stage a {t.dtype} "
                f"tensor (output {i}): stages may only hand on floating-point activations. "
                "Return it from the model's pipeline_stage_kwargs(batch) instead, so every "
                "stage reads it from its own batch."
            )


class LibaiPipelineStage(pipelining.PipelineStage):
    """``PipelineStage`` with the behaviour of torch >= 2.13 on every supported release.

    - Received activations require grad in every step that runs backward. torch 2.10 /
      2.11 fix it when the stage's buffers are first built: a stage whose first call was an
      evaluation (``schedule.eval``) would otherwise send no input gradients ever after.
    - No last-stage output is checked against the shapes of the stage's first (no-grad)
      call: it is sent nowhere, and it may differ between calls (with a chunked loss it is
      the head's input in a training step and the logits under no_grad). torch >= 2.13
      checks no last-stage output either.
    - The shape-inference forward torch 2.10 / 2.11 run on the first step draws no random
      numbers (torch >= 2.13 infers on meta tensors). Otherwise its dropout would shift the
      random stream of every later step by the draws of one forward, and a run resumed from
      a checkpoint (whose first step infers again) would not repeat the uninterrupted one.
    """

    def _shape_inference(self, args, kwargs=None):
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            return super()._shape_inference(args, kwargs)

    def _retrieve_recv_activations(self, fwd_chunk_id: int):
        activations = super()._retrieve_recv_activations(fwd_chunk_id)
        if _RECV_GRAD_FIXED_AT_BUILD and self.has_backward:
            for t in activations:
                if isinstance(t, torch.Tensor) and t.is_leaf and t.is_floating_point():
                    t.requires_grad_(True)
        return activations

    def _validate_fwd_outputs(self, outputs):
        if not self.is_last:
            super()._validate_fwd_outputs(outputs)
