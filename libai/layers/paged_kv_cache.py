"""A paged KV cache: keys and values in fixed-size blocks shared by many sequences.

The serving engine (:mod:`libai.serving`) runs one forward per step over the new tokens of
every running sequence packed into one row ``[1, N]`` (a prompt chunk of one sequence, one
decode token of another, ...). Each layer keeps a pool of ``num_blocks * block_size`` slots
(``[slots, local_kv_heads, head_size]``; tensor-parallel ranks hold their heads only); a
sequence owns a list of blocks (its block table), its token at position ``p`` living in slot
``table[p // block_size] * block_size + p % block_size``.

:class:`PagedStep` is the bookkeeping of one step, computed once and shared by the layers:
where each new token is written (``slot_mapping``), which slots each sequence reads
(``context_slots``), and the mask. :meth:`PagedLayerKVCache.attend` writes the step's keys and
values into the pool, gathers each sequence's context from its blocks and runs attention
per sequence (``[sequences, heads, longest new, longest context]`` through SDPA, the
queries of a sequence seeing its own cached and new keys up to their position), then puts
the outputs back in packed order. Blocks are given out and taken back by the engine's
allocator; the cache only stores.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from libai.layers.kv_cache import KVCache, LayerKVCache


class PagedStep:
    """One step's layout over the pool, for sequences ``i = 0 .. S-1`` whose new tokens sit
    consecutively in the packed row: sequence ``i`` brings ``new[i]`` tokens at positions
    ``start[i] .. start[i] + new[i] - 1`` and owns the blocks ``tables[i]``.

    Tensors (on ``device``): ``slot_mapping [N]`` the slot each new token is written to;
    ``context_slots [S, C]`` the slots of each sequence's positions ``0 .. start + new - 1``
    (padded); ``query_index [S, Q]`` the packed index of each sequence's ``j``-th new token
    (``N`` = a zero row for padding); ``packed [N]`` where each packed token lands in the
    flattened ``[S * Q]`` grid; ``keep [S, 1, Q, C]`` key slot ``c`` visible to new token
    ``j`` iff ``c <= start + j`` (padding queries see slot 0, so no row is all masked).
    """

    def __init__(
        self,
        starts: Sequence[int],
        new: Sequence[int],
        tables: Sequence[Sequence[int]],
        block_size: int,
        device=None,
    ):
        if not (len(starts) == len(new) == len(tables)) or not starts:
            raise ValueError("a paged step needs one start, count and block table per sequence")
        self.num_tokens = total = sum(new)
        longest_new = max(new)
        longest_context = max(s + n for s, n in zip(starts, new))
        slot_mapping, context, query_index, packed = [], [], [], []
        offset = 0
        for i, (start, count, table) in enumerate(zip(starts, new, tables)):
            end = start + count
            if len(table) * block_size < end:
                raise ValueError(
                    f"sequence {i} needs {end} slots but its block table holds {len(table)} "
                    f"blocks of {block_size}"
                )
            slots = [table[p // block_size] * block_size + p % block_size for p in range(end)]
            slot_mapping += slots[start:]
            context.append(slots + [0] * (longest_context - end))
            query_index.append(
                list(range(offset, offset + count)) + [total] * (longest_new - count)
            )
            packed += [i * longest_new + j for j in range(count)]
            offset += count
        as_long = dict(dtype=torch.long, device=device)
        self.slot_mapping = torch.tensor(slot_mapping, **as_long)
        self.context_slots = torch.tensor(context, **as_long)
        self.query_index = torch.tensor(query_index, **as_long)
        self.packed = torch.tensor(packed, **as_long)
        position = torch.tensor(starts, **as_long)[:, None] + torch.arange(longest_new, **as_long)
        key = torch.arange(longest_context, **as_long)
        keep = key[None, None, :] <= position[:, :, None]  # [S, Q, C]
        real = torch.arange(longest_new, **as_long)[None, :] < torch.tensor(new, **as_long)[:, None]
        keep = keep & real[:, :, None]
        keep[:, :, 0] |= ~real  # padding queries: one visible slot, never an all-masked row
        self.keep = keep[:, None]


class PagedLayerKVCache(LayerKVCache):
    """One layer's pool (allocated on the first write, with the keys' heads, size and
    dtype); attention through it is :meth:`attend`."""

    def __init__(self, owner: PagedKVCache):
        super().__init__(None)
        self.owner = owner

    def attend(self, q, k, v, *, scale=None, enable_gqa=False) -> torch.Tensor:
        """``q [1, heads, N, d]``, ``k``/``v [1, kv_heads, N, d]`` of the step's packed new
        tokens -> the attention output ``[1, heads, N, d]``: the new keys and values are
        written to their slots, each sequence attends over its own slots."""
        step = self.owner.step
        if step is None or q.shape[0] != 1 or q.shape[2] != step.num_tokens:
            raise ValueError(
                "a paged KV cache runs one packed row per step: set cache.step first "
                f"(q has shape {tuple(q.shape)})"
            )
        if self._keys is None:
            slots = self.owner.num_blocks * self.owner.block_size
            self._keys = k.new_zeros(slots, k.shape[1], k.shape[3])
            self._values = v.new_zeros(slots, v.shape[1], v.shape[3])
        # write: [1, KV, N, d] -> [N, KV, d] at the step's slots
        self._keys[step.slot_mapping] = k[0].transpose(0, 1).to(self._keys.dtype)
        self._values[step.slot_mapping] = v[0].transpose(0, 1).to(self._values.dtype)
        # read: each sequence's context [S, C, KV, d] -> [S, KV, C, d]
        keys = self._keys[step.context_slots].transpose(1, 2).to(q.dtype)
        values = self._values[step.context_slots].transpose(1, 2).to(q.dtype)
        # the packed queries [N, H, d] (+ a zero row for padding) -> [S, H, Q, d]
        rows = q[0].transpose(0, 1)
        rows = torch.cat([rows, rows.new_zeros(1, *rows.shape[1:])])
        queries = rows[step.query_index].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=step.keep, scale=scale, enable_gqa=enable_gqa
        )
        # [S, H, Q, d] -> [S * Q, H, d] -> the packed tokens [N, H, d] -> [1, H, N, d]
        sequences, heads, longest_new, size = out.shape
        out = out.transpose(1, 2).reshape(sequences * longest_new, heads, size)
        return out[step.packed].transpose(0, 1)[None]

    def update(self, keys, values):
        raise TypeError("a paged KV cache is read through attend(), not update()")

    def reorder(self, index) -> None:
        raise TypeError("a paged KV cache has no batch rows to reorder")


class PagedKVCache(KVCache):
    """The pools of the layers on this rank: ``num_blocks`` blocks of ``block_size`` slots
    each; before each forward the engine sets :attr:`step` (a :class:`PagedStep`).
    Models read positions from ``position_ids``, never from the cache."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"a paged KV cache needs num_blocks >= 1 and block_size >= 1, got "
                f"{num_blocks} and {block_size}"
            )
        super().__init__(None)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.layers: dict[int, PagedLayerKVCache] = {}
        self.step: PagedStep | None = None

    def layer(self, layer_idx: int) -> PagedLayerKVCache:
        if layer_idx not in self.layers:
            self.layers[layer_idx] = PagedLayerKVCache(self)
        return self.layers[layer_idx]

    def get_seq_length(self) -> int:
        return 0  # many sequences of their own lengths: positions come as tensors
