"""The bridge from the training loop's hooks to a task module's logging hooks."""

from __future__ import annotations

import time

import torch

from libai.fleetx.module import BasicModule
from libai.runtime.trainer import HookBase

__all__ = ["ModuleCallbacks", "overridden"]


def overridden(module: BasicModule, name: str) -> bool:
    """Whether ``module``'s class replaces :class:`BasicModule`'s ``name``."""
    return getattr(type(module), name) is not getattr(BasicModule, name)


def _mean(values) -> float:
    """The mean of losses kept as tensors (one read of the device) or numbers."""
    return float(torch.stack([torch.as_tensor(v).float() for v in values]).mean())


class ModuleCallbacks(HookBase):
    """Calls ``training_step_end(log_dict)`` every ``logging_freq`` steps and
    ``training_epoch_end(log_dict)`` after each epoch's last step.

    ``log_dict`` (FleetX's keys): ``epoch`` and ``batch`` (0-based), ``total_epoch``,
    ``total_batch`` (steps per epoch), ``total_step``, ``loss`` (mean over the window),
    ``lr``, ``train_cost`` (seconds per step over the window), ``tokens_per_sec`` (when the
    batches carry token ids), ``loss_scale`` and ``found_inf`` (fp16).
    """

    def __init__(self, module, logging_freq, steps_per_epoch, total_epoch, max_iter):
        self.module, self.freq = module, max(int(logging_freq), 1)
        self.steps_per_epoch, self.total_epoch = steps_per_epoch, total_epoch
        self.max_iter = max_iter
        self._losses: list[float] = []
        self._epoch_losses: list[float] = []
        self._window_start = self._epoch_start = None

    def before_train(self):
        self._window_start = self._epoch_start = time.perf_counter()

    def _position(self, step: int) -> tuple[int, int]:
        if not self.steps_per_epoch:
            return 0, step
        return divmod(step, self.steps_per_epoch)

    def after_step(self):
        trainer = self.trainer
        storage, step = trainer.storage, trainer.iter
        loss = trainer.last_loss  # a device tensor: read back only when logged
        self._losses.append(loss)
        self._epoch_losses.append(loss)
        epoch, batch = self._position(step)
        if (step + 1) % self.freq == 0 or step + 1 == self.max_iter:
            now = time.perf_counter()
            cost = (now - self._window_start) / len(self._losses)
            log = {
                "epoch": epoch,
                "total_epoch": self.total_epoch,
                "batch": batch,
                "total_batch": self.steps_per_epoch,
                "total_step": self.max_iter,
                "loss": _mean(self._losses),
                "lr": storage.history("lr").latest(),
                "train_cost": cost,
            }
            tokens = self._tokens_per_step(trainer)
            if tokens:
                log["tokens_per_sec"] = tokens / cost
            if trainer.runner.loss_scaler is not None:
                log["loss_scale"] = trainer.runner.loss_scaler.scale
                log["found_inf"] = bool(trainer.runner.last_step_skipped)
            self.module.training_step_end(log)
            self._losses, self._window_start = [], time.perf_counter()
        end_of_epoch = self.steps_per_epoch and (step + 1) % self.steps_per_epoch == 0
        if end_of_epoch or step + 1 == self.max_iter:
            now = time.perf_counter()
            self.module.training_epoch_end(
                {
                    "epoch": epoch,
                    "total_epoch": self.total_epoch,
                    "loss": _mean(self._epoch_losses),
                    "train_cost": now - self._epoch_start,
                }
            )
            self._epoch_losses, self._epoch_start = [], now

    @staticmethod
    def _tokens_per_step(trainer) -> int | None:
        """Tokens per step over all data ranks (every rank's batch has the same shape)."""
        if not trainer.last_batch_tokens:
            return None
        return trainer.last_batch_tokens * trainer.runner.util.layout.data_parallel_size
