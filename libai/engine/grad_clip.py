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


class _Term:
    """A parameter's norm term computed elsewhere (ZeRO stage 2: on its owner dp rank)."""

    def __init__(self, p: torch.Tensor, value: torch.Tensor):
        self.value, self.sharded = value, _is_tp_sharded(p)
        self.libai_tied_copy = getattr(p, "libai_tied_copy", False)


def _term(grad: torch.Tensor, norm_type: float) -> torch.Tensor:
    g = grad.to_local() if isinstance(grad, DTensor) else grad
    if norm_type == float("inf"):
        return g.detach().abs().max().float()
    return g.detach().float().norm(norm_type) ** norm_type


def _gather_dp_sharded_terms(parameters, norm_type: float) -> list[_Term]:
    """Every parameter's term on every dp rank: 0 where a rank holds no gradient, then a sum
    over dp (exact: one rank holds it), so the total adds the terms in parameter order."""
    util = dist.get_dist_util()
    zero = torch.zeros((), device=util.device, dtype=torch.float32)
    terms = torch.stack([zero if p.grad is None else _term(p.grad, norm_type) for p in parameters])
    torch_dist.all_reduce(terms, group=util.dp_group)
    return [_Term(p, value) for p, value in zip(parameters, terms.unbind())]


def clip_grad_norm_(
    parameters, max_norm: float, norm_type: float = 2.0, *, dp_sharded: bool = False
) -> torch.Tensor:
    """Clip gradients in place so that their global norm is at most ``max_norm``.

    The norm is that of the single-process model: tp-sharded gradients contribute their
    shard on every tp rank (summed over tp), replicated ones once, every pipeline stage its
    own parameters (summed over pp) and a tied copy on the last stage not at all. Gradients
    are already averaged over dp, so dp ranks agree. With ``dp_sharded`` (ZeRO stage 2) each
    dp rank holds the gradients of a disjoint part of ``parameters`` (the others are None):
    the per-parameter terms are then summed over dp first, so the norm adds them in the same
    order as without sharding (bitwise equal). Returns the total norm (same on all ranks), a
    tensor: nothing in here waits for the device.
    """
    util = dist.get_dist_util()
    parameters = list(parameters)
    params = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    if dp_sharded and util.dp_group is not None:
        parameters = _gather_dp_sharded_terms(parameters, norm_type)
    device = util.device
    sharded = torch.zeros((), device=device, dtype=torch.float32)
    replicated = torch.zeros((), device=device, dtype=torch.float32)
    for p in parameters:
        if getattr(p, "libai_tied_copy", False):
            continue  # the last stage's copy of a weight already counted on the first stage
        if isinstance(p, _Term):
            value = p.value
        elif p.grad is None:
            continue
        else:
            value = _term(p.grad, norm_type)
        if p.sharded if isinstance(p, _Term) else _is_tp_sharded(p):
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
    # no host read of the norm: the factor is clamped to 1 on the device (x * 1.0 == x, so
    # the gradients of a step that needs no clipping are unchanged to the bit)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    if grads:
        torch._foreach_mul_(grads, coef)
    return total
