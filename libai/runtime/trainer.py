"""The training loop with hooks (detectron2's TrainerBase), and the eager step on a mesh."""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Mapping

import torch

from libai.runtime.parallel import ModelRunner
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


def to_device(batch, device):
    """``batch`` (tensors in any nesting of mappings, lists and tuples) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return type(batch)((k, to_device(v, device)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


#: batch keys that hold token ids (a step's tokens = their element count)
TOKEN_KEYS = ("input_ids", "tokens", "encoder_input_ids")


def count_tokens(batch) -> int | None:
    """Tokens in a batch: the element count of its token ids, None if it has none."""
    if isinstance(batch, Mapping):
        for key in TOKEN_KEYS:
            value = batch.get(key)
            if isinstance(value, torch.Tensor):
                return value.numel()
    return None


class EagerTrainer(TrainerBase):
    """One step = fetch a batch, ``ModelRunner.train_step`` (forward, backward, grad sync,
    clipping, optimizer step). Records ``total_loss``, each "loss" entry of the model's
    output (BERT's ``lm_loss`` and ``sop_loss``, ...; not under pipeline parallelism, whose
    schedule returns the total only), ``data_time``, ``grad_norm`` and the fp16 loss scale,
    and counts the samples consumed (the data position a resume restores).

    This is the one training loop of the library: ``DefaultTrainer`` (LiBai configs) and
    ``Engine`` (FleetX task modules) both run it, with their hooks.

    Args:
        runner: the model on the mesh.
        data_loader: endless iterable of this rank's batches (one optimizer step each).
        optimizer: the (possibly ZeRO-wrapped) optimizer.
        max_grad_norm, norm_type: global-norm clipping (``None``: no clipping).
        lr_scheduler: stepped by the :class:`~libai.runtime.hooks.LRScheduler` hook.
        global_batch_size: samples per step over all dp ranks (the consumed-samples count).
        consumed_train_samples: samples consumed before ``start_iter`` (a resumed run).
        batch_transform: ``batch -> batch`` applied on the device before the step (a task
            module's ``pretreating_batch``).
    """

    def __init__(
        self,
        runner: ModelRunner,
        data_loader,
        optimizer,
        *,
        max_grad_norm=None,
        norm_type: float = 2.0,
        lr_scheduler=None,
        global_batch_size: int = 0,
        consumed_train_samples: int = 0,
        batch_transform=None,
    ):
        super().__init__()
        self.runner, self.model, self.optimizer = runner, runner.model, optimizer
        self.data_loader = data_loader
        self._data_iter = None
        self.max_grad_norm, self.norm_type = max_grad_norm, norm_type
        self.lr_scheduler = lr_scheduler
        self.global_batch_size = int(global_batch_size)
        self.consumed_train_samples = int(consumed_train_samples)
        self.batch_transform = batch_transform
        #: tokens of this rank's last batch (None when its batches carry no token ids)
        self.last_batch_tokens: int | None = None
        #: check that the losses are finite every this many steps (each check reads the
        #: device; the front doors set their logging period)
        self.finite_check_period = 1
        self._unchecked: list = []

    @property
    def data_iter(self):
        if self._data_iter is None:
            self._data_iter = iter(self.data_loader)
        return self._data_iter

    def set_data_iter(self, data_iter) -> None:
        """Train from ``data_iter`` (an iterator over ``data_loader``, e.g. advanced to a
        resume point) from the next step on."""
        self._data_iter = data_iter

    def set_data_loader(self, data_loader) -> None:
        """Train on ``data_loader`` from the next step on (e.g. rebuilt at a resume point)."""
        self.data_loader, self._data_iter = data_loader, None

    def checkpoint_extra(self) -> dict:
        """What resuming needs beyond the tensors: the last completed iteration and the data
        position (a checkpoint saved from any hook, e.g. ``model_best``, resumes exactly)."""
        return {
            "iteration": min(self.iter, self.max_iter - 1),
            "consumed_train_samples": self.consumed_train_samples,
        }

    def run_step(self):
        self.model.train()
        start = time.perf_counter()
        batch = to_device(next(self.data_iter), self.runner.util.device)
        if self.batch_transform is not None:
            batch = self.batch_transform(batch)
        self.last_batch_tokens = count_tokens(batch)
        data_time = time.perf_counter() - start
        # the loss stays a device tensor: nothing in the step waits for the device (the
        # writers read it back at their period, and so does the finiteness check)
        loss = self.runner.forward_backward(batch)
        self.runner.optimizer_step(
            self.optimizer, max_grad_norm=self.max_grad_norm, norm_type=self.norm_type
        )
        self.consumed_train_samples += self.global_batch_size
        storage = get_event_storage()
        terms = {k: v for k, v in self.runner.last_loss_terms.items() if k != "total_loss"}
        storage.put_scalars(total_loss=loss, data_time=data_time, **terms)
        if self.runner.last_grad_norm is not None:
            storage.put_scalar("grad_norm", self.runner.last_grad_norm)
        if self.runner.loss_scaler is not None:
            storage.put_scalar("loss_scale", self.runner.loss_scaler.scale, smoothing_hint=False)
            storage.put_scalar(
                "found_inf", float(self.runner.last_step_skipped), smoothing_hint=False
            )
        self.last_loss = loss
        self._unchecked.append((self.iter, loss))
        if len(self._unchecked) >= self.finite_check_period or self.iter + 1 >= self.max_iter:
            self.check_finite()

    def check_finite(self) -> None:
        """Raise ``FloatingPointError`` if a loss recorded since the last check is not finite
        (one read of the device for all of them)."""
        if not self._unchecked:
            return
        iters, losses = zip(*self._unchecked)
        self._unchecked = []
        values = torch.stack([loss.float() for loss in losses]).tolist()
        for iteration, value in zip(iters, values):
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at iteration {iteration}")
