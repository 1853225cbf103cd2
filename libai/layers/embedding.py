"""Word (vocab-parallel) and position (replicated) embeddings."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers.collectives import reduce_from_tp, reduce_scatter_to_sp, scatter_to_sp
from libai.layers.param import (
    InitMethod,
    create_parameter,
    default_init_method,
    local_value,
    mark_sequence_parallel,
)

logger = logging.getLogger(__name__)


def pad_vocab_size(vocab_size: int, multiple: int) -> int:
    """Round ``vocab_size`` up to a multiple of ``multiple`` (logged when it changes)."""
    padded = -(-vocab_size // multiple) * multiple
    if padded != vocab_size:
        logger.info(
            "vocab_size %d padded to %d (a multiple of tensor_parallel_size %d); padded rows "
            "are never looked up and their logits are masked",
            vocab_size,
            padded,
            multiple,
        )
    return padded


class VocabEmbedding(nn.Module):
    """Token embedding whose table is split over tensor-parallel ranks by vocabulary rows.

    The vocabulary is padded up to a multiple of tp; the padding rows are zeros and never
    looked up (ids must be < ``num_embeddings``).

    With ``sequence_parallel=True`` the partial lookups are reduce-scattered along the
    sequence instead of all-reduced: the output is this rank's share of the sequence.

    ``padding_idx`` (``nn.Embedding``'s): that row is looked up but gets no gradient
    (transformers' models that set ``pad_token_id``, e.g. OLMoE).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        init_method: InitMethod = default_init_method,
        *,
        layer_idx: int = 0,
        sequence_parallel: bool = False,
        padding_idx: int | None = None,
        amp_enabled: bool = False,  # LiBai's graph-mode fp16 marker: autocast does it here
    ):
        super().__init__()
        if padding_idx is not None and not 0 <= padding_idx < num_embeddings:
            raise ValueError(f"padding_idx={padding_idx} is not a row of {num_embeddings}")
        self.padding_idx = padding_idx
        #: the mesh this table was built on (its tp rank and group at forward time)
        self._dist_util = dist.capture_mesh()
        tp = self._dist_util.tensor_parallel_size
        self.sequence_parallel = sequence_parallel
        self.num_embeddings, self.embedding_dim, self.layer_idx = (
            num_embeddings,
            embedding_dim,
            layer_idx,
        )
        self.padded_num_embeddings = pad_vocab_size(num_embeddings, tp)
        self.init_method = init_method
        self.weight = create_parameter(
            (num_embeddings, embedding_dim),
            init_method,
            layer_idx=layer_idx,
            tp_split_dim=0,
            padded_shape=(self.padded_num_embeddings, embedding_dim),
        )
        #: a low-rank adapter (:class:`libai.layers.lora.EmbeddingLoRA`), or None
        self.lora = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self._lookup(input_ids)
        return out if self.lora is None else self.lora.add_to(out, input_ids)

    def _lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        weight = local_value(self.weight)
        if weight.shape[0] == self.padded_num_embeddings:  # whole table on this rank
            return F.embedding(input_ids, weight, self.padding_idx)
        # [S(0), B] ids x [S(0), B] table -> [S(0), P] -> all-reduce -> [S(0), B]
        start = self._dist_util.tensor_parallel_rank * weight.shape[0]
        outside = (input_ids < start) | (input_ids >= start + weight.shape[0])
        local_ids = (input_ids - start).masked_fill(outside, 0)
        pad = self.padding_idx
        pad = pad - start if pad is not None and start <= pad < start + weight.shape[0] else None
        out = F.embedding(local_ids, weight, pad).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            # [S(0), P] -> reduce-scatter -> [S(0), S(1)]  (all-gather backward)
            return reduce_scatter_to_sp(out, self._dist_util.tp_group)
        return reduce_from_tp(out, self._dist_util.tp_group)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, "
            f"padded={self.padded_num_embeddings}, layer_idx={self.layer_idx}"
        )


class Embedding(nn.Module):
    """A replicated embedding table ``[B, B]`` (positions, token types).

    With ``sequence_parallel=True`` it looks up only this rank's share of the sequence
    (``ids`` ``[batch, seq]`` in, ``[batch, seq / tp, dim]`` out) and its table is marked for
    the gradient all-reduce over tp.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        init_method: InitMethod = default_init_method,
        *,
        layer_idx: int = 0,
        sequence_parallel: bool = False,
        amp_enabled: bool = False,  # LiBai's graph-mode fp16 marker: autocast does it here
    ):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.layer_idx = (
            num_embeddings,
            embedding_dim,
            layer_idx,
        )
        self.sequence_parallel = sequence_parallel
        #: the mesh this table was built on (its tp group splits the sequence)
        self._dist_util = dist.capture_mesh()
        self.weight = create_parameter(
            (num_embeddings, embedding_dim), init_method, layer_idx=layer_idx
        )
        if sequence_parallel:
            mark_sequence_parallel(self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            # [S(0), B] ids -> [S(0), S(1)]: this rank's positions (ids need no gradient)
            ids = scatter_to_sp(ids, self._dist_util.tp_group)
        # [S(0), B] x [B, B] -> [S(0), B]
        return F.embedding(ids, local_value(self.weight))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, layer_idx={self.layer_idx}"


class SinePositionalEmbedding(nn.Module):
    """Fixed sinusoidal position embeddings (Vaswani et al.), LiBai's module: row ``p`` is
    ``sin(p / 10000^(2i/d))`` at even columns ``2i`` and ``cos`` of the same at odd ones.
    The table is a buffer (no parameters), the same on every rank; ``forward(position_ids)``
    gathers its rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        position = torch.arange(num_embeddings, dtype=torch.float32).unsqueeze(1)
        div_term = torch.exp(
            torch.arange(0, embedding_dim, 2, dtype=torch.float32)
            * (-torch.log(torch.tensor(10000.0)) / embedding_dim)
        )
        table = torch.zeros(num_embeddings, embedding_dim)
        table[:, 0::2] = torch.sin(position * div_term)
        table[:, 1::2] = torch.cos(position * div_term[: embedding_dim // 2])
        self.register_buffer("position_embedding", table)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids, self.position_embedding)

    def extra_repr(self) -> str:
        return f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}"
