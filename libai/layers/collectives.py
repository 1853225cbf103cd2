"""Differentiable tensor-parallel collectives on local tensors.

Layers hold DTensor parameters but compute on local shards (DESIGN: the single-device path
must not pay DTensor dispatch); these functions are the only places where activations
cross ranks. Each takes the tensor-parallel group of the calling layer's mesh (the one it
kept when it was built, :func:`libai.dist.capture_mesh`; never the mesh current at run
time) and is a no-op (no autograd node, no communication) for ``group=None`` (tp == 1).

====================  =============================  =============================
function              forward                        backward
====================  =============================  =============================
copy_to_tp            identity   [B]                 all-reduce  [P] -> [B]
reduce_from_tp        all-reduce [P] -> [B]          identity
gather_from_tp        all-gather [S] -> [B]          take own chunk
scatter_to_tp         take own chunk                 all-gather
gather_from_sp        all-gather [S(1)] -> [B]       reduce-scatter [P] -> [S(1)]
reduce_scatter_to_sp  reduce-scatter [P] -> [S(1)]   all-gather [S(1)] -> [B]
scatter_to_sp         take own chunk [B] -> [S(1)]   all-gather [S(1)] -> [B]
====================  =============================  =============================

The ``*_sp`` functions are Megatron's sequence-parallel collectives (``train.dist.sequence_parallel``):
between tensor-parallel regions activations ``[batch, seq, hidden]`` are split along the
sequence (:data:`SEQ_DIM`) over the tp group. Entering a region (column-parallel Linear)
all-gathers the sequence instead of :func:`copy_to_tp`; leaving one (row-parallel Linear)
reduce-scatters it instead of :func:`reduce_from_tp`.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist

#: the sequence dimension of activations ``[batch, seq, hidden]`` under sequence parallel
SEQ_DIM = 1


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


#: torch >= 2.13 names the single-tensor reduce-scatter ``reduce_scatter_single`` and
#: deprecates ``reduce_scatter_tensor`` (same arguments)
_reduce_scatter_single = getattr(torch_dist, "reduce_scatter_single", None) or (
    torch_dist.reduce_scatter_tensor
)


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this rank's chunk along ``dim``: one reduce-scatter
    collective on every backend.

    On NCCL that is a true reduce-scatter (each rank receives 1/world of the bytes). gloo has
    no reduce-scatter algorithm for CPU tensors; PyTorch's gloo backend implements the same
    call as an all-reduce followed by this rank's chunk (pytorch#118911): the same values,
    with the traffic of an all-reduce (about twice a reduce-scatter's).
    """
    world = torch_dist.get_world_size(group)
    if x.shape[dim] % world:
        raise ValueError(f"dim {dim} of size {x.shape[dim]} does not split into {world} shards")
    # the collective splits dim 0: [batch, seq, hidden] is copied to [seq, batch, hidden] and
    # back (Megatron keeps activations sequence-first to save these two copies)
    full = x.movedim(dim, 0).contiguous()
    out = full.new_empty((full.shape[0] // world, *full.shape[1:]))
    _reduce_scatter_single(out, full, group=group)
    return out.movedim(0, dim).contiguous()


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


class _GatherWithGrad(torch.autograd.Function):
    """All-gather along ``dim``; backward sums the gradient over ranks and keeps this rank's
    chunk (a reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, SEQ_DIM, ctx.group), None


def all_gather_with_grad(x: torch.Tensor, group, dim: int = 0) -> torch.Tensor:
    """``x`` of every rank of ``group`` concatenated along ``dim`` in rank order,
    differentiable: rank ``r``'s rows get the sum over ranks of their gradients, e.g. in-batch
    negatives gathered over the data-parallel group for a contrastive loss. ``group=None`` (or
    a group of one) returns ``x``. Every rank passes the same shape.
    """
    if group is None or torch_dist.get_world_size(group) == 1:
        return x
    return _GatherWithGrad.apply(x, dim, group)


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Enter a tensor-parallel region: ``[B]`` stays ``[B]``; grads ``[P] -> [B]`` (all-reduce)."""
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Leave a row-parallel region: partial sums ``[P] -> [B]`` (all-reduce)."""
    return x if group is None else _ReduceFromTP.apply(x, group)


def gather_from_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """``[S(dim)] -> [B]``: all-gather the tp shards along ``dim``."""
    return x if group is None else _GatherFromTP.apply(x, dim, group)


def scatter_to_tp(x: torch.Tensor, group, dim: int = -1) -> torch.Tensor:
    """``[B] -> [S(dim)]``: keep this rank's chunk along ``dim``."""
    return x if group is None else _ScatterToTP.apply(x, dim, group)


def all_reduce_tp(x: torch.Tensor, group, op=torch_dist.ReduceOp.SUM) -> torch.Tensor:
    """Non-differentiable all-reduce over the tp group (for statistics such as a max)."""
    return x if group is None else _all_reduce(x, group, op)


def check_sequence_split(seq_len: int, tp: int) -> None:
    """Raise before any collective if ``seq_len`` does not split over the ``tp`` ranks."""
    if seq_len % tp:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by tensor_parallel_size={tp}: "
            "train.dist.sequence_parallel=True splits every sequence over the tensor-parallel "
            f"ranks. Use sequences whose length is a multiple of {tp} (pad them), or set "
            "train.dist.sequence_parallel=False."
        )


def gather_from_sp(x: torch.Tensor, group) -> torch.Tensor:
    """Enter a tensor-parallel region from the sequence-parallel one.

    ``[S(0), S(1)] -> all-gather -> [S(0), B]``; backward: the region's input gradient is a
    partial sum over tp, ``[S(0), P] -> reduce-scatter -> [S(0), S(1)]``.
    """
    return x if group is None else _GatherWithGrad.apply(x, SEQ_DIM, group)


def reduce_scatter_to_sp(x: torch.Tensor, group) -> torch.Tensor:
    """Leave a row-parallel region into the sequence-parallel one (or leave a vocab-parallel
    embedding): ``[S(0), P] -> reduce-scatter -> [S(0), S(1)]``; backward all-gathers.

    One reduce-scatter collective; on gloo PyTorch runs it as an all-reduce plus this rank's
    chunk (see :func:`_reduce_scatter`).
    """
    if group is None:
        return x
    check_sequence_split(x.shape[SEQ_DIM], torch_dist.get_world_size(group))
    return _ReduceScatterToSP.apply(x, group)


def scatter_to_sp(x: torch.Tensor, group) -> torch.Tensor:
    """``[S(0), B] -> [S(0), S(1)]``: this rank's chunk of the sequence (also for position
    ids, which need no gradient); backward all-gathers."""
    if group is None:
        return x
    check_sequence_split(x.shape[SEQ_DIM], torch_dist.get_world_size(group))
    return _ScatterToTP.apply(x, SEQ_DIM, group)
