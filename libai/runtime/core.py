"""The execution core that every front door builds on.

A front door (``DefaultTrainer`` for LiBai's LazyConfigs, ``Engine`` for FleetX's task
modules and YAML) translates its configuration into LiBai's ``train`` namespace (the keys
of ``configs/common/train.py``) and then uses these builders, so the same settings give the
same runner, optimizer sharding, checkpoints, hooks and writers whichever door was used:

- :func:`build_runner`: mixed precision, loss scaler, ZeRO, activation checkpointing and
  compile applied to a model on the current mesh (a :class:`ModelRunner`);
- :func:`shard_optimizer_for`: the ZeRO wrapper around the optimizer;
- :func:`build_checkpointer`, :func:`build_writers`, :func:`build_hooks`: checkpoints,
  console / metrics.json / TensorBoard output, and the periodic hooks of the loop.

The loop itself is :class:`~libai.runtime.trainer.EagerTrainer`.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any, NamedTuple

import numpy as np
import torch

from libai.checkpoint.checkpointer import Checkpointer
from libai.config import try_get_key
from libai.runtime import hooks
from libai.runtime.amp import DynamicLossScaler, resolve_amp_dtype
from libai.runtime.parallel import ModelRunner
from libai.runtime.trainer import EagerTrainer
from libai.runtime.zero import prepare_model, resolve_zero_stage, shard_optimizer
from libai.utils import distributed as dist
from libai.utils.events import CommonMetricPrinter, JSONWriter, TensorboardXWriter

logger = logging.getLogger(__name__)

__all__ = [
    "RunnerParts",
    "build_checkpointer",
    "build_hooks",
    "build_runner",
    "build_training_loop",
    "build_writers",
    "position_loader",
    "seed_all",
    "seed_this_rank",
    "shard_optimizer_for",
]

#: fp16's initial loss scale when ``train.amp.init_scale`` is not set
DEFAULT_INIT_SCALE = 2.0**16


def resolve_compile(enabled, device_type: str) -> bool:
    """``graph.enabled``: ``None`` means compile on CUDA (where it pays) and not on CPU."""
    if enabled is None:
        return device_type == "cuda"
    return bool(enabled)


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


class RunnerParts(NamedTuple):
    runner: ModelRunner
    grad_scaler: DynamicLossScaler | None
    zero_stage: int | None


def build_runner(
    model: torch.nn.Module,
    train: Any,
    *,
    compile: bool = False,
    loss_fn=None,
    backward_fn=None,
    autocast_op_lists=None,
) -> RunnerParts:
    """A :class:`ModelRunner` for ``model`` with the switches of ``train`` (``cfg.train``):
    ``amp.{enabled, dtype, init_scale}``, ``num_accumulation_steps``,
    ``dist.pipeline_schedule``, ``activation_checkpoint.{enabled, mode}`` and
    ``zero_optimization`` (stage 3 shards the model here, before the optimizer exists).

    ``loss_fn`` / ``backward_fn`` / ``autocast_op_lists`` go to the runner (a task module's
    ``training_step`` and ``backward``, custom autocast op lists). Raises before any
    collective for a ZeRO stage or switch the layout cannot apply.
    """
    util = dist.get_dist_util()
    amp_dtype = resolve_amp_dtype(train.amp.dtype) if train.amp.enabled else None
    grad_scaler = None
    if amp_dtype == torch.float16:
        init_scale = try_get_key(train, "amp.init_scale", default=None) or DEFAULT_INIT_SCALE
        grad_scaler = DynamicLossScaler(init_scale=float(init_scale))
    zero_stage = resolve_zero_stage(train.zero_optimization, util.layout)  # may raise
    runner = ModelRunner(
        model,
        num_microbatches=train.num_accumulation_steps,
        schedule=try_get_key(train, "dist.pipeline_schedule"),
        amp_dtype=amp_dtype,
        loss_scaler=grad_scaler,
        activation_checkpointing=bool(train.activation_checkpoint.enabled)
        and (try_get_key(train, "activation_checkpoint.mode") or "full"),
        compile=bool(compile),
        loss_fn=loss_fn,
        backward_fn=backward_fn,
        autocast_op_lists=autocast_op_lists,
    )
    # ZeRO stage 3: fully_shard (before the optimizer), HSDP when hsdp_replicate_size > 1
    hsdp = try_get_key(train, "zero_optimization.hsdp_replicate_size", default=1) or 1
    prepare_model(runner, zero_stage, hsdp_replicate_size=hsdp)
    return RunnerParts(runner, grad_scaler, zero_stage)


def shard_optimizer_for(parts: RunnerParts, optimizer: torch.optim.Optimizer):
    """``optimizer`` wrapped for the runner's ZeRO stage (itself without ZeRO)."""
    if parts.zero_stage is None:
        return optimizer
    sharded = shard_optimizer(parts.runner, optimizer, parts.zero_stage)
    logger.info(
        "ZeRO stage %d over %d dp ranks",
        parts.zero_stage,
        parts.runner.util.layout.data_parallel_size,
    )
    return sharded


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


def build_hooks(train: Any, checkpointer: Checkpointer, writers: list, evaluate=None) -> list:
    """The periodic hooks of ``train`` (``cfg.train``), in order: step timer, LR schedule,
    checkpoints every ``checkpointer.period`` (keeping ``max_to_keep``), ``evaluate()`` every
    ``evaluation.eval_period`` with the best checkpoint by ``evaluation.eval_metric`` (when
    ``evaluate`` is given and ``evaluation.enabled``), and the writers every ``log_period``.
    """
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
        metric = try_get_key(evaluation, "eval_metric")
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


def build_training_loop(
    parts: RunnerParts,
    train: Any,
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
    """The training loop of a front door: :class:`EagerTrainer` with the clipping settings of
    ``optimizer``'s param groups, the loader positioned at ``consumed_train_samples``, and
    :func:`build_hooks` (``extra_hooks`` go after the LR hook, before saving)."""
    from libai.optim import get_clip_grad_settings

    max_grad_norm, norm_type = get_clip_grad_settings(optimizer) or (None, 2.0)
    trainer = EagerTrainer(
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
    trainer.max_iter = max_iter
    trainer.finite_check_period = max(int(train.log_period), 1)
    position_loader(trainer, consumed_train_samples, train.global_batch_size)
    writers = build_writers(train.output_dir, max_iter, tokens_per_iter)
    hooks = build_hooks(train, checkpointer, writers, evaluate)
    hooks[2:2] = list(extra_hooks)
    trainer.register_hooks(hooks)
    return trainer
