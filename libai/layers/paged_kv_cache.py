"""A paged KV cache: keys and values in fixed-size blocks shared by many sequences.

The serving engine (:mod:`libai.serving`) runs one forward per step over the new tokens of
every running sequence packed into one row ``[1, N]`` (a prompt chunk of one sequence, one
decode token of another, ...). Each layer keeps a pool of ``num_blocks * block_size`` slots
(``[blocks, block_size, local_kv_heads, head_size]``; tensor-parallel ranks hold their
heads only); a
sequence owns a list of blocks (its block table), its token at position ``p`` living in slot
``table[p // block_size] * block_size + p % block_size``.

:class:`PagedStep` is the bookkeeping of one step, computed once and shared by the layers:
where each new token is written (``slot_mapping``) and how attention is grouped.
:meth:`PagedLayerKVCache.attend` writes the step's keys and values into the pool, then runs
attention per group: the decoding sequences (one new token each) as one batch over their
contexts gathered from their blocks (``[sequences, heads, 1, longest context]``), each
prompt chunk on its own (a prompt's first chunk over its own keys, causally), and puts the
outputs back in packed order. No sequence is padded to another's chunk. Blocks are given
out and taken back by the engine's allocator; the cache only stores.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from libai.layers.kv_cache import KVCache, LayerKVCache


def _blocks_of(table: Sequence[int], end: int, block_size: int) -> list[int]:
    """The blocks holding positions ``0 .. end - 1``."""
    return list(table[: -(-end // block_size)])


class _DecodeGroup:
    """The sequences that bring one token each, attended as one batch: ``tokens [s]`` their
    packed indices, ``blocks [s, B]`` each one's blocks (padded with block 0), ``visible
    [s, 1, 1, B * block_size]`` which of those slots hold its positions."""

    def __init__(self, tokens, blocks, lengths, block_size, device):
        longest = max(len(b) for b in blocks)
        as_long = dict(dtype=torch.long, device=device)
        self.tokens = torch.tensor(tokens, **as_long)
        self.blocks = torch.tensor([b + [0] * (longest - len(b)) for b in blocks], **as_long)
        slot = torch.arange(longest * block_size, **as_long)
        visible = slot[None] < torch.tensor(lengths, **as_long)[:, None]
        self.visible = visible[:, None, None]
        self._bias: dict[torch.dtype, torch.Tensor] = {}

    def bias(self, dtype) -> torch.Tensor:
        """The additive mask (0 / the dtype's min), built once per step and dtype."""
        if dtype not in self._bias:
            zero = torch.zeros((), dtype=dtype, device=self.visible.device)
            masked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=zero.device)
            self._bias[dtype] = torch.where(self.visible, zero, masked)
        return self._bias[dtype]


class _PrefillGroup:
    """One sequence bringing ``count > 1`` tokens (a prompt chunk) at positions ``start ..``:
    ``tokens`` its packed slice; ``blocks`` the blocks of positions ``0 .. start + count -
    1`` (None when ``start == 0``: the chunk attends to its own keys, causally) and
    ``keep [count, blocks * block_size]``: new token j sees slot c iff ``c <= start + j``."""

    def __init__(self, offset: int, start: int, count: int, blocks, block_size, device):
        self.tokens = slice(offset, offset + count)
        self.blocks = self.keep = None
        if start:
            self.blocks = torch.tensor(blocks, dtype=torch.long, device=device)
            width = len(blocks) * block_size
            keep = torch.ones(count, width, dtype=torch.bool, device=device)
            self.keep = keep.tril(start)


class PagedStep:
    """One step's layout over the pool, for sequences ``i = 0 .. S-1`` whose new tokens sit
    consecutively in the packed row: sequence ``i`` brings ``new[i]`` tokens at positions
    ``start[i] .. start[i] + new[i] - 1`` and owns the blocks ``tables[i]``.

    ``slot_mapping [N]`` is the slot each new token is written to. Attention runs in groups,
    so no sequence pads another: the decoding sequences (one token each) as one batch over
    their blocks, each prompt chunk on its own (the first chunk of a prompt over its own
    keys, causally, without reading the pool).
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
        self.num_tokens = sum(new)
        slot_mapping, decode_tokens, decode_blocks, decode_lengths = [], [], [], []
        self.prefills: list[_PrefillGroup] = []
        offset = 0
        for i, (start, count, table) in enumerate(zip(starts, new, tables)):
            end = start + count
            if len(table) * block_size < end:
                raise ValueError(
                    f"sequence {i} needs {end} slots but its block table holds {len(table)} "
                    f"blocks of {block_size}"
                )
            slot_mapping += [
                table[p // block_size] * block_size + p % block_size for p in range(start, end)
            ]
            blocks = _blocks_of(table, end, block_size)
            if count == 1:
                decode_tokens.append(offset)
                decode_blocks.append(blocks)
                decode_lengths.append(end)
            else:
                self.prefills.append(
                    _PrefillGroup(offset, start, count, blocks, block_size, device)
                )
            offset += count
        self.slot_mapping = torch.tensor(slot_mapping, dtype=torch.long, device=device)
        self.decode = None
        if decode_tokens:
            self.decode = _DecodeGroup(
                decode_tokens, decode_blocks, decode_lengths, block_size, device
            )


class PagedLayerKVCache(LayerKVCache):
    """One layer's pool ``[blocks, block_size, local_kv_heads, head_size]`` (allocated on
    the first write, with the keys' heads, size and dtype); attention through it is
    :meth:`attend`."""

    def __init__(self, owner: PagedKVCache):
        super().__init__(None)
        self.owner = owner

    def attend(self, q, k, v, *, scale=None, enable_gqa=False) -> torch.Tensor:
        """``q [1, heads, N, d]``, ``k``/``v [1, kv_heads, N, d]`` of the step's packed new
        tokens -> the attention output ``[1, heads, N, d]``: the new keys and values are
        written to their slots, each sequence attends over its own blocks."""
        step = self.owner.step
        if step is None or q.shape[0] != 1 or q.shape[2] != step.num_tokens:
            raise ValueError(
                "a paged KV cache runs one packed row per step: set cache.step first "
                f"(q has shape {tuple(q.shape)})"
            )
        size = self.owner.block_size
        if self._keys is None:  # [blocks, block_size, KV, d]: a block is one contiguous run
            blocks = self.owner.num_blocks
            self._keys = k.new_zeros(blocks, size, k.shape[1], k.shape[3])
            self._values = v.new_zeros(blocks, size, v.shape[1], v.shape[3])
        # write: [KV, N, d] -> [N, KV, d] at the step's slots
        for pool, new in ((self._keys, k), (self._values, v)):
            flat = pool.view(-1, *pool.shape[2:])
            flat.index_copy_(0, step.slot_mapping, new[0].transpose(0, 1).to(pool.dtype))
        sdpa = dict(scale=scale, enable_gqa=enable_gqa)
        queries = q[0]  # [H, N, d]
        out = queries.new_empty(queries.shape[0], queries.shape[1], v.shape[-1])
        if step.decode is not None:
            group = step.decode
            # [s, B] blocks -> [s, KV, B * block_size, d]: each decoding sequence's context
            keys = self._read(self._keys, group.blocks, q.dtype)
            values = self._read(self._values, group.blocks, q.dtype)
            # [H, s, d] -> [s, KV, H / KV, d]: the query heads sharing a kv head (consecutive)
            # as that head's rows, so no key or value is repeated per query head
            heads, kv = queries.shape[0], keys.shape[1]
            one = queries[:, group.tokens].transpose(0, 1).reshape(-1, kv, heads // kv, q.shape[-1])
            got = F.scaled_dot_product_attention(
                one, keys, values, attn_mask=group.bias(q.dtype), scale=scale
            )  # [s, KV, H / KV, d]
            got = got.reshape(-1, heads, got.shape[-1]).transpose(0, 1)  # [H, s, d]
            if not step.prefills:  # every token decodes, in packed order
                return got[None]
            out[:, group.tokens] = got
        for group in step.prefills:
            chunk = queries[None, :, group.tokens]  # [1, H, n, d]
            if group.blocks is None:  # a prompt's first chunk: its own keys, causal
                got = F.scaled_dot_product_attention(
                    chunk, k[:, :, group.tokens], v[:, :, group.tokens], is_causal=True, **sdpa
                )
            else:
                keys = self._read(self._keys, group.blocks[None], q.dtype)
                values = self._read(self._values, group.blocks[None], q.dtype)
                got = F.scaled_dot_product_attention(
                    chunk, keys, values, attn_mask=group.keep, **sdpa
                )
            out[:, group.tokens] = got[0]
        return out[None]

    @staticmethod
    def _read(pool: torch.Tensor, blocks: torch.Tensor, dtype) -> torch.Tensor:
        """``blocks [s, B]`` of ``pool [blocks, size, KV, d]`` -> ``[s, KV, B * size, d]``."""
        s, b = blocks.shape
        got = pool.index_select(0, blocks.reshape(-1)).to(dtype)
        return got.view(s, b * pool.shape[1], *pool.shape[2:]).transpose(1, 2)

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
