"""The KV cache of generation: an explicit object handed to ``forward``, never module state.

A :class:`KVCache` holds, per layer index on this rank, the keys and values of the tokens
seen so far (``[batch, local_kv_heads, length, head_size]``: tensor-parallel ranks keep only
their heads, and grouped-query models only their kv heads, never the repeated query heads)
and, for decoder cross-attention, the keys/values of the encoder output, computed once.

Self-attention buffers are preallocated to ``max_length`` positions when it is known, so a
decoding step writes one slot instead of concatenating (and copying) the whole history;
without ``max_length`` they grow by doubling.
"""

from __future__ import annotations

import torch

KVPair = tuple[torch.Tensor, torch.Tensor]


class LayerKVCache:
    """One layer's cache: self-attention keys/values (``update``) and cross-attention keys/
    values (``cross``, set on the first step)."""

    def __init__(self, max_length: int | None = None):
        self.max_length = max_length
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.cross: KVPair | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> KVPair:
        """Append ``[batch, kv_heads, new, head_size]`` keys/values; returns all of them."""
        end = self.length + keys.shape[2]
        if self._keys is None or end > self._keys.shape[2]:
            self._grow(keys, values, end)
        self._keys[:, :, self.length : end] = keys
        self._values[:, :, self.length : end] = values
        self.length = end
        return self._keys[:, :, :end], self._values[:, :, :end]

    def _grow(self, keys: torch.Tensor, values: torch.Tensor, needed: int) -> None:
        if self.max_length is not None and needed <= self.max_length:
            capacity = self.max_length
        else:  # unknown or exceeded: double
            capacity = max(needed, 2 * self.length)
        b, h, _, d = keys.shape
        new_k = keys.new_empty(b, h, capacity, d)
        new_v = values.new_empty(b, h, capacity, values.shape[-1])
        if self._keys is not None and self.length:
            new_k[:, :, : self.length] = self._keys[:, :, : self.length]
            new_v[:, :, : self.length] = self._values[:, :, : self.length]
        self._keys, self._values = new_k, new_v

    def get(self) -> KVPair | None:
        """The cached self-attention keys/values (views), or None when empty."""
        if self._keys is None:
            return None
        return self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""
        if self._keys is not None:
            self._keys = self._keys.index_select(0, index)
            self._values = self._values.index_select(0, index)
        if self.cross is not None:
            self.cross = (
                self.cross[0].index_select(0, index),
                self.cross[1].index_select(0, index),
            )


class KVCache:
    """Per-layer caches of the layers held by this rank, keyed by global layer index.

    Pass it as ``past_key_values`` to a model's forward; each layer reads and extends its
    entry. ``max_length`` (prompt + new tokens) preallocates the buffers.
    """

    def __init__(self, max_length: int | None = None):
        self.max_length = max_length
        self.layers: dict[int, LayerKVCache] = {}

    def layer(self, layer_idx: int) -> LayerKVCache:
        """The cache of ``layer_idx`` (created empty on first use)."""
        if layer_idx not in self.layers:
            self.layers[layer_idx] = LayerKVCache(self.max_length)
        return self.layers[layer_idx]

    def get_seq_length(self) -> int:
        """Tokens cached so far (0 when empty or when this rank holds no layer)."""
        return max((c.length for c in self.layers.values()), default=0)

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` in every layer (beam search)."""
        for cache in self.layers.values():
            cache.reorder(index)


def layer_past(past_key_values, position: int, layer):
    """The past of one layer from either a :class:`KVCache` (by the layer's global
    ``layer_idx``) or a legacy list of per-layer pairs (by ``position`` in this stage's layer
    order)."""
    if past_key_values is None:
        return None
    if isinstance(past_key_values, KVCache):
        return past_key_values.layer(layer.layer_idx)
    return past_key_values[position]


def past_length(past_key_values) -> int:
    """Cached tokens of a :class:`KVCache` or a legacy list (``[0][0][0]`` is layer 0's keys)."""
    if past_key_values is None:
        return 0
    if isinstance(past_key_values, KVCache):
        return past_key_values.get_seq_length()
    first = past_key_values[0]
    keys = first[0][0] if isinstance(first[0], tuple) else first[0]
    return keys.shape[2]
