"""LiBai's warmup learning-rate schedulers on ``torch.optim.lr_scheduler.LRScheduler``.

Every scheduler is stepped once per iteration and computes the LR in closed form from the
iteration counter (``last_epoch``), so ``state_dict`` / ``load_state_dict`` resume a run
exactly. The LR at iteration ``t`` is ``base_lr × warmup(t) × decay(t)``:

- ``warmup(t)`` for ``t < warmup_iter``: ``"linear"`` rises from ``warmup_factor`` to 1,
  ``"constant"`` stays at ``warmup_factor``; afterwards 1.
- ``decay(t)``: continuous decays (cosine, linear, polynomial, exponential) start when warmup
  ends, so the LR at ``t = warmup_iter`` is ``base_lr``, and reach their final value at
  ``t = max_iter`` (held afterwards, except cosine annealing, which is periodic as in
  torch). Step decays (step, multistep) count absolute iterations, so ``milestones`` are the
  iteration numbers at which the LR drops, as in detectron2 and torch.
"""

from __future__ import annotations

import bisect
import logging
import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = [
    "WarmupCosineAnnealingLR",
    "WarmupCosineLR",
    "WarmupExponentialLR",
    "WarmupLinearLR",
    "WarmupMultiStepLR",
    "WarmupPolynomialLR",
    "WarmupStepLR",
]

logger = logging.getLogger(__name__)

WARMUP_METHODS = ("linear", "constant")


class _WarmupScheduler(LRScheduler):
    """Base class: warmup multiplier times a subclass's ``decay_factor(t)``."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        warmup_factor: float,
        warmup_iter: int,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        if warmup_method not in WARMUP_METHODS:
            raise ValueError(
                f"warmup_method must be one of {WARMUP_METHODS}, got {warmup_method!r}"
            )
        if int(max_iter) < 1:
            raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
        if int(warmup_iter) < 0:
            raise ValueError(f"warmup_iter must be >= 0, got {warmup_iter!r}")
        if int(warmup_iter) > int(max_iter):
            logger.warning("warmup_iter=%s is larger than max_iter=%s", warmup_iter, max_iter)
        self.max_iter = int(max_iter)
        self.warmup_factor = float(warmup_factor)
        self.warmup_iter = int(warmup_iter)
        self.warmup_method = warmup_method
        super().__init__(optimizer, last_epoch)

    def warmup_multiplier(self, t: int) -> float:
        if t >= self.warmup_iter:
            return 1.0
        if self.warmup_method == "constant":
            return self.warmup_factor
        progress = t / self.warmup_iter
        return self.warmup_factor * (1.0 - progress) + progress

    def decay_progress(self, t: int) -> float:
        """Fraction in ``[0, 1]`` of the post-warmup decay done at iteration ``t``."""
        span = max(1, self.max_iter - self.warmup_iter)
        return min(1.0, max(0.0, (t - self.warmup_iter) / span))

    def decay_factor(self, t: int) -> float:
        """LR at iteration ``t`` divided by the base LR, warmup aside."""
        raise NotImplementedError

    def lr_at(self, t: int) -> list[float]:
        """The LR of every param group at iteration ``t`` (does not change any state)."""
        mult = self.warmup_multiplier(t)
        return [self._group_lr(base, t) * mult for base in self.base_lrs]

    def _group_lr(self, base_lr: float, t: int) -> float:
        return base_lr * self.decay_factor(t)

    def get_lr(self) -> list[float]:
        return self.lr_at(self.last_epoch)

    def _get_closed_form_lr(self) -> list[float]:
        return self.lr_at(self.last_epoch)


class WarmupCosineLR(_WarmupScheduler):
    """Cosine decay from ``base_lr`` to ``alpha × base_lr`` over the iterations after warmup
    (OneFlow's ``CosineDecayLR`` behind a warmup, as LiBai)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        warmup_factor: float,
        warmup_iter: int,
        alpha: float = 0.0,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        self.alpha = float(alpha)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_factor(self, t: int) -> float:
        cosine = 0.5 * (1.0 + math.cos(math.pi * self.decay_progress(t)))
        return (1.0 - self.alpha) * cosine + self.alpha


class WarmupCosineAnnealingLR(_WarmupScheduler):
    """Cosine annealing from ``base_lr`` to the absolute LR ``eta_min`` at ``max_iter``;
    periodic beyond it like torch's ``CosineAnnealingLR``."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        warmup_factor: float,
        warmup_iter: int,
        eta_min: float = 0.0,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        self.eta_min = float(eta_min)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def _group_lr(self, base_lr: float, t: int) -> float:
        span = max(1, self.max_iter - self.warmup_iter)
        phase = max(0, t - self.warmup_iter) / span
        return self.eta_min + (base_lr - self.eta_min) * 0.5 * (1.0 + math.cos(math.pi * phase))


class WarmupLinearLR(_WarmupScheduler):
    """Linear decay from ``base_lr`` to ``end_factor × base_lr`` at ``max_iter`` (ours; the
    schedule of Hugging Face's ``get_linear_schedule_with_warmup`` when ``end_factor=0``)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        warmup_factor: float,
        warmup_iter: int,
        end_factor: float = 0.0,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        self.end_factor = float(end_factor)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_factor(self, t: int) -> float:
        return 1.0 - (1.0 - self.end_factor) * self.decay_progress(t)


class WarmupStepLR(_WarmupScheduler):
    """Multiply the LR by ``gamma`` every ``step_size`` iterations (absolute iterations)."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        warmup_factor: float,
        warmup_iter: int,
        step_size: int,
        gamma: float = 0.1,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        if int(step_size) < 1:
            raise ValueError(f"step_size must be a positive integer, got {step_size!r}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_factor(self, t: int) -> float:
        return self.gamma ** (max(0, t) // self.step_size)


class WarmupMultiStepLR(_WarmupScheduler):
    """Multiply the LR by ``gamma`` at each iteration number in ``milestones``."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        warmup_factor: float,
        warmup_iter: int,
        milestones: list[int],
        gamma: float = 0.1,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        milestones = [int(m) for m in milestones]
        if milestones != sorted(milestones):
            raise ValueError(f"milestones must be increasing, got {milestones}")
        self.milestones, self.gamma = milestones, float(gamma)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_factor(self, t: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, t)


class WarmupPolynomialLR(_WarmupScheduler):
    """Polynomial decay from ``base_lr`` to the absolute LR ``end_learning_rate``.

    ``lr = (base_lr - end) × (1 - p)^power + end`` with ``p`` the post-warmup progress. With
    ``cycle=True`` the decay restarts, over a span that grows by multiples of the first one,
    instead of holding ``end_learning_rate`` after ``max_iter`` (OneFlow's ``PolynomialLR``).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        warmup_factor: float,
        warmup_iter: int,
        end_learning_rate: float = 1e-4,
        power: float = 1.0,
        cycle: bool = False,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        self.end_learning_rate, self.power, self.cycle = float(end_learning_rate), power, cycle
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def _group_lr(self, base_lr: float, t: int) -> float:
        span = max(1, self.max_iter - self.warmup_iter)
        step = max(0, t - self.warmup_iter)
        if self.cycle:
            span = span * max(1, math.ceil(step / span))
        else:
            step = min(step, span)
        remaining = (1.0 - step / span) ** self.power
        return (base_lr - self.end_learning_rate) * remaining + self.end_learning_rate


class WarmupExponentialLR(_WarmupScheduler):
    """Multiply the LR by ``gamma`` every iteration after warmup."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_iter: int,
        gamma: float,
        warmup_factor: float,
        warmup_iter: int,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ):
        self.gamma = float(gamma)
        super().__init__(optimizer, max_iter, warmup_factor, warmup_iter, warmup_method, last_epoch)

    def decay_factor(self, t: int) -> float:
        return self.gamma ** max(0, t - self.warmup_iter)
