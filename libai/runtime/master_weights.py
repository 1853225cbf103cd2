"""Mixed precision level O2: low-precision parameters, fp32 master weights in the optimizer.

Level O1 (``torch.autocast``) keeps fp32 parameters and casts them per op. Level O2, as in
FleetX (``mix_precision.level: O2``) and Megatron (``--bf16`` / ``--fp16``), stores the
model's parameters and gradients in bf16 / fp16 -- half the bytes of both -- and keeps an
fp32 copy of each (the *master weight*) that the optimizer updates:

1. :meth:`MasterWeights.cast_model` casts every parameter to the low-precision dtype, except
   those of normalization layers (any module whose class name contains ``Norm``: their
   parameters are small and their statistics need fp32, as Paddle's O2 keeps them) and LoRA
   adapters (fp32 beside the low-precision frozen base, stepped directly);
2. :meth:`MasterWeights.attach` makes an fp32 master of each cast parameter -- its exact fp32
   value at the cast, unless the parameter changed since (weights loaded), then from it --
   and swaps it into the optimizer's param groups (the optimizer state is fp32, keyed by the
   masters);
3. each step, after the gradient sync: :meth:`grads_to_master` (low-precision grad -> fp32
   master grad; the loss scaler's unscale and the clipping then see fp32 grads), the
   optimizer's step on the masters, :meth:`copy_to_model` (master -> parameter, rounded).

Checkpoints hold the fp32 masters: :attr:`checkpoint_model` is a view of the model whose
parameters are the masters (same names, shared buffers), which the Checkpointer saves and
loads in place of the model -- so an O2 checkpoint reads like an fp32 one (O1 and fp32 runs
load it, and it loads them), and a resume continues from exact fp32 weights.

With ZeRO-1/2 a dp rank keeps masters only for the parameters it owns (the masters are
optimizer state, sharded like it): per parameter, O2 + ZeRO-1 holds 2 + 2 + 12 / dp bytes
(bf16 parameter and gradient; master and Adam moments sharded) where O1 + ZeRO-1 holds
4 + 4 + 8 / dp.

Autocast stays on in O2 (as in FleetX): ops on fp32 norm outputs run in the low precision.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

__all__ = ["MasterWeights", "is_norm_module"]


def is_norm_module(module: nn.Module) -> bool:
    """Normalization layers keep fp32 parameters under O2 (LayerNorm, RMSNorm, ...)."""
    return "norm" in type(module).__name__.lower()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _cast_in_place(p: nn.Parameter, dtype: torch.dtype) -> None:
    """``p`` (the same object: ties and module references hold) converted to ``dtype``. A
    DTensor's local tensor lives in a Python attribute that ``p.data = ...`` leaves as it
    was, so a DTensor parameter swaps contents with a converted one, as ``nn.Module.to``
    does for tensor subclasses (its attributes -- libai's tags -- are carried over)."""
    if not isinstance(p, DTensor):
        p.data = p.data.to(dtype)
        return
    converted = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
    converted.__dict__.update(p.__dict__)
    torch.utils.swap_tensors(p, converted)


class MasterWeights:
    """The O2 parameter / master-weight pairs of one model (see the module doc).

    Args:
        model: the model this rank runs (after the pipeline split; virtual-stage copies
            share its parameter objects).
        dtype: ``torch.bfloat16`` or ``torch.float16``.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"mixed precision O2 needs bf16 or fp16, got {dtype}")
        self.model, self.dtype = model, dtype
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []
        self._master_of: dict[int, nn.Parameter] = {}
        #: each cast parameter's fp32 value at the cast (the master's start, if unchanged)
        self._fp32_start: dict[int, torch.Tensor] = {}
        #: the ZeRO-1/2 optimizer whose owned parameters alone have masters here (or None)
        self.zero = None
        #: (parameter, fp32 value) of the parameters other dp ranks own, during a checkpoint
        self._others: list[tuple[nn.Parameter, torch.Tensor]] = []

    # ---- set-up -----------------------------------------------------------------------------
    @torch.no_grad()
    def cast_model(self) -> int:
        """Cast the parameters of every non-normalization module to ``dtype`` in place (the
        Parameter objects stay, so ties and optimizer references hold). Returns how many."""
        cast = 0
        seen: set[int] = set()
        for module in self.model.modules():
            if is_norm_module(module):
                for p in module.parameters(recurse=False):
                    seen.add(id(p))  # a norm's parameter stays fp32 even if shared
        for p in self.model.parameters():
            if getattr(p, "libai_lora", False):
                seen.add(id(p))  # LoRA adapters stay fp32: stepped as they are, no master
        for module in self.model.modules():
            if is_norm_module(module):
                continue
            for p in module.parameters(recurse=False):
                if id(p) in seen or not p.is_floating_point():
                    continue
                seen.add(id(p))
                if p.requires_grad:  # a frozen weight (LoRA's base) gets no master
                    self._fp32_start[id(p)] = p.detach().clone()
                _cast_in_place(p, self.dtype)
                cast += 1
        object.__setattr__(self.model, "libai_master_weights", self)
        return cast

    @torch.no_grad()
    def attach(self, optimizer: torch.optim.Optimizer, zero=None) -> torch.optim.Optimizer:
        """Swap an fp32 master for each low-precision parameter in ``optimizer``'s param
        groups (in place; the optimizer must have no state yet) and make its ``step`` end by
        rounding the masters into the parameters. Returns ``optimizer``.

        Under ZeRO-1/2 pass the inner optimizer of the :class:`~libai.runtime.zero.ZeroOptimizer`
        ``zero``: its groups hold only the parameters this dp rank owns, so this rank keeps
        masters for those alone (the masters are sharded with the optimizer state), and the
        ZeRO step broadcasts the rounded low-precision parameters from their owners."""
        if optimizer.state:
            raise ValueError("mixed precision O2 needs a fresh optimizer (its state is not empty)")
        for group in optimizer.param_groups:
            group["params"] = [self._master(p) for p in group["params"]]
        self._fp32_start.clear()
        self.zero = zero
        optimizer.register_step_post_hook(lambda *_: self.copy_to_model())
        logger.info(
            "mixed precision O2: %d parameters in %s with fp32 master weights in the optimizer",
            len(self.pairs),
            str(self.dtype).removeprefix("torch."),
        )
        return optimizer

    def _master(self, p: nn.Parameter) -> nn.Parameter:
        if p.dtype == torch.float32:
            return p  # a norm's parameter: the optimizer steps it directly
        if id(p) not in self._master_of:
            start = self._fp32_start.pop(id(p), None)
            if start is None or not torch.equal(_local(start).to(self.dtype), _local(p)):
                start = p.detach().float()  # changed since the cast (weights loaded): from it
            master = nn.Parameter(start, requires_grad=p.requires_grad)
            master.__dict__.update(p.__dict__)  # libai's tags (tied groups, sequence parallel)
            self._master_of[id(p)] = master
            self.pairs.append((p, master))
        return self._master_of[id(p)]

    # ---- each step --------------------------------------------------------------------------
    def optimizer_parameters(self) -> list[torch.Tensor]:
        """What the optimizer steps, in the model's order: the master of each cast parameter,
        the parameter itself for those kept in fp32 (norms)."""
        return [self._master_of.get(id(p), p) for p in self.model.parameters()]

    @torch.no_grad()
    def grads_to_master(self) -> None:
        """Each cast parameter's (synced) gradient, in fp32, onto its master; the
        low-precision gradient is freed."""
        for p, master in self.pairs:
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """The masters, rounded to ``dtype``, into the model's parameters."""
        for p, master in self.pairs:
            _local(p).copy_(_local(master))

    # ---- checkpoints ------------------------------------------------------------------------
    @property
    def checkpoint_model(self) -> nn.Module:
        """The model with fp32 parameters -- the masters, and for norms the parameters
        themselves -- under the model's names (buffers shared): what a checkpoint saves and
        loads under O2. Before :meth:`attach` it is the model itself.

        Under ZeRO-1/2 (collective over dp): the parameters other dp ranks own get an fp32 copy
        broadcast from their owner's master, so every rank holds the same full fp32 values."""
        if not self.pairs and self.zero is None:
            return self.model
        replace: dict[int, torch.Tensor] = {id(p): m for p, m in self.pairs}
        self._others = []
        if self.zero is not None:
            for owner, params in enumerate(self.zero.owned_by):
                for p in params:
                    if p.dtype != self.dtype:
                        continue  # an fp32 (norm) parameter: the same on every rank
                    mine = owner == self.zero.dp_rank
                    value = replace[id(p)] if mine else torch.empty_like(p, dtype=torch.float32)
                    torch_dist.broadcast(_local(value).data, group=self.zero.group, group_src=owner)
                    if not mine:
                        replace[id(p)] = nn.Parameter(value, requires_grad=False)
                        self._others.append((p, replace[id(p)]))
        return _shadow(self.model, replace, {})

    @torch.no_grad()
    def after_load(self) -> None:
        """After a checkpoint loaded into :attr:`checkpoint_model`: round the fp32 values into
        the model's parameters."""
        self.copy_to_model()
        for p, value in self._others:
            _local(p).copy_(_local(value))
        self._others = []


def _shadow(module: nn.Module, replace: dict[int, torch.Tensor], done: dict) -> nn.Module:
    """A shallow copy of ``module``'s tree whose parameters are ``replace[id(p)]`` where given
    (names, buffers and everything else shared)."""
    if id(module) in done:
        return done[id(module)]
    view = copy.copy(module)
    done[id(module)] = view
    view._parameters = {
        name: (None if p is None else replace.get(id(p), p))
        for name, p in module._parameters.items()
    }
    view._modules = {
        name: (None if child is None else _shadow(child, replace, done))
        for name, child in module._modules.items()
    }
    return view
