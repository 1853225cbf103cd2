"""The KV cache of generation: an explicit object handed to ``forward``, never module state.

A :class:`KVCache` holds, per layer index on this rank, the keys and values of the tokens
seen so far (``[batch, local_kv_heads, length, head_size]``: tensor-parallel ranks keep only
their heads, and grouped-query models only their kv heads, never the repeated query heads)
and, for decoder cross-attention, the keys/values of the encoder output, computed once.

Self-attention buffers are preallocated to ``max_length`` positions when it is known, so a
decoding step writes one slot instead of concatenating (and copying) the whole history;
without ``max_length`` they grow by doubling. Attention sees the ``[:, :, :length]`` views, so
every step has new shapes.

A :class:`StaticKVCache` (transformers' ``StaticCache``) keeps every shape fixed instead:
``[batch, local_kv_heads, max_length, head_size]`` zero-initialized buffers per layer,
allocated once; a forward writes its keys/values at the slots ``cache.cache_position`` (a
LongTensor set with :meth:`StaticKVCache.step` before the forward) and attention runs over all
``max_length`` slots behind ``cache.keep``: key slot j is kept for the query written at slot i
iff ``j <= i`` and the key is no padding. So decode steps repeat the same shapes, which
``torch.compile`` and CUDA graphs need.
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


class StaticLayerKVCache(LayerKVCache):
    """One layer's fixed-shape cache of a :class:`StaticKVCache`: ``update`` writes at the
    owner's ``cache_position`` and returns the whole ``max_length`` buffers; ``reorder`` and
    a new ``cross`` of the same shape copy in place, so buffer addresses never change (CUDA
    graphs replay on them)."""

    def __init__(self, owner: StaticKVCache):
        self._cross: KVPair | None = None  # before the base class sets ``cross``
        self._spare_cross: KVPair | None = None
        super().__init__(owner.max_length)
        self.owner = owner

    @property
    def cache_position(self) -> torch.Tensor:
        return self.owner.cache_position

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> KVPair:
        """Write ``[batch, kv_heads, new, head_size]`` at ``cache_position``; returns the
        ``[batch, kv_heads, max_length, head_size]`` buffers."""
        if self._keys is None:
            b, h, _, d = keys.shape
            self._keys = _static_zeros(keys, (b, h, self.max_length, d))
            self._values = _static_zeros(values, (b, h, self.max_length, values.shape[-1]))
        # index_copy_ at tensor positions: no Python int of the step enters the graph
        self._keys.index_copy_(2, self.owner.cache_position, keys.to(self._keys.dtype))
        self._values.index_copy_(2, self.owner.cache_position, values.to(self._values.dtype))
        return self._keys, self._values

    def get(self) -> KVPair | None:
        """The whole buffers (slots not written yet hold zeros), or None before any write."""
        return None if self._keys is None else (self._keys, self._values)

    @property
    def cross(self) -> KVPair | None:
        return self._cross

    @cross.setter
    def cross(self, pair: KVPair | None) -> None:
        spare = self._cross or self._spare_cross  # buffers of an earlier generation
        if pair is not None and spare is not None and _same_shapes(spare, pair):
            spare[0].copy_(pair[0])
            spare[1].copy_(pair[1])
            pair = spare
        for t in pair or ():
            if t.is_cuda:
                torch._dynamo.mark_static_address(t)
        self._cross = pair

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search), in place."""
        for t in (self._keys, self._values, *(self._cross or ())):
            if t is not None:
                t.copy_(t.index_select(0, index))

    def reset(self) -> None:
        """Forget the contents (zeros), keep the buffers (cross-attention's for reuse)."""
        for t in (self._keys, self._values):
            if t is not None:
                t.zero_()
        self._spare_cross, self._cross = self._cross or self._spare_cross, None


class StaticKVCache(KVCache):
    """A :class:`KVCache` of fixed shapes: ``max_length`` slots per layer (see the module
    docstring). Before each forward, :meth:`step` says which slots it writes; models take
    positions from ``position_ids`` (decoder-only) or ``cache_position`` (T5), never from a
    Python length, so a compiled decode step sees only tensors whose shapes do not change.

    Reuse one cache for generations of the same batch and length (:meth:`reset`): its
    buffers keep their addresses, so a CUDA-graph decode step replays without re-recording.
    """

    def __init__(self, max_length: int):
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"a static KV cache needs max_length >= 1, got {max_length!r}")
        super().__init__(max_length)
        self.layers: dict[int, StaticLayerKVCache] = {}
        self.seen = 0  # slots written so far (Python side; models do not read it)
        self.cache_position: torch.Tensor | None = None
        self.keep: torch.Tensor | None = None

    def layer(self, layer_idx: int) -> StaticLayerKVCache:
        if layer_idx not in self.layers:
            self.layers[layer_idx] = StaticLayerKVCache(self)
        return self.layers[layer_idx]

    def step(
        self, start: int, count: int, padding: torch.Tensor | None = None, device=None
    ) -> torch.Tensor:
        """The next forward writes ``count`` tokens at slots ``start .. start + count - 1``:
        sets (and returns) ``cache_position``, and ``keep``, the attention mask of every
        layer (``[1 or batch, 1, count, max_length]`` bool: slot j for the query at slot i iff
        ``j <= i`` and ``padding[:, j]``, where ``padding`` is ``[batch, max_length]``, 1 =
        real token). Raises ``ValueError`` past ``max_length``."""
        if start + count > self.max_length:
            raise ValueError(
                f"the static KV cache holds max_length={self.max_length} positions but this "
                f"step needs {start + count}; build the cache with a larger max_length "
                "(generation: max_cache_len >= prompt + max_new_tokens)"
            )
        if padding is not None:
            device = padding.device
        self.cache_position = torch.arange(start, start + count, device=device)
        slots = torch.arange(self.max_length, device=device)
        keep = (slots <= self.cache_position[:, None])[None, None]
        self.keep = keep if padding is None else keep & padding.bool()[:, None, None, :]
        self.seen = start + count
        return self.cache_position

    def get_seq_length(self) -> int:
        return self.seen

    def reset(self) -> None:
        """Empty the cache for a new generation, keeping every buffer (and its address)."""
        self.seen, self.cache_position, self.keep = 0, None, None
        for cache in self.layers.values():
            cache.reset()


def _static_zeros(like: torch.Tensor, shape) -> torch.Tensor:
    """Zeros (masked slots must hold finite values) whose address CUDA graphs may keep."""
    t = like.new_zeros(shape)
    if t.is_cuda:
        torch._dynamo.mark_static_address(t)
    return t


def _same_shapes(a: KVPair, b: KVPair) -> bool:
    return all(x.shape == y.shape and x.dtype == y.dtype for x, y in zip(a, b))


def is_static(past_key_values) -> bool:
    """Whether ``past_key_values`` is a :class:`StaticKVCache`."""
    return isinstance(past_key_values, StaticKVCache)


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
    """Cached tokens of a :class:`KVCache` or a legacy list (``[0][0][0]`` is layer 0's keys);
    0 for a :class:`StaticKVCache`, whose users pass positions as tensors."""
    if past_key_values is None:
        return 0
    if isinstance(past_key_values, StaticKVCache):
        # its positions are tensors (cache_position / position_ids): a step-dependent int
        # here would make a compiled decode step recompile every token
        return 0
    if isinstance(past_key_values, KVCache):
        return past_key_values.get_seq_length()
    first = past_key_values[0]
    keys = first[0][0] if isinstance(first[0], tuple) else first[0]
    return keys.shape[2]


def check_no_cache_under_sequence_parallel(
    sequence_parallel: bool, past_key_values, use_cache: bool
) -> None:
    """Raise if a sequence-parallel model is asked to decode with a KV cache: a decoding step
    feeds one position, which does not split over the tp ranks."""
    if sequence_parallel and (past_key_values is not None or use_cache):
        raise ValueError(
            "generation with a KV cache does not run sequence-parallel: a decoding step has "
            "one position to split over the tensor-parallel ranks. Build the model for "
            "inference with train.dist.sequence_parallel=False (the weights are the same)."
        )
