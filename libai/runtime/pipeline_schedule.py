"""Pipeline parallel for one run: this rank's stages and the schedule that drives them.

:class:`PipelineSchedule` splits the model (:func:`~libai.runtime.pipeline_split.stage_copies`),
wraps each local stage in a ``torch.distributed.pipelining`` stage and builds the schedule
(GPipe, 1F1B, interleaved 1F1B, ...), then runs training steps, evaluation losses and
predictions through it. The model's pipeline contract (:mod:`libai.models.contract`) says
what each stage takes and what the last one computes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.distributed as torch_dist
from torch import nn

from libai.models.contract import missing_pipeline_members
from libai.runtime.pipeline_split import (
    batch_rows,
    first_rows,
    pipeline_inputs,
    pipeline_stage_kwargs,
    pipeline_target,
    stage_copies,
)
from libai.runtime.pipeline_stages import (
    PIPELINE_SCHEDULES,
    LibaiPipelineStage,
    StageModule,
    check_schedule_microbatches,
    contiguous,
)
from libai.runtime.sequence_parallel import check_sequence_parallel_batch


class PipelineSchedule:
    """This rank's pipeline stages of ``model`` on ``util``'s mesh and their schedule.

    Args:
        model: pruned in place to this rank's stages.
        util: the mesh the model was built on.
        num_microbatches: the schedule's micro-batches per step.
        schedule_name: one of :data:`~libai.runtime.pipeline_stages.PIPELINE_SCHEDULES`.
        host: what each stage runs its forward under (an object with ``autocast()``: the
            runner).
        loss_scale: the current fp16 loss scale (the schedule's backward starts from the
            scaled loss).
    """

    def __init__(
        self,
        model: nn.Module,
        util,
        *,
        num_microbatches: int,
        schedule_name: str,
        host,
        loss_scale: Callable[[], float],
    ):
        layout = util.layout
        if schedule_name not in PIPELINE_SCHEDULES:
            raise ValueError(
                f"Unknown pipeline schedule {schedule_name!r} (train.dist.pipeline_schedule); "
                f"choose one of {sorted(PIPELINE_SCHEDULES)}."
            )
        schedule_cls, multi_stage = PIPELINE_SCHEDULES[schedule_name]
        if multi_stage != (layout.virtual_pipeline_size > 1):
            need = "> 1" if multi_stage else "= 1"
            raise ValueError(
                f"pipeline schedule {schedule_name} needs train.dist.virtual_pipeline_size "
                f"{need} (got {layout.virtual_pipeline_size})."
            )
        check_schedule_microbatches(
            schedule_name, num_microbatches, layout.pipeline_parallel_size,
            layout.virtual_pipeline_size,
        )  # fmt: skip
        missing = missing_pipeline_members(model)
        if missing:
            raise TypeError(
                f"{type(model).__name__} lacks {', '.join(missing)} (the pipeline model "
                "contract, libai.models.contract) and cannot run with pipeline_parallel_size > 1."
            )
        self.model, self.util, self.loss_scale = model, util, loss_scale
        stages = util.local_stages()
        #: the module of each local stage (the model itself, or copies sharing its parameters)
        self.stage_models = stage_copies(model, stages, util)
        leftover = [n for n, p in model.named_parameters() if p.is_meta]
        if leftover:
            raise RuntimeError(
                f"parameters of other pipeline stages were not pruned: {leftover[:5]}"
            )
        last = layout.num_stages - 1
        self.stages = [
            LibaiPipelineStage(
                StageModule(m, host, s == last),
                s,
                layout.num_stages,
                util.device,
                group=util.pp_group,
            )  # fmt: skip
            for m, s in zip(self.stage_models, stages)
        ]
        self.is_first, self.is_last = 0 in stages, last in stages
        #: the batch size the stages' buffers were built for (the first batch run)
        self.batch_size: int | None = None

        def loss_fn(output, target):
            return model.pipeline_loss(output, target) * loss_scale()

        first = self.stages if multi_stage else self.stages[0]
        self.schedule = schedule_cls(first, num_microbatches, loss_fn=loss_fn)

    def step(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward and backward of every micro-batch; the last stage's mean loss (0 on
        other stages)."""
        return self._run(self.schedule.step, batch)

    def eval_loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward only: the mean loss on ``batch``, on every stage. A batch smaller than
        the one the stages were built for is padded and its loss taken over the real rows."""
        if self.batch_size not in (None, batch_rows(batch)):
            out = self.predict(batch)  # pads, and cuts the outputs back to the real rows
            loss = torch.zeros((), device=self.util.device)
            if out is not None:
                loss = self.model.pipeline_loss(out, pipeline_target(self.model, batch)).float()
        else:
            loss = self._run(self.schedule.eval, batch)
        torch_dist.all_reduce(loss, group=self.util.pp_group)  # from the last stage to all
        return loss

    def predict(self, batch: Mapping[str, torch.Tensor]):
        """Forward only: the last stage's ``pipeline_forward`` output (``None`` on other
        stages), for a batch padded to the built size and cut back to its real rows."""
        check_sequence_parallel_batch(batch, self.util.layout)
        if self.batch_size is None:
            self.batch_size = batch_rows(batch)
        batch, rows = self._pad(batch)
        self._sync_stage_modes()
        args, kwargs = self._arguments(batch)
        if self.is_last:
            kwargs["losses"] = []
        out = self.schedule.eval(*args, **kwargs)
        if not self.is_last:
            return None
        return out if rows is None else first_rows(out, rows)

    def _sync_stage_modes(self) -> None:
        """Give the stage copies of a multi-stage (interleaved) rank the model's train / eval
        mode: ``model.eval()`` does not reach them, and dropout would stay on."""
        for stage_model in self.stage_models:
            if stage_model is not self.model:
                stage_model.train(self.model.training)

    def _arguments(self, batch) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a schedule call on this rank: the first stage's inputs, every
        stage's :func:`pipeline_stage_kwargs` and the last stage's ``target``, contiguous
        (see :func:`~libai.runtime.pipeline_stages.contiguous`)."""
        args = ()
        kwargs = {k: contiguous(v) for k, v in pipeline_stage_kwargs(self.model, batch).items()}
        if self.is_first:
            args = contiguous(pipeline_inputs(self.model, batch))
        if self.is_last:
            kwargs["target"] = contiguous(pipeline_target(self.model, batch))
        return args, kwargs

    def _pad(self, batch) -> tuple[Mapping[str, torch.Tensor], int | None]:
        """``(batch, rows)``: a batch smaller than the one the stages were built for (an
        evaluation set's last batch) padded to that size with copies of its last row, and
        its real row count; ``(batch, None)`` when it already has the size."""
        size, full = batch_rows(batch), self.batch_size
        if full is None or size == full:
            return batch, None
        if size > full:
            raise ValueError(
                f"a batch of {size} rows reached pipeline stages built for {full} rows (the "
                "first batch they ran); evaluation batches may be smaller, never larger: set "
                "train.test_micro_batch_size to the training per-rank batch"
            )
        index = torch.arange(full).clamp(max=size - 1)
        return {
            k: v[index.to(v.device)] if isinstance(v, torch.Tensor) else v for k, v in batch.items()
        }, size

    def _run(self, run, batch) -> torch.Tensor:
        """Drive ``run`` (the schedule's ``step`` or ``eval``) with this rank's stage inputs;
        returns the last stage's mean micro-batch loss, 0 on other stages."""
        check_sequence_parallel_batch(batch, self.util.layout)  # on every stage, before any send
        if self.batch_size is None:
            self.batch_size = batch_rows(batch)
        self._sync_stage_modes()
        args, kwargs = self._arguments(batch)
        losses: list[torch.Tensor] = []
        if self.is_last:
            kwargs["losses"] = losses
        run(*args, **kwargs)
        if self.is_last:
            return (
                torch.stack([loss.detach().float() for loss in losses]).mean() / self.loss_scale()
            )
        return torch.zeros((), device=self.util.device)
