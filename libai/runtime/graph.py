"""LiBai's ``GraphBase`` on the runtime: a model run as one compiled training step.

In LiBai (OneFlow) ``GraphBase`` is an ``nn.Graph``: calling it with a batch runs the whole
step statically -- forward, and when training the summed loss's backward, the optimizer
step and the LR schedule, with AMP, gradient accumulation and activation checkpointing as
graph options. Here the same object drives the runtime's one step
(:class:`~libai.runtime.parallel.ModelRunner`): micro-batches, the data-parallel gradient
sync over the mesh the model was built on, the one fp16 loss scaler (skipping a step that
overflows on any rank), activation checkpointing and compile of the model's blocks. LiBai
projects that build their own graphs (``LazyCall(GraphBase)(is_train=True)`` with the model
and optimizer filled in) keep working, on any layout. ``tools/train_net.py`` does not need
it: ``graph.enabled`` there compiles the blocks of the same runner.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from libai import dist
from libai.runtime.amp import DynamicLossScaler
from libai.runtime.blocks import model_blocks
from libai.runtime.parallel import ModelRunner

logger = logging.getLogger(__name__)

__all__ = ["GraphBase"]

#: LiBai's dynamic loss scale: 65536 x dp at the start, doubled after 2000 clean steps
INITIAL_SCALE, GROWTH_INTERVAL = 65536.0, 2000


class GraphBase(nn.Module):
    """``model`` compiled; a training graph also runs backward and the optimizer step.

    Args (LiBai's): ``model``; ``optimizer`` / ``lr_scheduler`` (training: stepped once per
    call, the schedule not after a skipped fp16 step); ``fp16`` (autocast to float16 with a
    dynamic loss scaler starting at ``65536 x dp``, as LiBai's); ``activation_checkpoint``
    (every block recomputes in backward); ``grad_acc_steps`` (the batch is split into that
    many micro-batches, gradients averaged); ``is_train``; ``device`` (LiBai's placement
    argument: the device is the mesh's, ``train.dist.device_type``). ``zero_optim`` is
    refused (shard the optimizer with ``train.zero_optimization`` through the trainer);
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
        del device, zero_stage  # the mesh's device; ZeRO is the trainer's
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.is_train, self.grad_acc_steps = is_train, grad_acc_steps
        has_blocks = bool(model_blocks(model))
        # a model with blocks compiles them in the runner; one without, as a whole
        self.compiled = model if has_blocks else torch.compile(model)
        loss_scaler = None
        if fp16 and is_train:
            dp = dist.mesh_of(model).layout.data_parallel_size
            loss_scaler = DynamicLossScaler(
                init_scale=INITIAL_SCALE * dp, growth_interval=GROWTH_INTERVAL
            )
        self.runner = ModelRunner(
            model,
            num_microbatches=grad_acc_steps if is_train else 1,
            amp_dtype=torch.float16 if fp16 else None,
            loss_scaler=loss_scaler,
            activation_checkpointing=bool(activation_checkpoint and has_blocks),
            compile=has_blocks,
            loss_fn=None if has_blocks else (lambda batch: self.compiled(**batch)),
        )

    @property
    def grad_scaler(self) -> DynamicLossScaler | None:
        """The fp16 loss scaler of the step (``None`` without fp16)."""
        return self.runner.loss_scaler

    def forward(self, **batch):
        """Evaluation: the model's outputs. Training: one step of the runtime -- forward and
        backward of the summed ``*loss*`` outputs over the micro-batches, the data-parallel
        gradient sync, the optimizer and LR steps; returns the loss terms (each the mean over
        micro-batches and data-parallel ranks, detached; ``{"loss": total}`` under pipeline
        parallelism, whose schedule keeps the terms on the last stage)."""
        if not self.is_train:
            with torch.no_grad(), self.runner.autocast():
                return self.compiled(**batch)
        self.model.train()
        loss = self.runner.forward_backward(batch)
        stepped = self.runner.optimizer_step(self.optimizer)
        if stepped and self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return dict(self.runner.last_loss_terms) or {"loss": loss}
