"""Megatron's ``mpu`` as Rapidformer scripts use it (``from megatron import mpu`` inside a
``--user-script``): the ranks and sizes of the mesh, and :func:`broadcast_data`."""

from __future__ import annotations

import torch
import torch.distributed as torch_dist

from libai import dist

__all__ = [
    "broadcast_data",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
    "get_pipeline_model_parallel_rank",
    "get_pipeline_model_parallel_world_size",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
]

get_data_parallel_rank = dist.get_data_parallel_rank
get_data_parallel_world_size = dist.get_data_parallel_size
get_tensor_model_parallel_rank = dist.get_tensor_parallel_rank
get_tensor_model_parallel_world_size = dist.get_tensor_parallel_size
get_pipeline_model_parallel_rank = dist.get_pipeline_parallel_rank
get_pipeline_model_parallel_world_size = dist.get_pipeline_parallel_size


def _tp_source_rank(util) -> int:
    """The global rank of tensor-parallel rank 0 in this rank's tp group."""
    return torch_dist.get_global_rank(util.tp_group, 0)


def broadcast_data(keys: list[str], data: dict | None, datatype: torch.dtype) -> dict:
    """Megatron's ``mpu.broadcast_data``: ``data[key]`` of tensor-parallel rank 0, for each
    of ``keys``, sent to every rank of its tp group (the others may pass ``data=None``).
    Returns ``{key: tensor}`` of ``datatype`` on the run's device, the shapes of rank 0.

    Values are cast to ``datatype`` on rank 0 (Megatron asserts they have it; a cast keeps
    the peers from waiting on a rank that raised)."""
    util = dist.get_dist_util()
    device = util.device
    if util.tp_group is None:  # one tp rank: nothing to send
        return {k: torch.as_tensor(data[k]).to(device=device, dtype=datatype) for k in keys}
    group, src = util.tp_group, _tp_source_rank(util)
    is_src = util.tensor_parallel_rank == 0
    # 1. the shapes: [ndim, d0, d1, ...] per key, padded to a fixed width
    width = 8
    sizes = torch.zeros(len(keys), width, dtype=torch.int64, device=device)
    if is_src:
        tensors = [torch.as_tensor(data[k]).to(device=device, dtype=datatype) for k in keys]
        for i, t in enumerate(tensors):
            sizes[i, 0] = t.dim()
            sizes[i, 1 : 1 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    torch_dist.broadcast(sizes, src=src, group=group)
    shapes = [tuple(int(d) for d in row[1 : 1 + int(row[0])]) for row in sizes.tolist()]
    numels = [int(torch.Size(s).numel()) for s in shapes]
    # 2. the values: one flat buffer of every key
    if is_src:
        flat = torch.cat([t.contiguous().view(-1) for t in tensors])
    else:
        flat = torch.empty(sum(numels), dtype=datatype, device=device)
    torch_dist.broadcast(flat, src=src, group=group)
    out, offset = {}, 0
    for key, shape, n in zip(keys, shapes, numels):
        out[key] = flat[offset : offset + n].view(shape)
        offset += n
    return out
