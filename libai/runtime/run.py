"""One training run on the core, built the same way whichever front door asked for it.

A door (LiBai's ``DefaultTrainer``, FleetX's ``Engine``, Rapidformer's ``libai.accelerate``)
translates its own configuration into a :class:`~libai.runtime.spec.RunSpec`, builds its
model and data, and hands them to :class:`Run` with two factories (its optimizer and its LR
schedule). :class:`Run` owns the sequence every door used to write itself:

0. the spec frozen, logged and written to ``output_dir/run_spec.yaml`` (rank 0): the
   settings this run was built from, as the runtime read them;
1. this rank's random streams (dropout, data) after the model was built on every rank;
2. :func:`~libai.runtime.parallelize.parallelize`: the transforms in their one order;
3. the optimizer from the door's factory, wrapped for ZeRO-1/2 and O2's fp32 masters
   (:func:`~libai.runtime.parallelize.shard_optimizer_for`), then the LR schedule over the
   wrapped optimizer;
4. the checkpointer of model, optimizer, schedule and loss scaler;
5. resume (:meth:`Run.load`, :meth:`Run.resume_or_load`): the point the run continues from;
6. the loop (:meth:`Run.step`, :meth:`Run.loop`: the runtime's step, the loader positioned
   at the resume point, the hooks and writers) and :meth:`Run.train`.

Evaluation is the runtime's own loop (:func:`libai.runtime.evaluate.evaluate`). A test
scans the doors and fails if one of them parallelizes, shards the optimizer, builds the
checkpointer or resumes by itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import torch

from libai import dist
from libai.runtime.core import (
    build_checkpointer,
    build_hooks,
    build_step,
    build_training_loop,
    build_writers,
    seed_this_rank,
)
from libai.runtime.parallelize import as_spec, parallelize, shard_optimizer_for
from libai.runtime.resume import ResumePoint, load_to_resume, resume_point
from libai.runtime.spec import RunSpec
from libai.runtime.trainer import EagerTrainer, TrainerBase

logger = logging.getLogger(__name__)

__all__ = ["Run"]

#: ``optimizer_fn(model)``: an optimizer over the parallelized model's parameters, or
#: ``(optimizer, lr_scheduler)`` when the door's module builds both
OptimizerFactory = Callable[[torch.nn.Module], object]


class Run:
    """A model parallelized with the run spec's switches, its optimizer, LR schedule,
    checkpointer, resume point and training loop (see the module doc for the order).

    Args:
        model: the model, built on its mesh with the same weights on every rank.
        spec: the resolved run spec (a LiBai ``train`` namespace is read as one).
        optimizer_fn: ``optimizer_fn(model)`` builds the optimizer over the parallelized
            model (ZeRO-3 has sharded its parameters by then), or returns
            ``(optimizer, lr_scheduler)``; ``None``: no optimizer (evaluation, export).
        lr_scheduler_fn: ``lr_scheduler_fn(optimizer)`` over the wrapped optimizer, when
            ``optimizer_fn`` gave none.
        compile, loss_fn, backward_fn, autocast_op_lists: as
            :func:`~libai.runtime.parallelize.parallelize` takes them.
        resume_hint: how a user of this door resumes (named when a fresh run finds the
            checkpoints of an earlier one in ``spec.output_dir``).
        length_key: the door's name for the run's length, named when a resumed run has
            nothing left to train.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        spec: RunSpec,
        *,
        optimizer_fn: OptimizerFactory | None = None,
        lr_scheduler_fn: Callable | None = None,
        compile: bool | str = False,
        loss_fn=None,
        backward_fn=None,
        autocast_op_lists=None,
        resume_hint: str | None = None,
        length_key: str = "train.train_iter",
    ):
        self.spec = as_spec(spec).freeze()
        self.length_key = length_key
        _show_spec(self.spec)
        # every rank built the same weights; dropout and data now differ per dp / pp rank
        seed_this_rank(self.spec.seed, dist.mesh_of(model))
        self.parts = parallelize(
            model,
            self.spec,
            compile=compile,
            loss_fn=loss_fn,
            backward_fn=backward_fn,
            autocast_op_lists=autocast_op_lists,
        )
        self.optimizer = self.lr_scheduler = None
        if optimizer_fn is not None:
            self.optimizer, self.lr_scheduler = self._build_optimizer(optimizer_fn, lr_scheduler_fn)
        self.checkpointer = build_checkpointer(
            self.runner.model,
            self.spec.output_dir,
            self.optimizer,
            self.lr_scheduler,
            self.grad_scaler,
        )
        if resume_hint:
            self.checkpointer.resume_hint = resume_hint
        self.start_iter = 0
        self.consumed_train_samples = int(self.spec.consumed_train_samples or 0)
        self._checked_output_dir = False

    runner = property(lambda self: self.parts.runner)
    grad_scaler = property(lambda self: self.parts.grad_scaler)
    zero_stage = property(lambda self: self.parts.zero_stage)

    def _build_optimizer(self, optimizer_fn, lr_scheduler_fn):
        built = optimizer_fn(self.runner.model)
        optimizer, scheduler = built if isinstance(built, (tuple, list)) else (built, None)
        # ZeRO wraps the optimizer before the LR schedule that holds it is built
        optimizer = shard_optimizer_for(self.parts, optimizer)
        if scheduler is None and lr_scheduler_fn is not None:
            scheduler = lr_scheduler_fn(optimizer)
        return optimizer, scheduler

    # ---- resume -------------------------------------------------------------------------------
    def load(self, path: str, *, resume: bool = True) -> ResumePoint | None:
        """Load ``path`` (a checkpoint, or a directory whose ``last_checkpoint`` names one):
        with ``resume`` (and an optimizer) everything it holds and the point the run
        continues from; otherwise the weights only (``None``). Any layout loads any other's."""
        point = load_to_resume(
            self.checkpointer, path, resume=resume and self.optimizer is not None
        )
        if point is not None:  # a resume continues in its own directory: nothing to warn of
            self._checked_output_dir = True
        return self._continue_at(point)

    def resume_or_load(self, load_weight: str | None, *, resume: bool = True):
        """LiBai's ``--resume``: the last checkpoint of ``spec.output_dir`` when ``resume`` and
        there is one, else the weights of ``load_weight`` (if given); a fresh start keeps and
        names the checkpoints it finds. Returns the resume point (``None``: from step 0)."""
        extra = self.checkpointer.resume_or_load(load_weight or None, resume=resume)
        self._checked_output_dir = True
        return self._continue_at(resume_point(extra) if resume else None)

    def _continue_at(self, point: ResumePoint | None) -> ResumePoint | None:
        if point is not None:
            self.start_iter, self.consumed_train_samples = point
        return point

    # ---- the loop -----------------------------------------------------------------------------
    def step(self, data_loader, *, batch_transform=None) -> EagerTrainer:
        """The runtime's step over ``data_loader`` (a loader already at the resume point;
        LiBai's trainer holds it and is the hook loop itself)."""
        return build_step(
            self.parts,
            self.spec,
            data_loader,
            self.optimizer,
            self.lr_scheduler,
            consumed_train_samples=self.consumed_train_samples,
            batch_transform=batch_transform,
        )

    def hooks(self, *, max_iter: int, evaluate=None, tokens_per_iter: int | None = None) -> list:
        """The periodic hooks of the spec with the writers under ``spec.output_dir``."""
        writers = build_writers(self.spec.output_dir, max_iter, tokens_per_iter)
        return build_hooks(self.spec, self.checkpointer, writers, evaluate)

    def loop(
        self,
        data_loader,
        *,
        max_iter: int,
        evaluate=None,
        batch_transform=None,
        extra_hooks: Sequence = (),
        tokens_per_iter: int | None = None,
    ) -> EagerTrainer:
        """The training loop over ``data_loader``, positioned at the resume point, with the
        hooks of the spec (``extra_hooks`` after the LR hook) and ``max_iter`` set."""
        return build_training_loop(
            self.parts,
            self.spec,
            data_loader,
            self.optimizer,
            self.lr_scheduler,
            self.checkpointer,
            max_iter=max_iter,
            evaluate=evaluate,
            consumed_train_samples=self.consumed_train_samples,
            batch_transform=batch_transform,
            extra_hooks=extra_hooks,
            tokens_per_iter=tokens_per_iter,
        )

    def train(self, loop: TrainerBase, max_iter: int) -> bool:
        """Run the hook loop ``loop`` (:meth:`TrainerBase.train`: a door's own ``train``
        override is not called again) from the resume point to ``max_iter``; False, with a log line naming the door's length key, when a resumed
        run has nothing left to train. A fresh start keeps the checkpoints it finds in
        ``spec.output_dir`` and names them."""
        if self.start_iter >= max_iter:
            logger.info(
                "Nothing left to train: the run in %s is at iteration %d of %s=%d; raise %s "
                "to train further",
                self.spec.output_dir,
                self.start_iter,
                self.length_key,
                max_iter,
                self.length_key,
            )
            return False
        if self.start_iter == 0 and not self._checked_output_dir:
            self.checkpointer.warn_about_existing_checkpoints()
            self._checked_output_dir = True
        TrainerBase.train(loop, self.start_iter, max_iter)
        self.start_iter, self.consumed_train_samples = loop.iter, loop.consumed_train_samples
        return True


#: the resolved spec of a run, beside the door's own config file in its output directory
SPEC_FILE = "run_spec.yaml"


def _show_spec(spec: RunSpec) -> None:
    """The frozen spec in the log and, on rank 0, in ``output_dir/run_spec.yaml``."""
    text = spec.to_yaml()
    if dist.get_rank() != 0:
        return
    path = None
    if spec.output_dir and os.path.isdir(spec.output_dir):
        path = os.path.join(spec.output_dir, SPEC_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    logger.info("Run spec, as resolved%s:\n%s", f" ({path})" if path else "", text.rstrip())
