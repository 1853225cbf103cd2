"""Run a libai model on the current mesh: pipeline stages, gradient sync, one training step.

The model file is layout-agnostic. Under tensor parallelism its layers already hold only
their shards; this module adds what crosses layers:

- **pipeline parallel**: this rank's stages are cut out of the model (modules of other
  stages are dropped), wrapped in ``torch.distributed.pipelining`` stages, and driven by a
  schedule (GPipe, 1F1B, interleaved 1F1B, ...);
- **data parallel**: gradients are averaged over the dp group after backward;
- **tied weights across stages**: gradients of parameters marked ``libai_tied_group`` (the
  word embedding on the first stage and its copy on the last) are summed between the two;
- **sequence parallel**: gradients of parameters marked ``libai_sequence_parallel`` are
  summed over tp (:mod:`libai.runtime.sequence_parallel`).

Usage::

    runner = ModelRunner(model, num_microbatches=4)       # prunes ``model`` to this rank
    optimizer = torch.optim.AdamW(runner.model.parameters())
    loss = runner.train_step(batch, optimizer)           # same float on every rank
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping

import torch
import torch.distributed as torch_dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from libai import dist
from libai.models.contract import (
    PipelineInputs,
    PipelineStageInputs,
    PipelineTarget,
    loss_terms,
    missing_pipeline_members,
    total_loss,
)
from libai.runtime.amp import DynamicLossScaler, autocast
from libai.runtime.blocks import apply_block_switches
from libai.runtime.buckets import bucket_tensors
from libai.runtime.context_parallel import check_context_parallel_support, shard_batch
from libai.runtime.fsdp import fsdp_forward_method
from libai.runtime.grad_clip import clip_grad_norm_
from libai.runtime.pipeline_stages import (
    PIPELINE_SCHEDULES,
    LibaiPipelineStage,
    StageModule,
    check_schedule_microbatches,
    contiguous,
)
from libai.runtime.sequence_parallel import (
    all_reduce_sequence_parallel_grads,
    check_sequence_parallel_batch,
    check_sequence_parallel_support,
    sequence_parallel_parameter_names,
)
from libai.utils.batches import split_batch


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def prune_to_stages(model: nn.Module, stages: set[int], util=None) -> nn.Module:
    """Drop (in place) every submodule whose ``layer_idx`` belongs to a stage not in ``stages``
    (of ``util``'s layout; default the mesh ``model`` was built on).

    Modules in an ``nn.ModuleDict`` are deleted (the other keys, hence parameter names, stay);
    other submodules are replaced by ``None``. Returns ``model``.
    """
    util = util or dist.mesh_of(model)
    for name, child in list(model.named_children()):
        if child is None:
            continue
        layer_idx = getattr(child, "layer_idx", None)
        if layer_idx is not None and util.get_layer_stage(layer_idx) not in stages:
            if isinstance(model, nn.ModuleDict):
                del model[name]
            else:
                setattr(model, name, None)
        else:
            prune_to_stages(child, stages, util)
    return model


def _copy_sharing_parameters(model: nn.Module) -> nn.Module:
    """A structural copy of ``model`` whose parameters and buffers are the same objects."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def _batch_rows(batch: Mapping[str, torch.Tensor]) -> int:
    """The batch dimension of a batch dict (its first tensor's dim 0)."""
    return next(v for v in batch.values() if isinstance(v, torch.Tensor)).shape[0]


def _first_rows(value, rows: int):
    """``value`` (a tensor, or a tuple / list / dict of them) cut to its first ``rows`` rows."""
    if isinstance(value, torch.Tensor):
        return value[:rows]
    if isinstance(value, (tuple, list)):
        return type(value)(_first_rows(v, rows) for v in value)
    if isinstance(value, Mapping):
        return {k: _first_rows(v, rows) for k, v in value.items()}
    return value


class ModelRunner:
    """Forward, backward and gradient synchronization of ``model`` on the mesh it was built on
    (:func:`libai.dist.mesh_of`; the current mesh for a model without libai layers).

    Args:
        model: a libai model built after :func:`libai.dist.setup_dist_util`.
            With pipeline parallelism it is pruned in place to this rank's stages and must
            provide ``pipeline_forward(*xs)``, ``pipeline_loss(output, target)`` and the
            class attributes ``pipeline_input_key`` / ``pipeline_target_key`` (or the methods
            ``pipeline_inputs(batch)`` / ``pipeline_target(batch)``). A stage returning a
            tuple hands its tensors to the next stage's ``pipeline_forward`` as arguments.
            Tensors every stage needs but that are not activations (padding masks, token
            type ids) come from ``pipeline_stage_kwargs(batch)``: each stage takes them from
            its own copy of the batch as keyword arguments, so they never cross a stage
            boundary (see :func:`pipeline_stage_kwargs`).
        num_microbatches: micro-batches per step (gradient accumulation; the pipeline's
            micro-batches under pp). The local batch size must be divisible by it.
        schedule: pipeline schedule name (:data:`PIPELINE_SCHEDULES`); defaults to the
            dist config's ``pipeline_schedule``.
        loss_fn: ``loss_fn(batch)`` -> a loss tensor, or a mapping whose keys containing
            "loss" are summed; replaces ``model(**batch)`` (e.g. a task module's
            ``training_step``). The batch may then be any nesting of mappings, lists and
            tuples of tensors. Not with pipeline parallelism, where the model's
            ``pipeline_loss`` computes the loss on the last stage.
        backward_fn: ``backward_fn(loss)`` replaces ``loss.backward()``; it receives the
            loss already multiplied by the fp16 loss scale and divided by the micro-batch
            count. Not with pipeline parallelism.
        autocast_op_lists: a :class:`~libai.runtime.amp_lists.AutocastOpLists` (custom
            black / white op lists entered inside autocast); needs ``amp_dtype``.
        overlap_grad_reduce: all-reduce the gradients over dp in buckets while backward
            runs (:class:`~libai.runtime.grad_overlap.OverlappedGradReducer`; the same sums as
            reducing after it). Used without pipeline parallel and without ZeRO 2/3.
        no_recompute_layers: with activation checkpointing, the layer indices whose
            activations are kept (FleetX's ``Model.no_recompute_layers``).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        num_microbatches: int = 1,
        schedule: str | None = None,
        amp_dtype: torch.dtype | None = None,
        loss_scaler: DynamicLossScaler | None = None,
        activation_checkpointing: bool | str = False,
        compile: bool = False,
        loss_fn=None,
        backward_fn=None,
        autocast_op_lists=None,
        overlap_grad_reduce: bool = True,
        no_recompute_layers=(),
    ):
        util = dist.mesh_of(model)
        layout = util.layout
        check_sequence_parallel_support(model, layout)
        check_context_parallel_support(model, layout, loss_fn)
        if not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ValueError(
                f"num_microbatches must be a positive integer, got {num_microbatches!r}"
            )
        if loss_scaler is not None and amp_dtype != torch.float16:
            raise ValueError("a loss scaler is only used with fp16 autocast (amp_dtype=float16)")
        if autocast_op_lists and amp_dtype is None:
            raise ValueError("custom autocast op lists need mixed precision (an amp dtype)")
        self.util, self.model, self.num_microbatches = util, model, num_microbatches
        self.amp_dtype, self.loss_scaler = amp_dtype, loss_scaler
        self.autocast_op_lists = autocast_op_lists or None
        self.loss_fn, self.backward_fn = loss_fn, backward_fn
        self.overlap_grad_reduce = overlap_grad_reduce
        self._grad_reducer = None
        self.last_step_skipped, self.last_grad_norm = False, None
        #: the last step's loss terms (the output's "loss" entries), reduced like the loss;
        #: empty under pipeline parallelism and for a ``loss_fn`` returning a tensor
        self.last_loss_terms: dict[str, torch.Tensor] = {}
        #: ZeRO stage 2/3 (libai.runtime.zero): replaces the dp all-reduce; clipping sums over dp
        self.grad_sharder = None
        #: mixed precision O2 (libai.runtime.master_weights): set by parallelize
        self.master_weights = None
        self.schedule_name = schedule or layout.pipeline_schedule
        self.pipeline = layout.pipeline_parallel_size > 1
        #: under pp: the batch size the stages' buffers were built for (the first batch run)
        self.pipeline_batch_size: int | None = None
        if self.pipeline and (loss_fn is not None or backward_fn is not None):
            raise ValueError(
                "pipeline parallel computes the loss with the model's pipeline_loss on the last "
                "stage and runs backward in its schedule: a custom loss_fn / backward_fn cannot "
                "be split over stages"
            )
        # the order of libai.runtime.parallelize: pipeline split, then activation
        # checkpointing and compile on what this rank runs
        self.schedule = self._build_pipeline() if self.pipeline else None
        leftover = [n for n, p in model.named_parameters() if p.is_meta]
        if leftover:
            raise RuntimeError(
                f"parameters of other pipeline stages were not pruned: {leftover[:5]}"
            )
        apply_block_switches(
            self.local_models,
            checkpointing=activation_checkpointing,
            compile=compile,
            no_recompute_layers=no_recompute_layers,
        )
        self.tied_parameters = [
            p for p in model.parameters() if getattr(p, "libai_tied_group", None) is not None
        ]
        self.sequence_parallel_names = sequence_parallel_parameter_names(model)

    @property
    def local_models(self) -> list[nn.Module]:
        """The modules this rank runs: the model (pruned to its stages) and, with several
        local pipeline stages, each stage's copy."""
        copies = getattr(self, "_stage_models", None) or []
        return [self.model, *(m for m in copies if m is not self.model)]

    def autocast(self):
        """The autocast context of this run (a null context in fp32), with the custom op
        lists inside it when there are any."""
        device_type = self.util.layout.device_type
        if self.autocast_op_lists is None:
            return autocast(device_type, self.amp_dtype)
        stack = contextlib.ExitStack()
        stack.enter_context(autocast(device_type, self.amp_dtype))
        stack.enter_context(self.autocast_op_lists.mode(device_type, self.amp_dtype))
        return stack

    def _loss(self, batch) -> torch.Tensor:
        """The loss of one (micro-)batch: ``loss_fn(batch)`` or ``model(**batch)``'s."""
        return self._loss_and_terms(batch)[0]

    def _loss_and_terms(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one (micro-)batch and its terms (the output's "loss" entries; none
        when ``loss_fn`` returns a tensor)."""
        out = self.model(**batch) if self.loss_fn is None else self.loss_fn(batch)
        if self.loss_fn is not None and isinstance(out, torch.Tensor):
            return out, {}
        return total_loss(out), loss_terms(out)

    def _backward(self, loss: torch.Tensor) -> None:
        if self.backward_fn is None:
            loss.backward()
        else:
            self.backward_fn(loss)

    @property
    def _loss_scale(self) -> float:
        return 1.0 if self.loss_scaler is None else self.loss_scaler.scale

    # ---- pipeline ---------------------------------------------------------------------------
    def _build_pipeline(self):
        util, layout = self.util, self.util.layout
        if self.schedule_name not in PIPELINE_SCHEDULES:
            raise ValueError(
                f"Unknown pipeline schedule {self.schedule_name!r} (train.dist.pipeline_schedule); "
                f"choose one of {sorted(PIPELINE_SCHEDULES)}."
            )
        schedule_cls, multi_stage = PIPELINE_SCHEDULES[self.schedule_name]
        if multi_stage != (layout.virtual_pipeline_size > 1):
            need = "> 1" if multi_stage else "= 1"
            raise ValueError(
                f"pipeline schedule {self.schedule_name} needs train.dist.virtual_pipeline_size "
                f"{need} (got {layout.virtual_pipeline_size})."
            )
        check_schedule_microbatches(
            self.schedule_name,
            self.num_microbatches,
            layout.pipeline_parallel_size,
            layout.virtual_pipeline_size,
        )
        missing = missing_pipeline_members(self.model)
        if missing:
            raise TypeError(
                f"{type(self.model).__name__} lacks {', '.join(missing)} (the pipeline model "
                "contract, libai.models.contract) and cannot run with pipeline_parallel_size > 1."
            )
        stages = util.local_stages()
        prune_to_stages(self.model, set(stages), util)
        if len(stages) == 1:
            stage_models = [self.model]
        else:
            stage_models = [
                prune_to_stages(_copy_sharing_parameters(self.model), {s}, util) for s in stages
            ]
        self._stage_models = stage_models
        last = layout.num_stages - 1
        self.stages = [
            LibaiPipelineStage(
                StageModule(m, self, s == last),
                s,
                layout.num_stages,
                util.device,
                group=util.pp_group,
            )
            for m, s in zip(stage_models, stages)
        ]
        self.is_first = 0 in stages
        self.is_last = layout.num_stages - 1 in stages

        def loss_fn(output, target):
            return self.model.pipeline_loss(output, target) * self._loss_scale

        if multi_stage:
            return schedule_cls(self.stages, self.num_microbatches, loss_fn=loss_fn)
        return schedule_cls(self.stages[0], self.num_microbatches, loss_fn=loss_fn)

    # ---- steps ------------------------------------------------------------------------------
    def forward_backward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Run forward and backward on this rank's share of the batch and sync gradients.

        Returns the mean loss over micro-batches and data-parallel ranks, detached, equal on
        every rank.
        """
        terms: dict[str, torch.Tensor] = {}
        if self.pipeline:  # the schedule's loss: its terms stay on the last stage
            loss = self._pipeline_step(batch)
        else:
            loss, terms = self._local_step(self._context_share(batch))
        self.sync_gradients()
        # the loss and its terms in one reduction: [total, term_1, ...]
        reduced = self._reduce_loss(torch.stack([loss, *terms.values()]))
        self.last_loss_terms = dict(zip(terms, reduced[1:]))
        return reduced[0]

    def _local_step(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This rank's mean loss over the micro-batches and the mean of each term."""
        n, scale = self.num_microbatches, self._loss_scale
        reducer = self._overlapped_reducer()
        if n == 1:  # the common case pays for no split, scaling or accumulation
            with self.autocast():
                loss, terms = self._loss_and_terms(batch)
            if reducer is not None:
                reducer.arm()
            self._backward(loss if scale == 1.0 else loss * scale)
            return loss.detach().float(), {k: v.detach().float() for k, v in terms.items()}
        total = torch.zeros((), device=self.util.device)
        sums: dict[str, torch.Tensor] = {}
        for i, chunk in enumerate(split_batch(batch, n)):
            with self.autocast():
                loss, terms = self._loss_and_terms(chunk)
            if reducer is not None and i == n - 1:  # gradients are final in the last one
                reducer.arm()
            self._backward(loss * (scale / n))
            total += loss.detach().float() / n
            for key, value in terms.items():
                sums[key] = sums.get(key, 0) + value.detach().float() / n
        return total, sums

    def _context_share(self, batch):
        """This rank's share of ``batch`` under context parallel (the batch itself without)."""
        if self.util.cp_group is None:
            return batch
        return shard_batch(self.model, batch, self.util)

    def _overlapped_reducer(self):
        """The dp all-reduce overlapped with backward, when it applies (built on first use,
        after ZeRO has settled the parameters)."""
        if (
            not self.overlap_grad_reduce
            or self.util.grad_group is None
            or self.pipeline
            or self.grad_sharder is not None
        ):
            return None
        if self._grad_reducer is None:
            from libai.runtime.grad_overlap import OverlappedGradReducer

            self._grad_reducer = OverlappedGradReducer(
                list(self.model.parameters()),
                self.util.grad_group,
                self.util.grad_size,
            )
        return self._grad_reducer

    def _pipeline_step(self, batch) -> torch.Tensor:
        return self._run_schedule(self.schedule.step, batch)

    def _sync_stage_modes(self) -> None:
        """Give the stage copies of a multi-stage (interleaved) rank the model's train / eval
        mode: ``model.eval()`` does not reach them, and dropout would stay on."""
        for stage_model in self._stage_models:
            if stage_model is not self.model:
                stage_model.train(self.model.training)

    def _schedule_arguments(self, batch) -> tuple[tuple, dict]:
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

    def _pad_to_pipeline_batch(self, batch) -> tuple[Mapping[str, torch.Tensor], int | None]:
        """``(batch, rows)``: a batch smaller than the one the pipeline stages were built for
        (an evaluation set's last batch) padded to that size with copies of its last row, and
        its real row count; ``(batch, None)`` when it already has the size."""
        size = _batch_rows(batch)
        full = self.pipeline_batch_size
        if full is None or size == full:
            return batch, None
        if size > full:
            raise ValueError(
                f"a batch of {size} rows reached pipeline stages built for {full} rows (the "
                "first batch they ran); evaluation batches may be smaller, never larger: set "
                "train.test_micro_batch_size to the training per-rank batch"
            )
        index = torch.arange(full).clamp(max=size - 1)
        padded = {
            k: v[index.to(v.device)] if isinstance(v, torch.Tensor) else v for k, v in batch.items()
        }
        return padded, size

    def _run_schedule(self, run, batch) -> torch.Tensor:
        """Drive ``run`` (the schedule's ``step`` or ``eval``) with this rank's stage inputs;
        returns the last stage's mean micro-batch loss, 0 on other stages."""
        check_sequence_parallel_batch(batch, self.util.layout)  # on every stage, before any send
        if self.pipeline_batch_size is None:
            self.pipeline_batch_size = _batch_rows(batch)
        self._sync_stage_modes()
        args, kwargs = self._schedule_arguments(batch)
        losses: list[torch.Tensor] = []
        if self.is_last:
            kwargs["losses"] = losses
        run(*args, **kwargs)
        if self.is_last:
            return torch.stack([loss.detach().float() for loss in losses]).mean() / self._loss_scale
        return torch.zeros((), device=self.util.device)

    @torch.no_grad()
    def eval_loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward only: this data-parallel rank's mean loss on ``batch`` (same on its tp and
        pp ranks). Under pp the batch is split into the training micro-batch count; a batch
        smaller than the training one (an evaluation set's last) is padded to its size and
        the loss is taken over the real rows only."""
        if not self.pipeline:
            with self.autocast():
                loss = self._loss(self._context_share(batch)).float()
            if self.util.cp_group is not None:  # each cp rank holds its share of the mean
                torch_dist.all_reduce(loss, group=self.util.cp_group)
                loss /= self.util.context_parallel_size
            return loss
        if self.pipeline_batch_size not in (None, _batch_rows(batch)):
            out = self.predict(batch)  # pads, and cuts the outputs back to the real rows
            loss = torch.zeros((), device=self.util.device)
            if out is not None:
                loss = self.model.pipeline_loss(out, pipeline_target(self.model, batch)).float()
            torch_dist.all_reduce(loss, group=self.util.pp_group)  # from the last stage to all
            return loss
        loss = self._run_schedule(self.schedule.eval, batch)
        torch_dist.all_reduce(loss, group=self.util.pp_group)  # from the last stage to all
        return loss

    @torch.no_grad()
    def predict(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """Forward only: the last stage's ``pipeline_forward`` output for ``batch`` (e.g.
        vocab-split logits); ``None`` on the ranks of other stages. Without pp it is
        ``model.pipeline_forward(*inputs)`` on every rank (under ZeRO-3 inside FSDP2's root
        hooks, which gather the parameters outside the blocks). Under pp a batch smaller than
        the training one is padded to its size and the output cut back to the real rows."""
        if self.util.cp_group is not None:
            raise ValueError(
                "predicting outputs (an evaluator's logits) under context parallel is not "
                "supported yet: evaluate by loss, or with train.dist.context_parallel_size=1"
            )
        if not self.pipeline:
            forward = fsdp_forward_method(self.model, "pipeline_forward")
            with self.autocast():
                return forward(
                    *pipeline_inputs(self.model, batch), **pipeline_stage_kwargs(self.model, batch)
                )
        check_sequence_parallel_batch(batch, self.util.layout)
        if self.pipeline_batch_size is None:
            self.pipeline_batch_size = _batch_rows(batch)
        batch, rows = self._pad_to_pipeline_batch(batch)
        self._sync_stage_modes()
        args, kwargs = self._schedule_arguments(batch)
        if self.is_last:
            kwargs["losses"] = []
        out = self.schedule.eval(*args, **kwargs)
        if not self.is_last:
            return None
        return out if rows is None else _first_rows(out, rows)

    def sync_gradients(self) -> None:
        """Sum tied-weight grads between first and last stage; average grads over dp (dp x cp
        under context parallel: every rank that holds the same parameters); then sum the
        grads of sequence-parallel parameters over tp (after dp: the overlapped and ZeRO
        reducers write their results into the grads)."""
        if self.util.embedding_group is not None:
            for p in self.tied_parameters:
                if p.grad is not None:
                    torch_dist.all_reduce(_local(p.grad), group=self.util.embedding_group)
        if self.util.grad_group is not None and self.grad_sharder is not None:
            self.grad_sharder.reduce_gradients()
        elif self._grad_reducer is not None and self._grad_reducer.armed:
            self._grad_reducer.finish()  # launched during backward
        elif self.util.grad_group is not None:
            grads = [_local(p.grad) for p in self.model.parameters() if p.grad is not None]
            for bucket in bucket_tensors(grads):
                flat = _flatten_dense_tensors(bucket)
                torch_dist.all_reduce(flat, group=self.util.grad_group)
                flat /= self.util.grad_size
                for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    g.copy_(synced)
        all_reduce_sequence_parallel_grads(
            self.model, self.sequence_parallel_names, self.util.tp_group
        )

    def _reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if self.util.pp_group is not None:  # only the last stage has it; others hold 0
            torch_dist.all_reduce(loss, group=self.util.pp_group)
        if self.util.grad_group is not None:  # dp (x cp): each rank's share of the mean
            torch_dist.all_reduce(loss, group=self.util.grad_group)
            loss /= self.util.grad_size
        return loss

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, params=None) -> torch.Tensor:
        """Clip by the global gradient norm of the whole (unsharded) model; returns the norm.
        ``params``: the tensors holding the gradients (default the model's parameters; the
        fp32 masters under mixed precision O2)."""
        return clip_grad_norm_(
            self.model.parameters() if params is None else params,
            max_norm,
            norm_type,
            dp_sharded=self.grad_sharder is not None,
            shard_group=getattr(self.grad_sharder, "norm_group", None),
            util=self.util,
        )

    def train_step(
        self,
        batch: Mapping[str, torch.Tensor],
        optimizer,
        *,
        max_grad_norm: float | None = None,
        norm_type: float = 2.0,
    ) -> float:
        """Forward, backward, gradient sync, then :meth:`optimizer_step`. Returns the loss."""
        loss = self.forward_backward(batch)
        self.optimizer_step(optimizer, max_grad_norm=max_grad_norm, norm_type=norm_type)
        return float(loss)

    def optimizer_step(
        self, optimizer, *, max_grad_norm: float | None = None, norm_type: float = 2.0
    ) -> bool:
        """After the gradients are synced: clipping, ``optimizer.step()``, zero grads.

        With an fp16 loss scaler, a step whose gradients overflow on any rank is skipped on
        every rank (``last_step_skipped`` tells the caller not to advance the LR schedule).
        Returns whether the optimizer stepped.
        """
        self.last_step_skipped = False
        params = list(self.model.parameters())
        if self.master_weights is not None:  # O2: fp32 grads on the masters from here on
            self.master_weights.grads_to_master()
            params = self.master_weights.optimizer_parameters()
        if self.loss_scaler is not None:
            found_inf = self.loss_scaler.unscale_(params)
            self.loss_scaler.update(found_inf)
            if found_inf:
                self.last_step_skipped = True
                optimizer.zero_grad(set_to_none=True)
                return False
        if max_grad_norm is not None and max_grad_norm > 0:
            # a tensor: read back only when it is logged (no host sync in the step)
            self.last_grad_norm = self.clip_grad_norm_(max_grad_norm, norm_type, params)
        optimizer.step()  # under O2 it ends by rounding the masters into the parameters
        optimizer.zero_grad(set_to_none=True)
        return True

    def backward(self, loss: torch.Tensor, num_microbatches: int = 1) -> None:
        """Backward of one micro-batch's loss as the runner does it: times the fp16 loss
        scale, divided by ``num_microbatches``, through ``backward_fn`` if one was given.
        (For a loop of your own; call :meth:`sync_gradients` before the optimizer step.)"""
        scale = self._loss_scale / num_microbatches
        self._backward(loss if scale == 1.0 else loss * scale)


def pipeline_inputs(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple:
    """The first stage's positional inputs: ``model.pipeline_inputs(batch)`` if the model
    defines it (several tensors, e.g. ids and a padding mask), else
    ``(batch[model.pipeline_input_key],)``."""
    if isinstance(model, PipelineInputs):
        return tuple(model.pipeline_inputs(batch))
    return (batch[model.pipeline_input_key],)


def pipeline_stage_kwargs(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> dict:
    """The keyword inputs of every stage's ``pipeline_forward``: ``model.pipeline_stage_kwargs(
    batch)`` if the model defines it, else none.

    They are the per-sample tensors every stage needs that are not activations: padding
    masks, token type ids. Each stage takes them from its own copy of the batch (split into
    the same micro-batches as the inputs), so nothing but activations is sent between
    stages. Integer tensors cannot be sent on every supported release (before torch 2.13,
    ``torch.distributed.pipelining`` marks each received tensor as requiring grad, which
    only floating-point tensors can), and not sending them saves their bytes on every
    micro-batch. ``None`` values are dropped."""
    if not isinstance(model, PipelineStageInputs):
        return {}
    return {k: v for k, v in model.pipeline_stage_kwargs(batch).items() if v is not None}


def pipeline_target(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The last stage's target: ``model.pipeline_target(batch)`` (one tensor; models with
    several targets pack them) if defined, else ``batch[model.pipeline_target_key]``."""
    if isinstance(model, PipelineTarget):
        return model.pipeline_target(batch)
    return batch[model.pipeline_target_key]


def train_step(runner: ModelRunner, batch: Mapping[str, torch.Tensor], optimizer) -> float:
    """One training step of ``runner``'s model on its mesh; returns the mean loss."""
    return runner.train_step(batch, optimizer)
