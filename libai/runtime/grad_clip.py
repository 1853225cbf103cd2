"""Gradient clipping by the global norm over every tp shard and pipeline stage."""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor, Shard

from libai import dist


def _is_tp_sharded(p: torch.Tensor, util) -> bool:
    """Whether ``p`` is sharded over the ``tp`` dim of its mesh (the stage's (dp, tp) mesh,
    or the (dp, tp) / (dp_replicate, dp_shard, tp) mesh of a ZeRO-3 parameter)."""
    if not isinstance(p, DTensor):
        return False
    names = p.device_mesh.mesh_dim_names or util.stage_dims
    return any(isinstance(pl, Shard) and names[i] == "tp" for i, pl in enumerate(p.placements))


def _is_expert(p: torch.Tensor) -> bool:
    return bool(getattr(p, "libai_expert", False))


def _terms(grads: list[torch.Tensor], norm_type: float) -> list[torch.Tensor]:
    """Each gradient's fp32 norm term (``|g|_p ** p``, or ``max |g|`` for inf) of its local
    shard, from one multi-tensor kernel (``torch._foreach_norm``) instead of one per
    gradient."""
    if not grads:
        return []
    local = [(g.to_local() if isinstance(g, DTensor) else g).detach() for g in grads]
    norms = torch._foreach_norm(local, norm_type, dtype=torch.float32)
    if norm_type == float("inf"):
        return list(norms)
    return list(torch._foreach_pow(norms, norm_type))


def _combine(terms: list[torch.Tensor], norm_type: float, device) -> torch.Tensor:
    """Norm terms combined into one fp32 scalar: their sum, or their max for inf (0 for
    none)."""
    if not terms:
        return torch.zeros((), device=device, dtype=torch.float32)
    stacked = torch.stack(terms)
    return stacked.max() if norm_type == float("inf") else stacked.sum()


def _parameter_terms(
    parameters: list, norm_type: float, dp_sharded: bool, util, group=None
) -> list:
    """One fp32 norm term per parameter in parameter order, 0 for a parameter without a
    gradient. With ``dp_sharded`` (ZeRO stage 2: a dp rank holds the gradients of its own
    part only; stage 3: a piece of each) they are summed over ``group`` (default: the dp
    ranks, times cp under context parallel: the mesh's gradient group); for
    stage 2 that is exact (one rank holds each), so the terms and their sum equal those of
    an unsharded run to the bit."""
    held = [p for p in parameters if p.grad is not None]
    computed = dict(zip(map(id, held), _terms([p.grad for p in held], norm_type)))
    zero = torch.zeros((), device=util.device, dtype=torch.float32)
    terms = [computed.get(id(p), zero) for p in parameters]
    group = util.grad_group if group is None else group
    if dp_sharded and group is not None and terms:
        stacked = torch.stack(terms)
        torch_dist.all_reduce(stacked, group=group)
        terms = list(stacked.unbind())
    return terms


def clip_grad_norm_(
    parameters,
    max_norm: float,
    norm_type: float = 2.0,
    *,
    dp_sharded: bool = False,
    shard_group=None,
    util=None,
) -> torch.Tensor:
    """Clip gradients in place so that their global norm is at most ``max_norm``.

    The norm is that of the single-process model: tp-sharded gradients contribute their
    shard on every tp rank (summed over tp), replicated ones once, every pipeline stage its
    own parameters (summed over pp) and a tied copy on the last stage not at all. Gradients
    are already averaged over dp, so dp ranks agree. With ``dp_sharded`` (ZeRO stage 2) each
    dp rank holds the gradients of a disjoint part of ``parameters`` (the others are None):
    the per-parameter terms are then summed over dp first, so the norm adds them in the same
    order as without sharding (bitwise equal). ZeRO-3 passes ``shard_group``: the ranks
    whose gradient pieces make up a whole (HSDP's shard group; dp otherwise). Returns the
    total norm (same on all ranks), a tensor: nothing in here waits for the device. ``util``:
    the mesh of the parameters (default the current one).
    """
    util = util or dist.get_dist_util()
    parameters = list(parameters)
    params = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    # the last stage's copy of a tied weight is already counted on the first stage
    counted = [p for p in parameters if not getattr(p, "libai_tied_copy", False)]
    op = torch_dist.ReduceOp.MAX if norm_type == float("inf") else torch_dist.ReduceOp.SUM
    # expert weights split over ep (libai.layers.moe): each ep rank counts its own experts
    # (ZeRO leaves them whole on their rank: no dp sum), summed over the ep group
    ep_group = getattr(util, "ep_group", None)
    expert_params = [p for p in counted if ep_group is not None and _is_expert(p)]
    counted = [p for p in counted if not (ep_group is not None and _is_expert(p))]
    experts = _combine(
        _terms([p.grad for p in expert_params if p.grad is not None], norm_type),
        norm_type,
        util.device,
    )
    if expert_params:
        torch_dist.all_reduce(experts, op=op, group=ep_group)
    terms = _parameter_terms(counted, norm_type, dp_sharded, util, shard_group)
    is_sharded = [_is_tp_sharded(p, util) for p in counted]
    sharded = _combine([t for t, s in zip(terms, is_sharded) if s], norm_type, util.device)
    replicated = _combine([t for t, s in zip(terms, is_sharded) if not s], norm_type, util.device)
    replicated = (
        torch.maximum(replicated, experts)
        if op == torch_dist.ReduceOp.MAX
        else (replicated + experts)
    )
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
