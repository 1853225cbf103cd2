"""Hooks: everything periodic around the training loop (detectron2 / LiBai names)."""

from __future__ import annotations

import logging
import math
import re
import time

from libai import dist
from libai.checkpoint.checkpointer import PeriodicCheckpointer as _PeriodicCheckpointer
from libai.evaluation import flatten_results_dict
from libai.runtime.trainer import HookBase

logger = logging.getLogger(__name__)


def _periodic_before_end(trainer, period: int) -> bool:
    """Every ``period`` steps, except the last one (``after_train`` handles that)."""
    next_iter = trainer.iter + 1
    return period > 0 and next_iter % period == 0 and next_iter != trainer.max_iter


class IterationTimer(HookBase):
    """Puts the wall time of each step (hooks included) as ``time``."""

    def __init__(self, warmup_iter: int = 1):
        self._warmup_iter = warmup_iter
        self._step_start = None
        self._train_start = None

    def before_train(self):
        self._train_start = time.perf_counter()

    def before_step(self):
        self._step_start = time.perf_counter()

    def after_step(self):
        seconds = time.perf_counter() - self._step_start
        if self.trainer.iter - self.trainer.start_iter >= self._warmup_iter:
            self.trainer.storage.put_scalars(time=seconds)

    def after_train(self):
        total = time.perf_counter() - self._train_start
        steps = self.trainer.iter - self.trainer.start_iter
        if steps > 0:
            logger.info(
                "Overall training: %d steps in %.1f s (%.4f s / it)", steps, total, total / steps
            )


class LRScheduler(HookBase):
    """Records ``lr`` and advances the schedule, except on steps the fp16 scaler skipped."""

    def __init__(self, optimizer=None, scheduler=None):
        self._optimizer, self._scheduler = optimizer, scheduler

    @property
    def scheduler(self):
        return self._scheduler or self.trainer.lr_scheduler

    def after_step(self):
        optimizer = self._optimizer or self.trainer.optimizer
        self.trainer.storage.put_scalar("lr", optimizer.param_groups[0]["lr"], smoothing_hint=False)
        if not self.trainer.runner.last_step_skipped:
            self.scheduler.step()


class PeriodicCheckpointer(HookBase):
    """Saves ``model_{iter:07d}`` every ``period`` iterations and ``model_final`` at the end.

    The extra state saved alongside lets ``--resume`` continue exactly: iteration and the
    number of consumed samples (the data position).
    """

    def __init__(self, checkpointer, period: int, max_to_keep: int | None = None):
        self.checkpointer, self.period, self.max_to_keep = checkpointer, period, max_to_keep
        self._periodic = None

    def before_train(self):
        self._periodic = _PeriodicCheckpointer(
            self.checkpointer,
            self.period,
            max_iter=self.trainer.max_iter,
            max_to_keep=self.max_to_keep,
        )

    def after_step(self):
        extra = self.trainer.checkpoint_extra()
        self._periodic.step(extra.pop("iteration"), **extra)


class EvalHook(HookBase):
    """Runs ``eval_function()`` every ``eval_period`` iterations and after the last one.

    The returned flat dict of floats goes into the storage (e.g. ``ppl``), where writers and
    :class:`BestCheckpointer` see it.
    """

    def __init__(self, eval_period: int, eval_function):
        self._period, self._func = eval_period, eval_function

    def _do_eval(self):
        results = self._func()
        if results:
            flat = {}
            for key, value in flatten_results_dict(results).items():
                try:
                    flat[key] = float(value)
                except (TypeError, ValueError) as exc:
                    raise ValueError(
                        f"eval_function returned a non-number {key}={value!r}"
                    ) from exc
            self.trainer.storage.put_scalars(**flat, smoothing_hint=False)
        dist.synchronize()

    def after_step(self):
        if _periodic_before_end(self.trainer, self._period):
            self._do_eval()

    def after_train(self):
        if self.trainer.iter >= self.trainer.max_iter:
            self._do_eval()


_TEST_SET = re.compile(r"test(\d+)/(.+)")


class BestCheckpointer(HookBase):
    """Saves ``model_best`` whenever ``val_metric`` improves (``mode`` "min" or "max")."""

    def __init__(self, eval_period: int, checkpointer, val_metric: str, mode: str = "min"):
        if mode not in ("min", "max"):
            raise ValueError(f"BestCheckpointer mode must be 'min' or 'max', got {mode!r}")
        self._period, self.checkpointer, self._metric, self._mode = (
            eval_period,
            checkpointer,
            val_metric,
            mode,
        )
        self.best_value, self.best_iter = None, None

    def _better(self, value: float) -> bool:
        if self.best_value is None:
            return True
        return value < self.best_value if self._mode == "min" else value > self.best_value

    def _maybe_save(self):
        histories = self.trainer.storage.histories()
        history = histories.get(self._metric)
        if history is None:  # metric names match case-insensitively ("acc@1" names "Acc@1")
            wanted = self._metric.lower()
            history = next((h for k, h in histories.items() if k.lower() == wanted), None)
        if history is None:  # several test sets report test{i}/<metric>: the last set's, as
            # LiBai's test() keeps (its results of one dataset class overwrite the earlier)
            sets = {
                int(m[1]): h
                for k, h in histories.items()
                if (m := _TEST_SET.match(k.lower())) and m[2] == self._metric.lower()
            }
            history = sets[max(sets)] if sets else None
        if history is None or len(history) == 0:
            logger.warning("BestCheckpointer: metric %s not found; nothing saved", self._metric)
            return
        value, iteration = history.values()[-1]
        if not math.isfinite(value) or not self._better(value):
            return
        self.best_value, self.best_iter = value, int(iteration)
        self.checkpointer.save("model_best", **self.trainer.checkpoint_extra())
        logger.info("Saved model_best: %s = %.5g at iteration %d", self._metric, value, iteration)

    def after_step(self):
        if _periodic_before_end(self.trainer, self._period):
            self._maybe_save()

    def after_train(self):
        if self.trainer.iter >= self.trainer.max_iter:
            self._maybe_save()


class PeriodicWriter(HookBase):
    """Calls every writer's ``write()`` every ``period`` iterations and at the end.

    The last step is written once, at the end of training, after the final evaluation: its
    ``metrics.json`` line holds the step's scalars and the evaluation's results together.
    """

    def __init__(self, writers, period: int = 20):
        self._writers, self._period = list(writers), period

    def after_step(self):
        last = self.trainer.iter == self.trainer.max_iter - 1
        if (self.trainer.iter + 1) % self._period == 0 and not last:
            for writer in self._writers:
                writer.write()

    def after_train(self):
        for writer in self._writers:
            # the last step and the final evaluation, which ran after it
            writer.write()
            writer.close()
