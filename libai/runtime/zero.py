"""``train.zero_optimization``: ZeRO stages 1-3 over the data-parallel group.

Every dp rank of a (pp, tp) position holds the same parameters. ZeRO splits the work on
them between those ranks:

- **stage 1** (optimizer-state sharding): the parameters are partitioned over the dp ranks
  (a deterministic greedy balance by element count); each rank builds the real optimizer
  state only for the parameters it owns, so it holds ~1/dp of the optimizer state. After its
  step, every parameter is broadcast from its owner to the other dp ranks.
- **stage 2** (also gradient sharding): instead of all-reducing every gradient, each bucket
  of gradients is reduced to its owner only, and a rank drops (sets to ``None``) the
  gradients it does not own. Gradient clipping then sums the squared norms over dp too.
- **stage 3** (also parameter sharding): FSDP2 ``fully_shard`` over the dp dim of any
  dp x tp x pp mesh, one unit per block plus the stage root (:mod:`libai.runtime.fsdp`;
  HSDP with ``hsdp_replicate_size``). Parameters become dp-sharded DTensors, so the plain
  optimizer's state is sharded too.

:class:`ZeroOptimizer` is a ``torch.optim.Optimizer`` (so LR schedulers accept it) whose
``param_groups`` and ``state`` are those of the inner optimizer over the parameters this
rank owns. Checkpoints hold no per-rank optimizer part: the
:class:`~libai.checkpoint.checkpointer.Checkpointer` saves the inner optimizer through DCP, each
owner writing its parameters' state under their names (``optimizer.state.<fqn>.exp_avg``,
the tensor-parallel shards as DTensor chunks). That is the form a run without ZeRO saves,
so a checkpoint of any stage loads on any layout and any stage: each rank reads the
entries it owns there.

Usage::

    runner = ModelRunner(model)
    prepare_model(runner, stage)                          # stage 3: fully_shard
    optimizer = shard_optimizer(runner, torch.optim.AdamW(model.parameters()), stage)
    runner.train_step(batch, optimizer)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as torch_dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from libai import dist
from libai.layers.moe import is_expert_parameter
from libai.runtime.buckets import bucket_tensors
from libai.runtime.fsdp import HSDP_KEY, FullyShardedGrads, apply_fully_shard
from libai.utils.logger import log_first_n

SUPPORTED_STAGES = (1, 2)  # by ZeroOptimizer; stage 3 is FSDP2


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def resolve_zero_stage(zero_cfg, layout) -> int | None:
    """The ZeRO stage to use (``None`` when disabled); raises for what cannot apply.

    ``zero_cfg`` is ``train.zero_optimization`` (``enabled``, ``stage``,
    ``hsdp_replicate_size``); ``layout`` the resolved
    :class:`~libai.dist.DistLayout`. Runs no collective. On one data-parallel rank there is
    nothing to shard over: ``None``, with one warning (LiBai's OneFlow ZeRO and DeepSpeed,
    Rapidformer's, run such a config unsharded too; every door behaves the same).
    """
    if zero_cfg is None or not zero_cfg.get("enabled", False):
        return None
    stage = zero_cfg.get("stage", 1)
    if stage not in (1, 2, 3):
        raise ValueError(
            f"train.zero_optimization.stage={stage!r} is invalid; supported stages are 1, 2 and 3."
        )
    cp = getattr(layout, "context_parallel_size", 1)
    if layout.data_parallel_size * cp < 2:
        log_first_n(
            logging.WARNING,
            f"ZeRO stage {stage} with one data-parallel rank: nothing to shard over; running "
            "without ZeRO",
        )
        return None
    replicate = zero_cfg.get("hsdp_replicate_size", 1)
    replicate = 1 if replicate is None else replicate
    dp = layout.data_parallel_size
    if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 1:
        raise ValueError(f"{HSDP_KEY} must be a positive integer, got {replicate!r}.")
    if replicate > 1 and stage != 3:
        raise ValueError(
            f"{HSDP_KEY}={replicate} (HSDP) applies to stage=3 only (got stage={stage}); "
            "set train.zero_optimization.stage=3 or hsdp_replicate_size=1."
        )
    if stage == 3 and replicate > 1 and cp > 1:
        raise ValueError(
            f"{HSDP_KEY}={replicate} (HSDP) with train.dist.context_parallel_size={cp} is not "
            "supported yet (stage 3 shards over the data x context parallel ranks as one "
            "group): set hsdp_replicate_size=1 or context_parallel_size=1."
        )
    if stage == 3 and replicate > 1 and (dp % replicate or replicate == dp):
        divisors = [d for d in range(1, dp) if dp % d == 0]
        raise ValueError(
            f"{HSDP_KEY}={replicate} must divide data_parallel_size={dp} and leave at least 2 "
            f"ranks per shard group (dp / replicate); use one of {divisors}."
        )
    return int(stage)


def partition_parameters(numels: Sequence[int], world: int) -> list[int]:
    """Owner rank of each parameter: largest first, each to the least-loaded rank (the lowest
    rank on ties). Deterministic, so every dp rank computes the same partition."""
    loads = [0] * world
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        rank = min(range(world), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += numels[i]
    return owners


def _init_hooks(optimizer: torch.optim.Optimizer) -> None:
    """What ``torch.optim.Optimizer.__init__`` would set and other code may touch (for
    wrappers that do not call it)."""
    optimizer._optimizer_step_pre_hooks = {}
    optimizer._optimizer_step_post_hooks = {}
    optimizer._optimizer_state_dict_pre_hooks = {}
    optimizer._optimizer_state_dict_post_hooks = {}
    optimizer._optimizer_load_state_dict_pre_hooks = {}
    optimizer._optimizer_load_state_dict_post_hooks = {}


class _OwnedGroups(torch.optim.Optimizer):
    """A ZeRO rank's inner optimizer seen without the param groups that own no parameter
    here (torch's distributed state-dict helpers accept at most one empty group). State and
    group dicts are the inner optimizer's own; ``load_state_dict`` lands in it."""

    def __init__(self, inner: torch.optim.Optimizer):
        self.inner = inner
        _init_hooks(self)

    @property
    def param_groups(self):
        return [g for g in self.inner.param_groups if g["params"]]

    @property
    def state(self):
        return self.inner.state

    @property
    def defaults(self):
        return self.inner.defaults

    def step(self, closure=None):  # a local step (the state helpers' zero-lr state init)
        return self.inner.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)

    def __setstate__(self, state: dict) -> None:
        """The end of ``Optimizer.load_state_dict``: the loaded state and the (non-empty)
        groups go into the inner optimizer, whose empty groups stay as they are."""
        self.inner.state = state["state"]
        loaded = iter(state["param_groups"])
        self.inner.param_groups = [
            next(loaded) if g["params"] else g for g in self.inner.param_groups
        ]


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1/2 around an optimizer built over all of the model's parameters.

    Args:
        optimizer: a fresh (no state yet) ``torch.optim`` optimizer over ``model``'s
            parameters. Its param groups are cut down in place to the parameters this dp
            rank owns; group hyper-parameters (LR, ...) stay shared with the wrapper.
        model: the model (names for errors and the checkpoint signature).
        stage: 1 or 2. Stage 2 also shards gradients; :func:`shard_optimizer` hooks it into a
            :class:`~libai.runtime.parallel.ModelRunner`.
    """

    @property
    def libai_checkpoint_optimizer(self) -> torch.optim.Optimizer:
        """What the Checkpointer saves and loads through DCP: the inner optimizer (without
        its groups that own nothing here), whose state is keyed by the names of the
        parameters this rank owns (layout-free)."""
        return _OwnedGroups(self.inner)

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, *, stage: int = 1):
        if stage not in SUPPORTED_STAGES:
            raise ValueError(f"ZeRO stage {stage!r} is not supported by ZeroOptimizer")
        if optimizer.state:
            raise ValueError("ZeroOptimizer needs a fresh optimizer (its state is not empty)")
        util = dist.mesh_of(model)
        self.util, self.stage, self.inner = util, stage, optimizer
        # the ranks that hold the same parameters: dp, times cp under context parallel (the
        # gradient group, whose ranks are ordered (dp, cp))
        self.group = util.grad_group
        self.dp_size = util.grad_size
        cp = util.layout.context_parallel_size
        self.dp_rank = util.data_parallel_rank * cp + util.context_parallel_rank
        names = {id(p): n for n, p in model.named_parameters()}
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("a parameter appears in more than one optimizer param group")
        self.names = [names.get(id(p), f"<param {i}>") for i, p in enumerate(self.params)]
        # expert weights split over ep (libai.layers.moe) are each rank's own already: it
        # keeps their state and gradients; the other parameters are partitioned over dp
        experts = {id(p) for p in self.params if is_expert_parameter(p, util)}
        dense = [p for p in self.params if id(p) not in experts]
        owners = partition_parameters([_local(p).numel() for p in dense], self.dp_size)
        self.owner = {id(p): r for p, r in zip(dense, owners)}
        self.owner.update({i: self.dp_rank for i in experts})
        self.owned_by = [[p for p in dense if self.owner[id(p)] == r] for r in range(self.dp_size)]
        for group in optimizer.param_groups:  # the real optimizer sees only owned parameters
            group["params"] = [p for p in group["params"] if self.owner[id(p)] == self.dp_rank]
        self._signature = {
            "stage": stage,
            "dp_size": self.dp_size,
            "dp_rank": self.dp_rank,
            "owned": [
                (n, tuple(_local(p).shape))
                for n, p in zip(self.names, self.params)
                if self.owner[id(p)] == self.dp_rank
            ],
        }
        _init_hooks(self)

    # the inner optimizer's, live (its load_state_dict replaces the param_groups list)
    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    @property
    def defaults(self):
        return self.inner.defaults

    def owned(self, p: torch.Tensor) -> bool:
        return self.owner[id(p)] == self.dp_rank

    def __repr__(self) -> str:
        return f"ZeroOptimizer(stage={self.stage}, dp={self.dp_size}, inner={self.inner!r})"

    def __getstate__(self):
        raise TypeError("ZeroOptimizer is not picklable; use state_dict()")

    # ---- step -------------------------------------------------------------------------------
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.inner.step()
        self._broadcast_parameters()
        return loss

    @torch.no_grad()
    def _broadcast_parameters(self) -> None:
        """Every parameter's local tensor from its owner to the other dp ranks."""
        for owner, params in enumerate(self.owned_by):
            tensors = [_local(p).detach() for p in params]
            for bucket in bucket_tensors(tensors):
                if len(bucket) == 1:
                    torch_dist.broadcast(bucket[0], group=self.group, group_src=owner)
                    continue
                flat = _flatten_dense_tensors(bucket)
                torch_dist.broadcast(flat, group=self.group, group_src=owner)
                if owner != self.dp_rank:
                    for t, value in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                        t.copy_(value)

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Stage 2's dp gradient sync: the dp-mean of each gradient lands on its owner only;
        other ranks drop theirs. Called by ``ModelRunner.sync_gradients``."""
        for owner, params in enumerate(self.owned_by):
            grads = [_local(p.grad) for p in params if p.grad is not None]
            for bucket in bucket_tensors(grads):
                flat = bucket[0] if len(bucket) == 1 else _flatten_dense_tensors(bucket)
                torch_dist.reduce(flat, group=self.group, group_dst=owner)
                if owner == self.dp_rank:
                    flat /= self.dp_size
                    if len(bucket) > 1:
                        for g, value in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                            g.copy_(value)
        for p in self.params:
            if not self.owned(p):
                p.grad = None
        # the experts' gradients: summed over their expert-data group by GradientSync

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    # ---- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's partial optimizer state (DTensor states as local tensors): the
        ``torch.optim`` API, loadable on the same layout only. Checkpoints do not use it (the
        Checkpointer saves :attr:`libai_checkpoint_optimizer` through DCP, which reshards)."""
        sd = self.inner.state_dict()
        state, dtensor_keys = {}, []
        for index, entry in sd["state"].items():
            state[index] = {}
            for key, value in entry.items():
                if isinstance(value, DTensor):
                    value = value.to_local()
                    dtensor_keys.append((index, key))
                state[index][key] = value
        return {
            "zero": dict(self._signature),
            "dtensor_keys": dtensor_keys,
            "inner": {"state": state, "param_groups": sd["param_groups"]},
        }

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("zero") if isinstance(state_dict, dict) else None
        if saved is None:
            raise ValueError(
                "not a ZeroOptimizer state dict (train.zero_optimization was off when it was "
                "saved?); resume with the same train.zero_optimization setting"
            )
        mine = self._signature
        if {k: saved[k] for k in ("dp_size", "dp_rank")} != {
            k: mine[k] for k in ("dp_size", "dp_rank")
        } or [tuple(x) for x in saved["owned"]] != [tuple(x) for x in mine["owned"]]:
            raise ValueError(
                "the ZeRO optimizer state was saved on another layout or model (dp_size "
                f"{saved['dp_size']}, dp rank {saved['dp_rank']}, {len(saved['owned'])} owned "
                f"parameters; here dp_size {mine['dp_size']}, dp rank {mine['dp_rank']}, "
                f"{len(mine['owned'])}): with train.zero_optimization a resume needs the same "
                "layout"
            )
        self.inner.load_state_dict(state_dict["inner"])
        # the inner load made every state a plain tensor: DTensor parameters need DTensor states
        owned = [p for g in self.inner.param_groups for p in g["params"]]
        for index, key in state_dict.get("dtensor_keys", []):
            p = owned[int(index)]
            value = self.inner.state[p][key]
            self.inner.state[p][key] = DTensor.from_local(
                value, p.device_mesh, p.placements, run_check=False
            )


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this rank's optimizer state tensors (local shards of DTensors)."""
    total = 0
    for entry in optimizer.state.values():
        for value in entry.values():
            if torch.is_tensor(value):
                value = _local(value)
                total += value.numel() * value.element_size()
    return total


def prepare_model(runner, stage: int | None, *, hsdp_replicate_size: int = 1) -> None:
    """Stage 3: ``fully_shard`` each block and the stage root on the dp mesh (call after the
    ModelRunner is built, before the optimizer; :func:`libai.runtime.fsdp.apply_fully_shard`).
    Stages 1 and 2 leave the model alone."""
    if stage != 3:
        return
    resolve_zero_stage(
        {"enabled": True, "stage": 3, "hsdp_replicate_size": hsdp_replicate_size},
        runner.util.layout,
    )  # raises for a layout it cannot apply to
    apply_fully_shard(runner, hsdp_replicate_size=hsdp_replicate_size)


def shard_optimizer(runner, optimizer: torch.optim.Optimizer, stage: int):
    """Wrap ``optimizer`` for ZeRO ``stage`` and, for stage 2, make ``runner`` reduce
    gradients to their owners (and clip by a norm summed over dp). Stage 3 (a model prepared
    by :func:`prepare_model`) returns ``optimizer`` itself: its state follows the sharded
    parameters."""
    if stage == 3:
        if not isinstance(runner.grads.sharder, FullyShardedGrads):
            raise RuntimeError("ZeRO stage 3: call prepare_model(runner, 3) before the optimizer")
        return optimizer
    zero = ZeroOptimizer(optimizer, runner.model, stage=stage)
    if stage >= 2:
        runner.grads.sharder = zero
    return zero


def owned_parameters(optimizer: ZeroOptimizer) -> Iterable[torch.Tensor]:
    """The parameters this rank owns (updates and, in stage 2, holds gradients for)."""
    return [p for p in optimizer.params if optimizer.owned(p)]
