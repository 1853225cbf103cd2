"""Token movement of a Mixture-of-Experts layer: capacity, permutation, expert parallel.

- :func:`capacity_keep`: which routed assignments fit their expert's capacity (GShard's
  token dropping, per sequence);
- :func:`permute`: the assignments sorted by expert, so each expert's tokens are contiguous;
- :func:`exchange`: expert parallel: each rank sends every expert's tokens to the rank
  holding that expert (``all_to_all_single``, counts first, then tokens), runs its experts,
  and sends the results back.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F

from libai.layers.collectives import _all_gather


def expert_capacity(capacity_factor: float, seq_len: int, top_k: int, num_experts: int) -> int:
    """GShard's capacity of each expert for one sequence: ``ceil(cf * seq * k / E)``."""
    return math.ceil(capacity_factor * seq_len * top_k / num_experts)


def capacity_keep(
    experts: torch.Tensor, num_experts: int, capacity: int, tp_group=None
) -> torch.Tensor:
    """``experts [batch, seq, k]`` -> ``keep [batch, seq, k]`` (bool): an expert takes at most
    ``capacity`` assignments per sequence, first-choice assignments before second-choice
    ones and, within a choice, earlier positions first (GShard's priority); the rest are
    dropped (the token keeps only its residual and the other choices).

    Under sequence parallel (``tp_group``) ``experts`` is this rank's share of the sequence
    (the shares in tp-rank order): the counts of the shares are gathered so every rank
    numbers its assignments as one process would.
    """
    one_hot = F.one_hot(experts, num_experts).transpose(1, 2)  # [batch, k, seq, E]
    position = one_hot.cumsum(2) - one_hot  # earlier assignments of the same choice, here
    counts = one_hot.sum(2)  # [batch, k, E]
    earlier_shares = torch.zeros_like(counts)
    if tp_group is not None:
        shares = _all_gather(counts[None], 0, tp_group)  # [tp, batch, k, E]
        rank = torch_dist.get_rank(tp_group)
        earlier_shares = shares[:rank].sum(0)
        counts = shares.sum(0)
    earlier_choices = counts.cumsum(1) - counts  # assignments of better choices, all shares
    slot = position + (earlier_choices + earlier_shares)[:, :, None, :]
    slot = (slot * one_hot).sum(-1)  # [batch, k, seq]
    return (slot < capacity).transpose(1, 2)


class Permutation:
    """The kept assignments of ``T`` tokens sorted by expert.

    ``tokens[n]`` is the token of the n-th sorted assignment, ``order[n]`` its flat index in
    ``[T * k]``, ``counts[e]`` the assignments of expert ``e``.
    """

    def __init__(self, experts: torch.Tensor, num_experts: int, keep: torch.Tensor | None):
        top_k = experts.shape[-1]
        flat = experts.reshape(-1)
        if keep is not None:  # dropped assignments sort last, under a sentinel expert
            flat = torch.where(keep.reshape(-1), flat, num_experts)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=num_experts + 1)[:num_experts]
        if keep is not None:
            order = order[: int(counts.sum())]  # the kept ones (a host sync)
        self.order, self.counts, self.tokens = order, counts, order // top_k


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows: rank r sends ``x[rows of split j]`` to rank j; the
    backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        torch_dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        torch_dist.all_to_all_single(
            back, grad.contiguous(), in_splits, out_splits, group=ctx.group
        )
        return back, None, None, None


def exchange(x: torch.Tensor, counts: torch.Tensor, group, run_experts) -> torch.Tensor:
    """Expert parallel over ``group`` (``ep`` ranks, rank r holding experts
    ``[r * E / ep, (r + 1) * E / ep)``): ``x`` is this rank's assignments sorted by expert
    (``counts [E]`` of each); returns the experts' outputs in the same order.

    ``run_experts(rows, local_counts)`` runs this rank's experts on rows grouped by local
    expert. Steps: the counts are exchanged first (each rank learns how many rows it will
    receive for each of its experts), then the rows; the received rows (grouped by source
    rank) are regrouped by local expert, run, put back in source order and returned.
    """
    ep = torch_dist.get_world_size(group)
    local = counts.numel() // ep
    # [E] counts by destination -> [ep, E / ep] counts by source, for this rank's experts
    received = torch.empty_like(counts)
    torch_dist.all_to_all_single(received, counts.contiguous(), group=group)
    received = received.view(ep, local)
    in_splits = counts.view(ep, local).sum(1).tolist()
    out_splits = received.sum(1).tolist()
    # [S(0) by destination] -> all-to-all -> [S(0) by source, each grouped by local expert]
    rows = _AllToAll.apply(x, out_splits, in_splits, group)
    expert_of_row = torch.repeat_interleave(
        torch.arange(local, device=counts.device).repeat(ep), received.reshape(-1)
    )
    by_expert = torch.argsort(expert_of_row, stable=True)
    out = run_experts(rows[by_expert], received.sum(0))
    out = out[torch.argsort(by_expert)]  # back to source order
    # [S(0) by source] -> all-to-all -> [S(0) by destination]: each rank's own rows
    return _AllToAll.apply(out, in_splits, out_splits, group)
