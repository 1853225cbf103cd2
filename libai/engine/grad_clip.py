"""Gradient clipping by the global norm over every tp shard and pipeline stage."""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor, Shard

from libai.utils import distributed as dist


def _is_tp_sharded(p: torch.Tensor) -> bool:
    if not isinstance(p, DTensor):
        return False
    util = dist.get_dist_util()
    return any(
        isinstance(pl, Shard) and util.stage_dims[i] == "tp" for i, pl in enumerate(p.placements)
    )


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip gradients in place so that their global norm is at most ``max_norm``.

    The norm is that of the single-process model: tp-sharded gradients contribute their
    shard on every tp rank (summed over tp), replicated ones once, every pipeline stage its
    own parameters (summed over pp) and a tied copy on the last stage not at all. Gradients
    are already averaged over dp, so dp ranks agree. Returns the total norm (same on all ranks).
    """
    util = dist.get_dist_util()
    params = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    device = util.device
    sharded = torch.zeros((), device=device, dtype=torch.float32)
    replicated = torch.zeros((), device=device, dtype=torch.float32)
    for p in params:
        if getattr(p, "libai_tied_copy", False):
            continue  # the last stage's copy of a weight already counted on the first stage
        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        if norm_type == float("inf"):
            value = g.detach().abs().max().float()
        else:
            value = g.detach().float().norm(norm_type) ** norm_type
        if _is_tp_sharded(p):
            sharded = (
                torch.maximum(sharded, value) if norm_type == float("inf") else sharded + value
            )
        else:
            replicated = (
                torch.maximum(replicated, value)
                if norm_type == float("inf")
                else replicated + value
            )
    op = torch_dist.ReduceOp.MAX if norm_type == float("inf") else torch_dist.ReduceOp.SUM
    if util.tp_group is not None:
        torch_dist.all_reduce(sharded, op=op, group=util.tp_group)
    total = (
        torch.maximum(sharded, replicated) if norm_type == float("inf") else sharded + replicated
    )
    if util.pp_group is not None:
        torch_dist.all_reduce(total, op=op, group=util.pp_group)
    if norm_type != float("inf"):
        total = total ** (1.0 / norm_type)
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for p in params:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            g.mul_(coef)
    return total
