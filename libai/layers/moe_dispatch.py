"""Token movement of a Mixture-of-Experts layer: capacity, permutation, expert parallel.

- :func:`capacity_keep`: which routed assignments fit their expert's capacity (GShard's
  token dropping, per sequence); :class:`PaddedSlots`: the same with every expert's buffer
  padded to its capacity (static shapes);
- :class:`Permutation`: the assignments sorted by expert, so each expert's tokens are contiguous;
- :func:`exchange`: expert parallel: each rank sends every expert's tokens to the rank
  holding that expert (``all_to_all_single``, counts first, then tokens), runs its experts,
  and sends the results back (:func:`exchange_padded`: the padded buffers, equal splits).
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


def capacity_slots(experts: torch.Tensor, num_experts: int, tp_group=None) -> torch.Tensor:
    """``experts [batch, seq, k]`` -> ``slot [batch, seq, k]``: each assignment's place in its
    expert's queue for its sequence, in GShard's priority: first-choice assignments before
    second-choice ones and, within a choice, earlier positions first.

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
    return (slot * one_hot).sum(-1).transpose(1, 2)  # [batch, seq, k]


def capacity_keep(
    experts: torch.Tensor, num_experts: int, capacity: int, tp_group=None
) -> torch.Tensor:
    """``experts [batch, seq, k]`` -> ``keep [batch, seq, k]`` (bool): an expert takes at most
    ``capacity`` assignments per sequence in :func:`capacity_slots`' order; the rest are
    dropped (the token keeps only its residual and the other choices)."""
    return capacity_slots(experts, num_experts, tp_group) < capacity


class PaddedSlots:
    """Capacity mode with static shapes (``moe.pad_to_capacity``): every expert gets a buffer
    of exactly ``batch * capacity`` rows (``capacity`` per sequence), zero where no token
    came; the dropped assignments point at one extra zero row. No host sync and no
    data-dependent shape, so the step can be captured (CUDA graphs, ``fullgraph`` compile)
    and exported.

    ``index[n]`` is the buffer row of flat assignment ``n`` (``E * batch * capacity`` when
    dropped); :meth:`gather` builds the ``[E, batch * capacity, H]`` buffer and
    :meth:`scatter` reads each assignment's output back.
    """

    def __init__(self, experts: torch.Tensor, slot: torch.Tensor, num_experts: int, capacity):
        batch = experts.shape[0]
        self.rows = num_experts * batch * capacity  # the buffer's rows, all experts
        self.shape = (num_experts, batch * capacity)
        sequence = torch.arange(batch, device=experts.device)[:, None, None]
        index = experts * (batch * capacity) + sequence * capacity + slot
        self.keep = slot < capacity
        self.index = torch.where(self.keep, index, self.rows).reshape(-1)
        self.top_k = experts.shape[-1]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, H]`` -> ``[E, batch * capacity, H]``: each kept assignment's token in its
        expert's row, zeros elsewhere."""
        tokens = x.shape[0]
        assignment_token = torch.arange(self.index.numel(), device=x.device) // self.top_k
        # which token fills each buffer row (``tokens``: the zero row); the dropped ones all
        # land on the extra last row, which is cut off
        row_token = torch.full((self.rows + 1,), tokens, device=x.device, dtype=torch.long)
        row_token = row_token.scatter(0, self.index, assignment_token)[: self.rows]
        padded = torch.cat([x, x.new_zeros(1, x.shape[1])])
        return padded[row_token].view(*self.shape, x.shape[1])

    def scatter(self, out: torch.Tensor) -> torch.Tensor:
        """``out [E, batch * capacity, H]`` -> ``[T * k, H]``: each assignment's output (zero
        for the dropped ones)."""
        flat = out.reshape(self.rows, out.shape[-1])
        return torch.cat([flat, flat.new_zeros(1, flat.shape[1])])[self.index]


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

    def inverse(self) -> torch.Tensor:
        """Where each flat assignment ``[T * k]`` sits in the sorted order (every assignment
        kept)."""
        inverse = torch.empty_like(self.order)
        inverse[self.order] = torch.arange(self.order.numel(), device=self.order.device)
        return inverse


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


def exchange_padded(buffer: torch.Tensor, group, run_experts) -> torch.Tensor:
    """Expert parallel with static shapes: ``buffer [E, C, H]`` (every expert's padded rows
    from this rank) -> the experts' outputs, same shape. Every rank sends ``E / ep * C`` rows
    to each rank, so no counts travel and the splits are equal.

    ``run_experts(rows [E / ep, ep * C, H])`` runs this rank's experts on the rows of every
    source rank.
    """
    ep = torch_dist.get_world_size(group)
    experts, capacity, width = buffer.shape
    local = experts // ep
    equal = [local * capacity] * ep
    flat = buffer.reshape(-1, width)
    # [E by destination, C] -> all-to-all -> [ep sources, E / ep, C] of this rank's experts
    rows = _AllToAll.apply(flat, equal, equal, group).view(ep, local, capacity, width)
    out = run_experts(rows.transpose(0, 1).reshape(local, ep * capacity, width))
    out = out.view(local, ep, capacity, width).transpose(0, 1).reshape(-1, width)
    # [S(0) by source] -> all-to-all -> [S(0) by destination]: this rank's rows back
    return _AllToAll.apply(out, equal, equal, group).view(experts, capacity, width)
