"""Differentiable tensor-parallel collectives on local tensors.

Layers hold DTensor parameters but compute on local shards (DESIGN: the single-device path
must not pay DTensor dispatch); these four functions are the only places where activations
cross ranks. Each is a no-op (no autograd node, no communication) when tp == 1.

=================  ======================  ======================
function           forward                 backward
=================  ======================  ======================
copy_to_tp         identity   [B]          all-reduce  [P] -> [B]
reduce_from_tp     all-reduce [P] -> [B]   identity
gather_from_tp     all-gather [S] -> [B]   take own chunk
scatter_to_tp      take own chunk          all-gather
=================  ======================  ======================
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist

from libai.utils import distributed as dist


def _tp_group():
    return dist.get_dist_util().tp_group


def _all_reduce(x: torch.Tensor, group, op=torch_dist.ReduceOp.SUM) -> torch.Tensor:
    x = x.contiguous().clone()
    torch_dist.all_reduce(x, op=op, group=group)
    return x


def _all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    world = torch_dist.get_world_size(group)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    torch_dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def _chunk(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    world = torch_dist.get_world_size(group)
    rank = torch_dist.get_rank(group)
    if x.shape[dim] % world:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} does not split into {world} shards")
    return x.chunk(world, dim=dim)[rank].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _chunk(grad, ctx.dim, ctx.group), None, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _chunk(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


def copy_to_tp(x: torch.Tensor) -> torch.Tensor:
    """Enter a tensor-parallel region: ``[B]`` stays ``[B]``; grads ``[P] -> [B]`` (all-reduce)."""
    group = _tp_group()
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor) -> torch.Tensor:
    """Leave a row-parallel region: partial sums ``[P] -> [B]`` (all-reduce)."""
    group = _tp_group()
    return x if group is None else _ReduceFromTP.apply(x, group)


def gather_from_tp(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``[S(dim)] -> [B]``: all-gather the tp shards along ``dim``."""
    group = _tp_group()
    return x if group is None else _GatherFromTP.apply(x, dim, group)


def scatter_to_tp(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``[B] -> [S(dim)]``: keep this rank's chunk along ``dim``."""
    group = _tp_group()
    return x if group is None else _ScatterToTP.apply(x, dim, group)


def all_reduce_tp(x: torch.Tensor, op=torch_dist.ReduceOp.SUM) -> torch.Tensor:
    """Non-differentiable all-reduce over the tp group (for statistics such as a max)."""
    group = _tp_group()
    return x if group is None else _all_reduce(x, group, op)
