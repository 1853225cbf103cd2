"""PaddleFleetX's learning-rate schedules (``ppfleetx/optims/lr_scheduler.py``) on torch.

Closed forms of the optimizer-step counter ``t`` (``last_epoch``, 0 at the first step), so
``state_dict`` / ``load_state_dict`` resume exactly. They differ from LiBai's warmup
schedulers in details a FleetX user's numbers depend on: the cosine schedule's warmup is
``warmup_rate × decay_steps`` steps *unrounded* and reaches ``max_lr`` at its end (inclusive),
and the linear schedule decays as ``1 - t / total_steps`` over the whole run, not from the
end of warmup.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["CosineAnnealingWithWarmupDecay", "LinearDecayWithWarmup"]


class CosineAnnealingWithWarmupDecay(LRScheduler):
    """``max_lr × t / w`` while ``t <= w`` (``w = warmup_rate × decay_steps``, if > 0); then
    ``min_lr + (max_lr - min_lr) × (1 + cos(π (t - w) / (decay_steps - w))) / 2`` up to
    ``decay_steps``; ``min_lr`` after it. ``t`` is the step count times ``increment`` (1, or
    the global batch size for FleetX's ``use_increments``: ``t`` then counts samples)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float,
        min_lr: float,
        warmup_rate: float,
        decay_steps: int,
        last_epoch: int = -1,
        increment: int = 1,
    ):
        if int(decay_steps) < 1:
            raise ValueError(f"decay_steps must be a positive integer, got {decay_steps!r}")
        if int(increment) < 1:
            raise ValueError(f"increment must be a positive integer, got {increment!r}")
        #: how far one optimizer step advances the schedule (FleetX's use_increments: the
        #: global batch size, so decay_steps and the warmup count samples)
        self.increment = int(increment)
        if not 0 <= float(warmup_rate) < 1:
            raise ValueError(f"warmup_rate must be in [0, 1), got {warmup_rate!r}")
        self.max_lr, self.min_lr = float(max_lr), float(min_lr)
        self.decay_steps = int(decay_steps)
        self.warmup_steps = float(warmup_rate) * self.decay_steps
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", self.max_lr)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t: int) -> float:
        if self.warmup_steps > 0 and t <= self.warmup_steps:
            return self.max_lr * t / self.warmup_steps
        if t > self.decay_steps:
            return self.min_lr
        ratio = (t - self.warmup_steps) / (self.decay_steps - self.warmup_steps)
        return self.min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (self.max_lr - self.min_lr)

    def get_lr(self) -> list[float]:
        return [self.lr_at(self.last_epoch * self.increment)] * len(self.optimizer.param_groups)

    _get_closed_form_lr = get_lr


class LinearDecayWithWarmup(LRScheduler):
    """``lr × t / max(1, w)`` while ``t < w``, then ``lr × max(0, 1 - t / total_steps)``;
    ``warmup`` is ``w`` steps (an int) or a fraction of ``total_steps`` (floored)."""

    def __init__(
        self,
        optimizer: Optimizer,
        learning_rate: float,
        total_steps: int,
        warmup: int | float = 0,
        last_epoch: int = -1,
    ):
        if int(total_steps) < 1:
            raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
        self.learning_rate, self.total_steps = float(learning_rate), int(total_steps)
        self.warmup_steps = (
            int(math.floor(warmup * self.total_steps)) if isinstance(warmup, float) else int(warmup)
        )
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", self.learning_rate)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t: int) -> float:
        if t < self.warmup_steps:
            return self.learning_rate * t / max(1, self.warmup_steps)
        return self.learning_rate * max(0.0, 1.0 - t / self.total_steps)

    def get_lr(self) -> list[float]:
        return [self.lr_at(self.last_epoch)] * len(self.optimizer.param_groups)

    _get_closed_form_lr = get_lr


class ViTLRScheduler(LRScheduler):
    """FleetX's ViT schedule over ``total_steps``: progress ``p = clip((t - w) / (total_steps
    - w), 0, 1)``; ``cosine``: ``lr × (1 + cos(π p)) / 2``, ``linear``: ``linear_end + (lr -
    linear_end) × (1 - p)``; times ``min(1, t / w)`` during the ``w = warmup_steps`` warmup
    (capped at ``total_steps - 1``)."""

    def __init__(
        self,
        optimizer: Optimizer,
        learning_rate: float,
        total_steps: int,
        decay_type: str = "cosine",
        linear_end: float = 1e-5,
        warmup_steps: int = 0,
        last_epoch: int = -1,
    ):
        if int(total_steps) < 1:
            raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
        if decay_type not in ("cosine", "linear"):
            raise ValueError(f"decay_type must be 'cosine' or 'linear', got {decay_type!r}")
        self.learning_rate, self.total_steps = float(learning_rate), int(total_steps)
        self.decay_type, self.linear_end = decay_type, float(linear_end)
        self.warmup_steps = min(int(warmup_steps), self.total_steps - 1)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", self.learning_rate)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, t: int) -> float:
        w = self.warmup_steps
        progress = min(1.0, max(0.0, (t - w) / float(self.total_steps - w)))
        if self.decay_type == "linear":
            lr = self.linear_end + (self.learning_rate - self.linear_end) * (1.0 - progress)
        else:
            lr = 0.5 * self.learning_rate * (1.0 + math.cos(math.pi * progress))
        return lr * min(1.0, t / w) if w else lr

    def get_lr(self) -> list[float]:
        return [self.lr_at(self.last_epoch)] * len(self.optimizer.param_groups)

    _get_closed_form_lr = get_lr


__all__ += ["ViTLRScheduler"]
