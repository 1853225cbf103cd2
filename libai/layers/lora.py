"""Low-rank adapters (LoRA) on libai's parallel Linear layers, laid out with their base.

``y = base(x) + scaling * B(A(dropout(x)))`` with ``A [r, in]``, ``B [out, r]``, ``B = 0`` at
the start (PEFT's initialization: A Kaiming-uniform), ``scaling = lora_alpha / r`` (or
``/ sqrt(r)`` with ``use_rslora``). The adapter follows its base layer's tensor-parallel
layout, so no rank ever holds a whole weight it would not hold anyway:

- column-parallel base (weight split on the output dim): A replicated, B split on its
  output dim; ``x A^T`` is computed once per rank and its gradient summed over tp;
- row-parallel base (weight split on the input dim): A split on its input dim, B
  replicated; the rank-``r`` partial products are summed over tp (a tiny all-reduce);
- replicated base: both replicated.

A fused query/key/value projection takes one adapter per segment (PEFT's ``q_proj``,
``k_proj``, ``v_proj`` of Hugging Face's separate projections): each segment has its own A
and B, and its output lands in the segment's rows of the fused output (whole kv groups per
rank). :func:`libai.layers.lora_transform.apply_lora` attaches adapters by name patterns
and freezes the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from libai.layers.collectives import (
    copy_to_tp,
    gather_from_sp,
    reduce_from_tp,
    reduce_scatter_to_sp,
)
from libai.layers.param import create_parameter, local_value, mark_sequence_parallel, zeros


def kaiming_uniform_a5(tensor, generator=None):
    """PEFT's (and nn.Linear's) initialization of A: Kaiming-uniform with ``a = sqrt(5)``."""
    fan_in = tensor.shape[1]
    bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
    with torch.no_grad():
        return tensor.uniform_(-bound, bound, generator=generator)


@dataclass(frozen=True)
class QKVLayout:
    """How a fused query/key/value projection orders its output rows on a rank: ``groups``
    kv groups, each ``g`` query heads then one key and one value head of ``head_size``."""

    groups: int
    g: int
    head_size: int


class LoRA(nn.Module):
    """The adapter of one :class:`~libai.layers.linear.Linear` (``linear.lora``): the whole
    layer, or the ``segments`` of a fused qkv projection (``{"q", "k", "v"}`` subset, with
    ``qkv`` the rank's row layout). Parameters ``lora_A`` / ``lora_B`` (whole layer) or
    ``lora_A_q`` / ``lora_B_q`` ... (segments)."""

    def __init__(
        self,
        linear,
        r: int,
        lora_alpha: float,
        lora_dropout: float = 0.0,
        use_rslora: bool = False,
        *,
        segments: tuple[str, ...] | None = None,
        qkv: QKVLayout | None = None,
        full_widths: dict[str, int] | None = None,
        shared_a: bool = False,
    ):
        super().__init__()
        self.parallel, self.sequence_parallel = linear.parallel, linear.sequence_parallel
        self._dist_util = linear._dist_util
        self.r = r
        self.scaling = lora_alpha / (math.sqrt(r) if use_rslora else r)
        self.dropout = nn.Dropout(lora_dropout) if lora_dropout > 0 else None
        self.segments, self.qkv = segments, qkv
        #: one A for every segment (GPT-2's fused ``c_attn``: one PEFT adapter, its B rows
        #: split into q, k, v)
        self.shared_a = shared_a and segments is not None
        if segments is not None and linear.parallel != "col":
            raise ValueError("segment adapters apply to a column-parallel fused projection")
        layer = dict(layer_idx=linear.layer_idx)
        in_split = 1 if linear.parallel == "row" else None
        out_split = 0 if linear.parallel == "col" else None
        outs = full_widths if segments is not None else {"": linear.out_features}
        for name in segments or ("",):
            suffix = f"_{name}" if name else ""
            if not (self.shared_a and name != segments[0]):
                a = create_parameter(
                    (r, linear.in_features), kaiming_uniform_a5, tp_split_dim=in_split, **layer
                )
                self.register_parameter(self._a_name(name), a)
            b = create_parameter((outs[name], r), zeros, tp_split_dim=out_split, **layer)
            self.register_parameter("lora_B" + suffix, b)
        for p in self.parameters():
            p.libai_lora = True
        if linear.sequence_parallel:  # the replicated half sees a sequence shard per rank
            mark_sequence_parallel(*self.replicated_parameters())

    def _a_name(self, segment: str) -> str:
        if not segment or self.shared_a:
            return "lora_A"
        return f"lora_A_{segment}"

    def replicated_parameters(self) -> list[nn.Parameter]:
        """The adapter weights that are whole on every tp rank (A of a column-parallel
        base, B of a row-parallel one, both of a replicated one)."""
        if self.parallel == "data":
            return list(self.parameters())
        kind = "lora_A" if self.parallel == "col" else "lora_B"
        return [p for n, p in self.named_parameters() if n.startswith(kind)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: the base layer's input (this rank's share, as the base receives it) -> the
        adapter's addition to the base output (the base output's layout; a fused
        projection's segments in their rows). The scaling is applied to the rank-``r``
        activations, not to the (wide) output."""
        h, b = self._factors(x)
        # [S(0), B] x [S(0), B]^T -> [S(0), S(-1)]  (row: [B, B]; data: [S(0), B])
        return F.linear(h, b.to(h.dtype))

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``out`` (the base's output for ``x``) plus the adapter's addition, as one matmul
        accumulating onto ``out``: no addition tensor is written and read back, and a fused
        projection's segments need no in-place writes into strided rows (whose backward
        copies the whole gradient once per segment)."""
        h, b = self._factors(x)
        rows = out.reshape(-1, out.shape[-1])
        # [S(0), B] + [S(0), B] x [S(0), B]^T -> [S(0), S(-1)]  (row: [B, B])
        # h is in x's dtype like out (or autocast's, which addmm takes too); the adapter's
        # b may be fp32 beside a low-precision base (O2)
        h = h.reshape(-1, h.shape[-1])
        return torch.addmm(rows, h, b.t().to(out.dtype)).view(out.shape)

    def _factors(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """``h = scaling * x A^T [..., R]`` and ``b [local out, R]`` with ``h b^T`` the
        addition: the layer's own ``B`` (R = r), or for a fused projection every segment's
        A in one matmul and their B's as one block matrix (each segment's rows against its
        A's columns, zeros elsewhere; R = r per distinct A)."""
        if self.segments is None:
            return self._project(x, [self.lora_A]), local_value(self.lora_B)
        names = [self._a_name(s) for s in self.segments]
        unique = list(dict.fromkeys(names))
        h = self._project(x, [getattr(self, n) for n in unique])
        return h, self._block_b({n: i * self.r for i, n in enumerate(unique)})

    def _block_b(self, column: dict[str, int]) -> torch.Tensor:
        """The segments' B's as one ``[local rows, R]`` matrix in the fused row order
        (``groups x (g query heads, key, value) x head_size``): segment ``s`` fills its rows
        at the columns ``column[a] .. + r`` of its A ``a``; rows of segments without an
        adapter are zero."""
        qkv, r = self.qkv, self.r
        width = len(column) * r
        heads = {"q": qkv.g, "k": 1, "v": 1}
        some_b = local_value(getattr(self, f"lora_B_{self.segments[0]}"))  # dtype, device
        blocks = []
        for s in ("q", "k", "v"):
            shape = (qkv.groups, heads[s], qkv.head_size)
            if s in self.segments:
                b = local_value(getattr(self, f"lora_B_{s}")).view(*shape, r)
                first = column[self._a_name(s)]
                blocks.append(F.pad(b, (first, width - first - r)))
            else:
                blocks.append(some_b.new_zeros(*shape, width))
        return torch.cat(blocks, dim=1).view(-1, width)

    def _project(self, x, weights) -> torch.Tensor:
        """``scaling * x A^T`` for the A's of ``weights`` side by side (one matmul for all),
        in the layout the B matmul takes."""
        if self.dropout is not None:
            x = self.dropout(x)
        tp_group = self._dist_util.tp_group
        a = (
            torch.cat([local_value(w) for w in weights])
            if len(weights) > 1
            else local_value(weights[0])
        )
        # [S(0), B] x [r, B]^T -> [S(0), B] (r wide; row: [S(0), S(-1)] x [r, S(1)]^T -> P)
        h = F.linear(x, a.to(x.dtype)) * self.scaling
        if self.parallel == "row":
            # [S(0), P] -> all-reduce (reduce-scatter under sequence parallel) -> [S(0), B]
            if self.sequence_parallel:
                h = reduce_scatter_to_sp(h, tp_group)
            else:
                h = reduce_from_tp(h, tp_group)
        elif self.parallel == "col":  # A's gradient summed over tp
            if self.sequence_parallel:  # [S(0), S(1)] -> all-gather -> [S(0), B]
                h = gather_from_sp(h, tp_group)
            else:
                h = copy_to_tp(h, tp_group)
        return h

    @torch.no_grad()
    def delta_weight(self) -> dict[str, torch.Tensor]:
        """``scaling * B A`` of each segment (``""``: the whole layer), whole (a collective
        where the adapter is sharded: every rank calls it)."""
        out = {}
        for name in self.segments or ("",):
            a = _whole(getattr(self, self._a_name(name)))
            b = _whole(getattr(self, "lora_B" + (f"_{name}" if name else "")))
            out[name] = (b.float() @ a.float()) * self.scaling
        return out

    def extra_repr(self) -> str:
        segments = f", segments={self.segments}" if self.segments else ""
        return f"r={self.r}, scaling={self.scaling:g}, parallel={self.parallel}{segments}"


class EmbeddingLoRA(nn.Module):
    """The adapter of a :class:`~libai.layers.embedding.VocabEmbedding` (PEFT's embedding
    LoRA): ``out + scaling * B (A^T)[ids]`` with ``lora_embedding_A [r, vocab]`` (zero at
    the start) and ``lora_embedding_B [hidden, r]`` (standard normal), PEFT's names and
    initialization; no dropout (PEFT applies none to embeddings). A is split on the vocab
    dim like the table (padded likewise), B is replicated."""

    def __init__(self, embedding, r: int, lora_alpha: float, use_rslora: bool = False):
        super().__init__()
        self._dist_util = embedding._dist_util
        self.sequence_parallel = embedding.sequence_parallel
        self.r, self.segments = r, None
        self.padded_vocab = embedding.padded_num_embeddings
        self.scaling = lora_alpha / (math.sqrt(r) if use_rslora else r)
        layer = dict(layer_idx=embedding.layer_idx)
        self.lora_embedding_A = create_parameter(
            (r, embedding.num_embeddings),
            zeros,
            tp_split_dim=1,
            padded_shape=(r, embedding.padded_num_embeddings),
            **layer,
        )
        self.lora_embedding_B = create_parameter(
            (embedding.embedding_dim, r), _standard_normal, **layer
        )
        for p in self.parameters():
            p.libai_lora = True
        if embedding.sequence_parallel:  # B sees a sequence shard per rank
            mark_sequence_parallel(self.lora_embedding_B)

    def replicated_parameters(self) -> list[nn.Parameter]:
        return [self.lora_embedding_B]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids`` -> the adapter's addition to the embedding output (its layout)."""
        table = local_value(self.lora_embedding_A).t()  # [vocab (this rank's rows), r]
        if table.shape[0] == self.padded_vocab:  # the whole table on this rank
            h = F.embedding(input_ids, table)
        else:
            # [S(0), B] ids x [S(0), B] rows of A^T -> [S(0), P] (r wide) -> all-reduce
            start = self._dist_util.tensor_parallel_rank * table.shape[0]
            outside = (input_ids < start) | (input_ids >= start + table.shape[0])
            local_ids = (input_ids - start).masked_fill(outside, 0)
            h = F.embedding(local_ids, table).masked_fill(outside.unsqueeze(-1), 0.0)
            if self.sequence_parallel:  # [S(0), P] -> reduce-scatter -> [S(0), S(1)]
                h = reduce_scatter_to_sp(h, self._dist_util.tp_group)
            else:
                h = reduce_from_tp(h, self._dist_util.tp_group)
        # [S(0), B] x [B, B]^T -> [S(0), B]  (r -> hidden)
        b = local_value(self.lora_embedding_B)
        return (h @ b.t().to(h.dtype)) * self.scaling

    def add_to(self, out: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return out + self(input_ids).to(out.dtype)

    @torch.no_grad()
    def delta_weight(self) -> dict[str, torch.Tensor]:
        """``scaling * (B A)^T`` ``[vocab (padded), hidden]``, whole (a collective where A
        is sharded)."""
        a, b = _whole(self.lora_embedding_A), _whole(self.lora_embedding_B)
        return {"": (b.float() @ a.float()).t() * self.scaling}

    def extra_repr(self) -> str:
        return f"r={self.r}, scaling={self.scaling:g}, embedding"


def _standard_normal(tensor, generator=None):
    """PEFT's initialization of an embedding adapter's B."""
    with torch.no_grad():
        return tensor.normal_(generator=generator)


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t
