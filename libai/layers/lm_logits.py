"""Vocab-parallel language-model head tied to the word embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers.collectives import copy_to_tp, gather_from_sp, gather_from_tp
from libai.layers.embedding import VocabEmbedding, pad_vocab_size
from libai.layers.param import create_parameter, default_init_method, local_value, zeros


class LMLogits(nn.Module):
    """``logits = hidden @ E^T (+ bias)`` where ``E`` is the (vocab-split) word embedding,
    or, with ``embedding=None``, an untied head's own vocab-split weight (``vocab_size`` x
    ``hidden_size``).

    When the embedding and this head sit on the same pipeline stage the head reads the
    embedding's weight (one tensor, truly tied). When they sit on different stages (the first
    and the last), the head owns a copy, equal at initialization because it is generated from
    the embedding's seed; the trainer all-reduces the two gradients between those stages every
    step (``libai_tied_group`` marks both), so they stay equal.

    ``forward`` returns this rank's vocab shard of the logits, ``[S(0), S(-1)]``; columns of
    vocab padding hold the dtype's minimum so they never win a softmax.

    With ``sequence_parallel=True`` the head's input is this rank's share of the sequence
    and is all-gathered on entry (see :func:`enter_head`); the logits cover the whole sequence.
    """

    def __init__(
        self,
        embedding: VocabEmbedding | None,
        bias: bool = False,
        *,
        layer_idx: int = -1,
        vocab_size: int | None = None,
        hidden_size: int | None = None,
        init_method=None,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        self.layer_idx, self.sequence_parallel = layer_idx, sequence_parallel
        #: the mesh this head was built on (its tp rank and group at forward time)
        self._dist_util = util = dist.capture_mesh()
        if embedding is None:  # an untied head (Llama, T5 v1.1 / mT5): its own weight
            if vocab_size is None or hidden_size is None:
                raise ValueError(
                    "an untied LMLogits (embedding=None) needs vocab_size and hidden_size"
                )
            self.vocab_size = vocab_size
            self.padded_vocab_size = pad_vocab_size(vocab_size, util.tensor_parallel_size)
            self.weight = create_parameter(
                (vocab_size, hidden_size),
                init_method or default_init_method,
                layer_idx=layer_idx,
                tp_split_dim=0,
                padded_shape=(self.padded_vocab_size, hidden_size),
            )
        else:
            self._tie(embedding, layer_idx)
        self.bias = (
            create_parameter(
                (self.vocab_size,),
                zeros,
                layer_idx=layer_idx,
                tp_split_dim=0,
                padded_shape=(self.padded_vocab_size,),
            )
            if bias
            else None
        )

    def _tie(self, embedding: VocabEmbedding, layer_idx: int) -> None:
        self.vocab_size = embedding.num_embeddings
        self.padded_vocab_size = embedding.padded_num_embeddings
        util = self._dist_util
        same_stage = util.get_layer_stage(layer_idx) == util.get_layer_stage(embedding.layer_idx)
        if same_stage:
            self.weight = None
            self.__dict__["_tied_embedding"] = embedding  # a reference, not a submodule
            return
        self.weight = create_parameter(
            (embedding.num_embeddings, embedding.embedding_dim),
            embedding.init_method,
            layer_idx=layer_idx,
            tp_split_dim=0,
            padded_shape=(embedding.padded_num_embeddings, embedding.embedding_dim),
            seed=embedding.weight.libai_init_seed,
        )
        self.weight.libai_tied_group = "word_embeddings"
        self.weight.libai_tied_copy = True  # checkpoints keep the embedding's entry
        embedding.weight.libai_tied_group = "word_embeddings"

    def tied_weight(self) -> torch.Tensor:
        return self.weight if self.weight is not None else self._tied_embedding.weight

    def local_weight_and_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This rank's vocab shard of the weight ``[V/tp, hidden]`` and of the bias (or
        ``None``), differentiable into the parameters (for :func:`chunked_lm_loss`)."""
        weight = local_value(self.tied_weight())
        return weight, None if self.bias is None else local_value(self.bias)

    def local_vocab_columns(self) -> int:
        """How many of this rank's ``V/tp`` logit columns are real vocab (the rest, at the
        end of the last ranks, are padding)."""
        per_rank = self.padded_vocab_size // self._dist_util.tensor_parallel_size
        start = self._dist_util.tensor_parallel_rank * per_rank
        return max(0, min(per_rank, self.vocab_size - start))

    @property
    def tp_group(self):
        """The tensor-parallel group of the mesh this head was built on (``None`` at tp 1)."""
        return self._dist_util.tp_group

    def enter(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` entered into this head's vocab-parallel region (:func:`enter_head`)."""
        return enter_head(hidden, self.tp_group, self.sequence_parallel)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight, bias = self.local_weight_and_bias()
        # [S(0), B] x [S(0), B]^T -> [S(0), S(-1)]  (vocab-split logits)
        logits = F.linear(self.enter(hidden_states), weight, bias)
        if self.padded_vocab_size != self.vocab_size:
            start = self._dist_util.tensor_parallel_rank * weight.shape[0]
            column = torch.arange(start, start + weight.shape[0], device=logits.device)
            logits = logits.masked_fill(column >= self.vocab_size, torch.finfo(logits.dtype).min)
        return logits

    def gather(self, logits: torch.Tensor) -> torch.Tensor:
        """``[S(0), S(-1)] -> [S(0), B]``: full-vocab logits (padding dropped)."""
        return gather_from_tp(logits, self.tp_group, dim=-1)[..., : self.vocab_size]


def enter_head(hidden: torch.Tensor, group, sequence_parallel: bool = False) -> torch.Tensor:
    """The head's input entered into its (vocab-parallel) region over the tp ``group``.

    ``[S(0), B] -> [S(0), B]``: identity forward, ``d hidden`` all-reduced over tp backward;
    with ``sequence_parallel``: ``[S(0), S(1)] -> all-gather -> [S(0), B]``, ``d hidden``
    reduce-scattered back to the sequence shards.
    """
    return gather_from_sp(hidden, group) if sequence_parallel else copy_to_tp(hidden, group)
