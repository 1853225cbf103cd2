"""OneFlow's learning-rate schedulers that torch lacks, for LiBai project code.

``flow.optim.lr_scheduler.WarmupLR`` (also spelled ``WarmUpLR``) wraps an optimizer or
another scheduler: for ``t < warmup_iters`` the LR is ``base_lr * f(t)``, where ``f`` is
``warmup_factor`` ("constant") or rises linearly from ``warmup_factor`` at ``t = 0`` to the
wrapped scheduler's factor at ``t = warmup_iters`` ("linear"; to 1 with ``warmup_prefix``
or without a wrapped scheduler); afterwards the wrapped scheduler's LR at ``t`` (at
``t - warmup_iters`` with ``warmup_prefix``). The wrapped scheduler is read in closed form
at each step, never stepped itself.
"""

from __future__ import annotations

import warnings

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["WarmupLR"]


class WarmupLR(LRScheduler):
    """OneFlow's ``WarmupLR`` on torch (module doc)."""

    def __init__(
        self,
        scheduler_or_optimizer,
        warmup_factor: float = 1.0 / 3,
        warmup_iters: int = 5,
        warmup_method: str = "linear",
        warmup_prefix: bool = False,
        last_step: int = -1,
        verbose: bool = False,
    ):
        if isinstance(scheduler_or_optimizer, LRScheduler):
            inner, optimizer = scheduler_or_optimizer, scheduler_or_optimizer.optimizer
        elif isinstance(scheduler_or_optimizer, Optimizer):
            inner, optimizer = None, scheduler_or_optimizer
        else:
            raise ValueError(
                "WarmupLR's scheduler_or_optimizer must be an LR scheduler or an optimizer, "
                f"got {type(scheduler_or_optimizer).__name__}"
            )
        if warmup_method not in ("linear", "constant"):
            raise ValueError(
                f"WarmupLR's warmup_method must be 'linear' or 'constant', got {warmup_method!r}"
            )
        if inner is None and warmup_iters == 0:
            raise ValueError("WarmupLR of an optimizer needs warmup_iters > 0")
        self.inner = inner
        self.warmup_factor, self.warmup_iters = float(warmup_factor), int(warmup_iters)
        self.warmup_method, self.warmup_prefix = warmup_method, bool(warmup_prefix)
        super().__init__(optimizer, last_epoch=last_step)

    def _inner_lrs(self, step: int) -> list[float]:
        """The wrapped scheduler's LRs at ``step`` (its closed form; the base LRs without
        one)."""
        if self.inner is None:
            return list(self.base_lrs)
        saved = self.inner.last_epoch
        self.inner.last_epoch = step
        try:
            closed = getattr(self.inner, "_get_closed_form_lr", None)
            if closed is not None:
                return list(closed())
            with warnings.catch_warnings():  # (torch's hint to call get_last_lr instead)
                warnings.simplefilter("ignore", UserWarning)
                return list(self.inner.get_lr())
        finally:
            self.inner.last_epoch = saved

    def get_lr(self) -> list[float]:
        t = self.last_epoch
        if t < self.warmup_iters:
            if self.warmup_method == "constant":
                return [base * self.warmup_factor for base in self.base_lrs]
            if self.inner is not None and not self.warmup_prefix:
                ends = [
                    lr / base for lr, base in zip(self._inner_lrs(self.warmup_iters), self.base_lrs)
                ]
            else:
                ends = [1.0] * len(self.base_lrs)
            progress = t / self.warmup_iters
            return [
                base * (self.warmup_factor + (end - self.warmup_factor) * progress)
                for base, end in zip(self.base_lrs, ends)
            ]
        return self._inner_lrs(t - self.warmup_iters if self.warmup_prefix else t)

    _get_closed_form_lr = get_lr

    def state_dict(self) -> dict:
        """Plain data only (the wrapped scheduler as its own state dict)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "inner")}
        state["inner"] = None if self.inner is None else self.inner.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        inner = state.pop("inner", None)
        self.__dict__.update(state)
        if inner is not None and self.inner is not None:
            self.inner.load_state_dict(inner)
