"""Run a libai model on the mesh it was built on: one training step, evaluation, prediction.

Its layers already hold their tensor-parallel shards; what crosses layers comes from one
module each, applied by the constructor in :mod:`libai.runtime.parallelize`'s order: the
pipeline split and schedule (:mod:`~libai.runtime.pipeline_schedule`), activation
checkpointing and compile (:mod:`~libai.runtime.blocks`), the gradient reductions
(:mod:`~libai.runtime.grad_sync`); context parallel shards each batch
(:mod:`~libai.runtime.context_parallel`). The runner itself only steps: forward and
backward (or the schedule), the fp16 loss scale, clipping, the optimizer step. Usage::

    runner = ModelRunner(model, num_microbatches=4)       # prunes ``model`` to this rank
    optimizer = torch.optim.AdamW(runner.model.parameters())
    loss = runner.train_step(batch, optimizer)           # same float on every rank
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch
from torch import nn

from libai import dist
from libai.layers.moe import (
    aux_loss_grad_scale,
    check_expert_parallel_support,
    update_expert_biases,
)
from libai.models.contract import loss_terms, total_loss
from libai.runtime import forward_only
from libai.runtime.amp import DynamicLossScaler, autocast
from libai.runtime.blocks import apply_block_switches
from libai.runtime.context_parallel import check_context_parallel_support, shard_batch
from libai.runtime.grad_sync import GradientSync
from libai.runtime.pipeline_schedule import PipelineSchedule
from libai.runtime.pipeline_split import (  # noqa: F401  (their old home, kept for imports)
    pipeline_inputs,
    pipeline_stage_kwargs,
    pipeline_target,
    prune_to_stages,
)
from libai.runtime.pipeline_stages import PIPELINE_SCHEDULES  # noqa: F401  (old home)
from libai.runtime.sequence_parallel import check_sequence_parallel_support
from libai.utils.batches import split_batch


class ModelRunner:
    """Forward, backward and gradient synchronization of ``model`` on the mesh it was built on
    (:func:`libai.dist.mesh_of`; the current mesh for a model without libai layers).

    Args:
        model: a libai model built after :func:`libai.dist.setup_dist_util`. With pipeline
            parallelism it is pruned in place to this rank's stages and must follow the
            pipeline contract (:mod:`libai.models.contract`; see
            :mod:`libai.runtime.pipeline_split` for how a batch feeds the stages).
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
        check_expert_parallel_support(model, layout)
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
        self.last_step_skipped, self.last_grad_norm = False, None
        #: the last step's loss terms (the output's "loss" entries), reduced like the loss;
        #: empty under pipeline parallelism and for a ``loss_fn`` returning a tensor
        self.last_loss_terms: dict[str, torch.Tensor] = {}
        #: mixed precision O2 (libai.runtime.master_weights): set by parallelize
        self.master_weights = None
        self.schedule_name = schedule or layout.pipeline_schedule
        self.pipeline = layout.pipeline_parallel_size > 1
        if self.pipeline and (loss_fn is not None or backward_fn is not None):
            raise ValueError(
                "pipeline parallel computes the loss with the model's pipeline_loss on the last "
                "stage and runs backward in its schedule: a custom loss_fn / backward_fn cannot "
                "be split over stages"
            )
        # parallelize's order: pipeline split, checkpointing + compile, gradient reductions
        self.stage_schedule = None
        if self.pipeline:
            self.stage_schedule = PipelineSchedule(
                model, util, num_microbatches=num_microbatches, schedule_name=self.schedule_name,
                host=self, loss_scale=lambda: self._loss_scale,
            )  # fmt: skip
        apply_block_switches(
            self.local_models,
            checkpointing=activation_checkpointing,
            compile=compile,
            no_recompute_layers=no_recompute_layers,
        )
        self.grads = GradientSync(model, util, overlap=overlap_grad_reduce, pipeline=self.pipeline)

    @property
    def local_models(self) -> list[nn.Module]:
        """The modules this rank runs: the model (pruned to its stages) and, with several
        local pipeline stages, each stage's copy."""
        copies = self.stage_schedule.stage_models if self.stage_schedule else []
        return [self.model, *(m for m in copies if m is not self.model)]

    @property
    def is_last(self) -> bool:
        """Whether this rank computes the loss (the last pipeline stage; every rank without)."""
        return self.stage_schedule is None or self.stage_schedule.is_last

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
        """The loss of one (micro-)batch (``loss_fn(batch)`` or ``model(**batch)``'s) and its
        terms (the output's "loss" entries; none when ``loss_fn`` returns a tensor)."""
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

    # ---- steps ------------------------------------------------------------------------------
    def forward_backward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Run forward and backward on this rank's share of the batch and sync gradients.

        Returns the mean loss over micro-batches and data-parallel ranks, detached, equal on
        every rank.
        """
        terms: dict[str, torch.Tensor] = {}
        if self.pipeline:  # the schedule's loss: its terms stay on the last stage
            # (the schedule divides the gradients by the micro-batches after backward)
            with aux_loss_grad_scale(self._loss_scale):
                loss = self.stage_schedule.step(self._context_share(batch))
        else:
            loss, terms = self._local_step(self._context_share(batch))
        self.sync_gradients()
        # the loss and its terms in one reduction: [total, term_1, ...]
        reduced = self.grads.reduce_loss(torch.stack([loss, *terms.values()]))
        self.last_loss_terms = dict(zip(terms, reduced[1:]))
        return reduced[0]

    def _local_step(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This rank's mean loss over the micro-batches and the mean of each term."""
        n, scale = self.num_microbatches, self._loss_scale
        reducer = self.grads.overlapped_reducer()
        if n == 1:  # the common case pays for no split, scaling or accumulation
            with self.autocast():
                loss, terms = self._loss_and_terms(batch)
            if reducer is not None:
                reducer.arm()
            with aux_loss_grad_scale(scale):
                self._backward(loss if scale == 1.0 else loss * scale)
            return loss.detach().float(), {k: v.detach().float() for k, v in terms.items()}
        total = torch.zeros((), device=self.util.device)
        sums: dict[str, torch.Tensor] = {}
        for i, chunk in enumerate(split_batch(batch, n)):
            with self.autocast():
                loss, terms = self._loss_and_terms(chunk)
            if reducer is not None and i == n - 1:  # gradients are final in the last one
                reducer.arm()
            with aux_loss_grad_scale(scale / n):
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

    def eval_loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Forward only: this dp rank's mean loss on ``batch`` (the same on its tp, cp and pp
        ranks; under pp a smaller last batch is padded and its real rows counted)."""
        return forward_only.eval_loss(self, batch)

    def predict(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        """Forward only: the last stage's ``pipeline_forward`` output (e.g. vocab-split
        logits); ``None`` on other stages' ranks."""
        return forward_only.predict(self, batch)

    def sync_gradients(self) -> None:
        """The gradient reductions after backward (:class:`~libai.runtime.grad_sync.
        GradientSync`: tied weights, the dp (x cp) average, sequence-parallel sums)."""
        self.grads.sync()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, params=None) -> torch.Tensor:
        """Clip by the global gradient norm of the whole (unsharded) model; returns the norm
        (:meth:`~libai.runtime.grad_sync.GradientSync.clip_`)."""
        return self.grads.clip_(max_norm, norm_type, params)

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
        update_expert_biases(self.model)  # MoE routers' auxiliary-loss-free balancing
        return True

    def backward(self, loss: torch.Tensor, num_microbatches: int = 1) -> None:
        """Backward of one micro-batch's loss as the runner does it: times the fp16 loss
        scale, divided by ``num_microbatches``, through ``backward_fn`` if one was given.
        (For a loop of your own; call :meth:`sync_gradients` before the optimizer step.)"""
        scale = self._loss_scale / num_microbatches
        with aux_loss_grad_scale(scale):
            self._backward(loss if scale == 1.0 else loss * scale)


def train_step(runner: ModelRunner, batch: Mapping[str, torch.Tensor], optimizer) -> float:
    """One training step of ``runner``'s model on its mesh; returns the mean loss."""
    return runner.train_step(batch, optimizer)
