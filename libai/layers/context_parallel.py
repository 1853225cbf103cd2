"""Context parallelism: each sequence split over the ``cp`` ranks, attention across them.

**Layout (head-tail).** A sequence of ``S`` tokens is cut into ``2 x cp`` equal chunks; cp
rank ``r`` holds chunks ``r`` and ``2 cp - 1 - r``, in that order. Under a causal mask a
query's work grows with its position, so pairing an early chunk with a late one gives every
rank the same work (Megatron-Core's and Llama 3's load balancing). Activations between the
attention layers are ``[batch, S / cp, hidden]``: ``[S(0), S(1)]`` over (dp, cp).

**Attention (all-gathered K/V).** Each rank projects queries, keys and values for its own
tokens (RoPE at their global positions, :func:`shard_positions`); keys and values are
all-gathered over cp (``[S(1)] -> [B]``; backward reduce-scatters their gradients) and put
back in sequence order; the rank's queries then attend to the whole sequence with the mask
of their global positions (causal: key position <= query position). Without a padding mask
each query chunk attends only to the keys up to its end (:func:`causal_share_attention`),
so every rank computes the same number of score blocks. This is Llama 3's
training recipe; it needs only all-gather and reduce-scatter, so it runs on gloo as on NCCL.
Bidirectional attention is the same without the causal mask.

Everything here is a no-op for ``group=None`` (cp == 1).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from libai.layers.collectives import all_gather_with_grad


def check_context_split(seq_len: int, cp: int) -> None:
    """Raise before any collective unless ``seq_len`` splits into ``2 x cp`` chunks."""
    if seq_len % (2 * cp):
        raise ValueError(
            f"sequence length {seq_len} does not split over context_parallel_size={cp}: the "
            f"head-tail layout cuts every sequence into 2 x cp = {2 * cp} equal chunks. Use "
            f"sequences whose length is a multiple of {2 * cp} (pad them), or change "
            "train.dist.context_parallel_size."
        )


def shard_positions(seq_len: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """The global positions (``[seq_len / cp]``, int64) cp rank ``rank`` holds: chunk
    ``rank`` then chunk ``2 cp - 1 - rank`` of the ``2 x cp`` chunks."""
    check_context_split(seq_len, cp)
    chunk = seq_len // (2 * cp)
    starts = (rank * chunk, (2 * cp - 1 - rank) * chunk)
    return torch.cat([torch.arange(s, s + chunk, device=device) for s in starts])


def shard_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """``[B] -> [S(dim)]``: rank ``rank``'s head-tail share of ``x`` along ``dim``."""
    if cp == 1:
        return x
    positions = shard_positions(x.shape[dim], cp, rank, device=x.device)
    return x.index_select(dim, positions)


def gather_sequence(x: torch.Tensor, group, dim: int) -> torch.Tensor:
    """``[S(dim)] -> [B]``: every cp rank's share of ``x`` along ``dim``, in sequence order
    (one all-gather; backward: each share's gradient summed over the ranks, a reduce-scatter).
    ``group=None`` returns ``x``."""
    if group is None:
        return x
    cp = torch_dist.get_world_size(group)
    gathered = all_gather_with_grad(x, group, dim)  # rank order: [r's head, r's tail] each
    return gathered.index_select(dim, _sequence_order(gathered.shape[dim], cp, x.device))


@functools.lru_cache(maxsize=64)
def _sequence_order(seq_len: int, cp: int, device: torch.device) -> torch.Tensor:
    """The index putting the cp ranks' shares (concatenated in rank order) back in sequence
    order; computed once per (length, cp, device), not on every layer of every step."""
    held = torch.cat([shard_positions(seq_len, cp, r) for r in range(cp)])
    return torch.argsort(held).to(device)


def causal_keep(query_positions: torch.Tensor, key_len: int) -> torch.Tensor:
    """``[q, key_len]`` bool: query at global position ``p`` sees keys ``0 .. p``."""
    keys = torch.arange(key_len, device=query_positions.device)
    return query_positions[:, None] >= keys[None, :]


def causal_share_attention(q, k, v, cp: int, rank: int, **sdpa_kwargs) -> torch.Tensor:
    """Causal attention of cp rank ``rank``'s queries (its two chunks, ``[b, h, 2c, d]``)
    against the gathered keys and values of the whole sequence (``[b, h', 2 cp c, d]``).

    Each chunk attends only to the keys up to its own end (the later keys are masked for all
    of it), so rank ``r`` computes ``(r + 1) + (2 cp - r)`` key blocks per query block: the
    same ``2 cp + 1`` on every rank -- the point of the head-tail layout.
    ``sdpa_kwargs`` go to ``scaled_dot_product_attention`` (dropout, scale, GQA).
    """
    chunk = q.shape[2] // 2
    outs = []
    for j, index in enumerate((rank, 2 * cp - 1 - rank)):
        end = (index + 1) * chunk
        # query i of the chunk sees keys 0 .. end - chunk + i: PyTorch's lower-right causal
        # bias (fused flash / memory-efficient kernels on CUDA, a boolean mask on CPU)
        bias = causal_lower_right(chunk, end)
        q_j = q[:, :, j * chunk : (j + 1) * chunk]
        outs.append(
            F.scaled_dot_product_attention(q_j, k[:, :, :end], v[:, :, :end], bias, **sdpa_kwargs)
        )
    return torch.cat(outs, dim=2)
