"""The training loop with hooks (detectron2's TrainerBase), and the eager step on a mesh."""

from __future__ import annotations

import logging
import time
import weakref

import torch

from libai.engine.parallel import ModelRunner
from libai.utils.events import EventStorage, get_event_storage

logger = logging.getLogger(__name__)


class HookBase:
    """Something done around every step or at the ends of training.

    Hooks see the trainer through ``self.trainer`` (a weak proxy set by ``register_hooks``).
    """

    trainer = None

    def before_train(self):
        pass

    def after_train(self):
        pass

    def before_step(self):
        pass

    def after_step(self):
        pass


class TrainerBase:
    """A loop ``for iter in range(start_iter, max_iter): run_step()`` with hooks around it."""

    def __init__(self):
        self._hooks: list[HookBase] = []
        self.iter = self.start_iter = self.max_iter = 0
        self.storage: EventStorage | None = None

    def register_hooks(self, hooks) -> None:
        for h in hooks:
            if h is None:
                continue
            h.trainer = weakref.proxy(self)
            self._hooks.append(h)

    def train(self, start_iter: int, max_iter: int) -> None:
        logger.info("Starting training from iteration %d to %d", start_iter, max_iter)
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        with EventStorage(start_iter) as self.storage:
            try:
                self.before_train()
                for self.iter in range(start_iter, max_iter):
                    self.before_step()
                    self.run_step()
                    self.after_step()
                self.iter += 1  # "the iteration after the last one", as detectron2
            finally:
                self.after_train()

    def before_train(self):
        for h in self._hooks:
            h.before_train()

    def after_train(self):
        # results of the final evaluation belong to the last step (its metrics.json line)
        self.storage.iter = max(self.iter - 1, self.start_iter)
        for h in self._hooks:
            h.after_train()

    def before_step(self):
        self.storage.iter = self.iter
        for h in self._hooks:
            h.before_step()

    def after_step(self):
        for h in self._hooks:
            h.after_step()

    def run_step(self):
        raise NotImplementedError


class EagerTrainer(TrainerBase):
    """One step = fetch a batch, ``ModelRunner.train_step`` (forward, backward, grad sync,
    clipping, optimizer step). Records ``total_loss``, ``data_time`` and skipped fp16 steps.
    """

    def __init__(self, runner: ModelRunner, data_loader, optimizer, *, max_grad_norm=None):
        super().__init__()
        self.runner, self.model, self.optimizer = runner, runner.model, optimizer
        self.data_loader = data_loader
        self._data_iter = None
        self.max_grad_norm = max_grad_norm

    @property
    def data_iter(self):
        if self._data_iter is None:
            self._data_iter = iter(self.data_loader)
        return self._data_iter

    def run_step(self):
        self.model.train()
        start = time.perf_counter()
        batch = next(self.data_iter)
        device = self.runner.util.device
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        data_time = time.perf_counter() - start
        loss = self.runner.train_step(batch, self.optimizer, max_grad_norm=self.max_grad_norm)
        storage = get_event_storage()
        storage.put_scalars(total_loss=loss, data_time=data_time)
        if self.runner.last_grad_norm is not None:
            storage.put_scalar("grad_norm", self.runner.last_grad_norm)
        if self.runner.loss_scaler is not None:
            storage.put_scalar("loss_scale", self.runner.loss_scaler.scale, smoothing_hint=False)
        if not torch.isfinite(torch.tensor(loss)):
            raise FloatingPointError(f"loss became {loss} at iteration {self.iter}")
