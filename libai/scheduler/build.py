"""Build the LR scheduler from ``cfg.train.scheduler`` (a ``LazyCall`` node)."""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

from libai.config import instantiate

__all__ = ["build_lr_scheduler"]


def build_lr_scheduler(
    scheduler_cfg: Any, optimizer: Optimizer, max_iter: int, warmup_iter: int = 0
):
    """Instantiate ``scheduler_cfg`` for ``optimizer``, filling ``max_iter`` / ``warmup_iter``.

    As in LiBai the trainer supplies these two (from :func:`libai.config.resolve_train_iters`);
    ``scheduler_cfg`` itself is not modified.
    """
    return instantiate(
        scheduler_cfg, optimizer=optimizer, max_iter=int(max_iter), warmup_iter=int(warmup_iter)
    )
