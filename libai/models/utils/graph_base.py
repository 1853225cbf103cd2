"""LiBai's ``GraphBase`` on torch: a model run as one compiled graph.

In LiBai (OneFlow) ``GraphBase`` is an ``nn.Graph``: calling it with a batch runs the whole
step statically -- forward, and when training the summed loss's backward, the optimizer
step and the LR schedule, with AMP, gradient accumulation and activation checkpointing as
graph options. Here the same object is a module whose call does the same on
``torch.compile`` of the model: LiBai projects that build their own graphs
(``LazyCall(GraphBase)(is_train=True)`` with the model and optimizer filled in) keep
working. ``tools/train_net.py`` does not need it: ``graph.enabled`` there compiles the
blocks of the runtime's runner.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from libai import dist
from libai.layers import TransformerLayer
from libai.models.contract import total_loss
from libai.utils.batches import split_batch

logger = logging.getLogger(__name__)

__all__ = ["GraphBase"]


class GraphBase(nn.Module):
    """``model`` compiled; a training graph also runs backward and the optimizer step.

    Args (LiBai's): ``model``; ``optimizer`` / ``lr_scheduler`` (training: stepped once per
    call); ``fp16`` (autocast to float16 with a dynamic loss scaler starting at
    ``65536 x dp``, as LiBai's); ``activation_checkpoint`` (every ``TransformerLayer``
    recomputes in backward); ``grad_acc_steps`` (the batch is split into that many
    micro-batches, gradients summed); ``is_train``; ``device``. ``zero_optim`` is refused
    (shard the optimizer with ``train.zero_optimization`` through the trainer);
    ``auto_parallel_conf`` / ``global_mode`` are OneFlow options with no effect here (one
    log line when enabled).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler=None,
        fp16: bool = False,
        activation_checkpoint: bool = False,
        grad_acc_steps: int = 1,
        zero_optim: bool = False,
        zero_stage: int = 0,
        is_train: bool = True,
        auto_parallel_conf=None,
        global_mode=None,
        device: str = "cuda",
    ):
        super().__init__()
        if zero_optim:
            raise ValueError(
                "GraphBase(zero_optim=True): ZeRO is applied by the trainer here; set "
                "train.zero_optimization.enabled=True instead"
            )
        if is_train and optimizer is None:
            raise ValueError("GraphBase(is_train=True) needs the optimizer it steps")
        if not isinstance(grad_acc_steps, int) or grad_acc_steps < 1:
            raise ValueError(
                f"GraphBase: grad_acc_steps must be a positive int, not {grad_acc_steps!r}"
            )
        for name, option in (
            ("auto_parallel_conf", auto_parallel_conf),
            ("global_mode", global_mode),
        ):
            if option is not None and getattr(option, "enabled", False):
                logger.info("GraphBase: %s is a OneFlow graph option with no effect here", name)
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.is_train, self.grad_acc_steps = is_train, grad_acc_steps
        self.device_type = torch.device(device).type
        self.amp_dtype = torch.float16 if fp16 else None
        self.grad_scaler = None
        if fp16 and is_train:
            dp = dist.mesh_of(model).layout.data_parallel_size
            self.grad_scaler = torch.amp.GradScaler(
                self.device_type,
                init_scale=65536.0 * dp,
                growth_factor=2.0,
                backoff_factor=0.5,
                growth_interval=2000,
            )
        if activation_checkpoint:
            for module in model.modules():
                if isinstance(module, TransformerLayer):
                    module.activation_checkpointing = "full"
        self.compiled = torch.compile(model)

    def _autocast(self):
        return torch.autocast(
            self.device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None
        )

    def forward(self, **batch):
        """Evaluation: the model's outputs. Training: forward and backward of the summed
        ``*loss*`` outputs over the micro-batches, the optimizer and LR steps; returns the
        loss dict (each entry the mean over micro-batches, detached)."""
        if not self.is_train:
            with torch.no_grad(), self._autocast():
                return self.compiled(**batch)
        self.model.train()
        totals: dict = {}
        micro = split_batch(batch, self.grad_acc_steps) if self.grad_acc_steps > 1 else [batch]
        for chunk in micro:
            with self._autocast():
                out = self.compiled(**chunk)
            loss = total_loss(out) / len(micro)
            if self.grad_scaler is not None:
                loss = self.grad_scaler.scale(loss)
            loss.backward()
            for k, v in out.items():
                if "loss" in k:
                    totals[k] = totals.get(k, 0.0) + v.detach().float() / len(micro)
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return totals
