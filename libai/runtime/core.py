"""The execution core that every front door builds on.

A front door (``DefaultTrainer`` for LiBai's LazyConfigs, ``Engine`` for FleetX's task
modules and YAML, ``libai.accelerate`` for Rapidformer's flags) translates its configuration
into a :class:`~libai.runtime.spec.RunSpec` and hands its model to
:class:`~libai.runtime.run.Run`, which calls these builders in their one order, so the same
settings give the same runner, optimizer sharding, checkpoints, hooks and writers whichever
door was used (a LiBai ``train`` namespace is accepted too and read as its spec):

- :func:`~libai.runtime.parallelize.parallelize` (``build_runner``): the pipeline split,
  activation checkpointing, compile and ZeRO-3 applied in one fixed order, mixed precision
  and the loss scaler (a :class:`~libai.runtime.parallel.ModelRunner`);
- :func:`shard_optimizer_for`: the ZeRO-1/2 wrapper around the optimizer;
- :func:`build_checkpointer`, :func:`build_writers`, :func:`build_hooks`: checkpoints,
  console / metrics.json / TensorBoard output, and the periodic hooks of the loop.

The loop itself is :class:`~libai.runtime.trainer.EagerTrainer`.
"""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch

from libai.checkpoint.checkpointer import Checkpointer
from libai.runtime import hooks
from libai.runtime.parallelize import (
    RunnerParts,
    as_spec,
    build_runner,
    parallelize,
    shard_optimizer_for,
)
from libai.runtime.spec import RunSpec, resolve_compile
from libai.runtime.trainer import EagerTrainer
from libai.utils.events import CommonMetricPrinter, JSONWriter, TensorboardXWriter

logger = logging.getLogger(__name__)

__all__ = [
    "RunnerParts",
    "build_checkpointer",
    "build_hooks",
    "build_runner",
    "build_step",
    "build_training_loop",
    "parallelize",
    "build_writers",
    "as_spec",
    "position_loader",
    "resolve_compile",
    "seed_all",
    "seed_this_rank",
    "shard_optimizer_for",
]


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch (every device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_this_rank(seed: int, util) -> None:
    """After the model is built (from ``seed`` on every rank: the same weights on every
    layout): this rank's random streams for dropout and data, distinct per data-parallel and
    pipeline rank, shared by the tensor-parallel ranks of one shard."""
    seed_all(seed + 1000 * util.data_parallel_rank + util.pipeline_rank)


def build_checkpointer(
    model: torch.nn.Module, save_dir: str, optimizer, lr_scheduler=None, grad_scaler=None
) -> Checkpointer:
    """The sharded checkpointer of a run: model, optimizer, LR schedule and loss scaler."""
    checkpointables = {}
    if optimizer is not None:
        checkpointables["optimizer"] = optimizer
    if lr_scheduler is not None:
        checkpointables["lr_scheduler"] = lr_scheduler
    if grad_scaler is not None:
        checkpointables["grad_scaler"] = grad_scaler
    return Checkpointer(model, save_dir, **checkpointables)


def build_writers(output_dir: str, max_iter: int, tokens_per_iter: int | None = None) -> list:
    """Console progress with ETA, ``metrics.json`` (each logged step's own values) and
    TensorBoard under ``output_dir``."""
    return [
        CommonMetricPrinter(max_iter, tokens_per_iter=tokens_per_iter),
        # window 1: metrics.json holds each logged step's own loss (comparable across runs)
        JSONWriter(os.path.join(output_dir, "metrics.json"), window_size=1),
        TensorboardXWriter(os.path.join(output_dir, "tensorboard")),
    ]


def build_hooks(train: RunSpec, checkpointer: Checkpointer, writers: list, evaluate=None) -> list:
    """The periodic hooks of the run spec ``train``, in order: step timer, LR schedule,
    checkpoints every ``checkpointer.period`` (keeping ``max_to_keep``), ``evaluate()`` every
    ``evaluation.eval_period`` with the best checkpoint by ``evaluation.eval_metric`` (when
    ``evaluate`` is given and ``evaluation.enabled``), and the writers every ``log_period``.
    """
    train = as_spec(train)
    hook_list = [
        hooks.IterationTimer(),
        hooks.LRScheduler(),
        hooks.PeriodicCheckpointer(
            checkpointer, train.checkpointer.period, train.checkpointer.max_to_keep
        ),
    ]
    evaluation = train.evaluation
    if evaluate is not None and evaluation.enabled:
        hook_list.append(hooks.EvalHook(evaluation.eval_period, evaluate))
        metric = evaluation.eval_metric
        if metric:
            hook_list.append(
                hooks.BestCheckpointer(
                    evaluation.eval_period,
                    checkpointer,
                    str(metric).lower(),
                    evaluation.eval_mode,
                )
            )
    hook_list.append(hooks.PeriodicWriter(writers, train.log_period))
    return hook_list


def position_loader(trainer: EagerTrainer, consumed: int, global_batch_size: int) -> None:
    """Start ``trainer``'s loader after ``consumed`` samples (a resumed run): a resumable
    sampler is set there; any other loader is read forward and the batches dropped."""
    sampler = getattr(trainer.data_loader, "batch_sampler", None)
    if hasattr(sampler, "set_consumed_samples"):
        sampler.set_consumed_samples(consumed)
        return
    skip = consumed // global_batch_size
    if skip:
        logger.warning("resuming a loader without a resumable sampler: skipping %d batches", skip)
        data = iter(trainer.data_loader)
        for _ in range(skip):
            next(data)
        trainer.set_data_iter(data)


def build_step(
    parts: RunnerParts,
    train: RunSpec,
    data_loader,
    optimizer,
    lr_scheduler,
    *,
    consumed_train_samples: int = 0,
    batch_transform=None,
) -> EagerTrainer:
    """The runtime's step (:class:`EagerTrainer`) of a door: clipping from ``optimizer``'s
    param groups, the global batch, the data position and the finiteness check every
    ``log_period`` steps. :func:`build_training_loop` adds the hooks; LiBai's trainer holds
    it and is the hook loop itself."""
    from libai.optim import get_clip_grad_settings

    train = as_spec(train)
    max_grad_norm, norm_type = get_clip_grad_settings(optimizer) or (None, 2.0)
    step = EagerTrainer(
        parts.runner,
        data_loader,
        optimizer,
        max_grad_norm=max_grad_norm,
        norm_type=norm_type,
        lr_scheduler=lr_scheduler,
        global_batch_size=train.global_batch_size,
        consumed_train_samples=consumed_train_samples,
        batch_transform=batch_transform,
    )
    step.finite_check_period = max(int(train.log_period), 1)
    return step


def build_training_loop(
    parts: RunnerParts,
    train: RunSpec,
    data_loader,
    optimizer,
    lr_scheduler,
    checkpointer: Checkpointer,
    *,
    max_iter: int,
    evaluate=None,
    consumed_train_samples: int = 0,
    batch_transform=None,
    extra_hooks=(),
    tokens_per_iter: int | None = None,
) -> EagerTrainer:
    """The training loop of a front door: :func:`build_step`, the loader positioned at
    ``consumed_train_samples``, and :func:`build_hooks` (``extra_hooks`` go after the LR hook,
    before saving)."""
    train = as_spec(train)
    trainer = build_step(
        parts,
        train,
        data_loader,
        optimizer,
        lr_scheduler,
        consumed_train_samples=consumed_train_samples,
        batch_transform=batch_transform,
    )
    trainer.max_iter = max_iter
    position_loader(trainer, consumed_train_samples, train.global_batch_size)
    writers = build_writers(train.output_dir, max_iter, tokens_per_iter)
    hooks = build_hooks(train, checkpointer, writers, evaluate)
    hooks[2:2] = list(extra_hooks)
    trainer.register_hooks(hooks)
    return trainer
