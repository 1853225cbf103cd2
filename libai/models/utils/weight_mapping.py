"""Declarative weight mapping between a libai model and a Hugging Face checkpoint.

A loader describes its architecture as a list of rules, one per libai parameter:

- :class:`Copy` — one Hugging Face tensor, optionally transposed (GPT-2's ``Conv1D``).
- :class:`GroupedFuse` (and the :func:`QKV` / :func:`KV` shorthands) — several Hugging Face
  tensors fused into one libai projection whose rows are grouped per key/value head
  (``[q x group, k, v]`` per group, see :class:`libai.layers.MultiheadAttention`), GQA-aware.
  Each source may be a row range of a shared tensor (GPT-2's fused ``c_attn``).

Every rule works both ways: :meth:`Rule.load` reads only the rows of this rank's tensor-
parallel shard (through :class:`~libai.models.utils.hf_io.CheckpointReader`, which uses
``safetensors`` slices), and :meth:`Rule.export` turns the full libai tensor into the Hugging
Face tensors. Exporting a ``meta`` tensor gives the shapes a checkpoint must have, which is
how mismatches against ``config.json`` are found before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


@dataclass(frozen=True)
class ShardSpec:
    """This rank's share of a libai parameter: chunk ``index`` of ``count`` along ``dim``."""

    dim: int
    index: int
    count: int


@dataclass(frozen=True)
class Src:
    """A Hugging Face tensor, or rows ``[offset, offset + n)`` of one (``n`` set by the rule).

    ``transpose`` marks tensors stored as ``[in, out]`` (GPT-2's ``Conv1D``); rows then are
    the tensor's columns.
    """

    name: str
    offset: int = 0
    transpose: bool = False


class Rule:
    """Maps one libai parameter ``libai_name`` to the Hugging Face tensors it comes from."""

    libai_name: str

    def hf_names(self) -> list[str]:
        raise NotImplementedError

    def load(self, reader, padded_shape, logical_shape, shard: ShardSpec | None) -> torch.Tensor:
        """This rank's local tensor (``padded_shape`` chunked by ``shard``)."""
        raise NotImplementedError

    def export(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """Hugging Face tensors from the full (logical, unpadded) libai tensor."""
        raise NotImplementedError

    def renamed(self, libai_name: str) -> Rule:
        """The same rule for another libai parameter (a tied copy on another stage)."""
        return replace(self, libai_name=libai_name)


def _read_rows(reader, src: Src, start: int, stop: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of ``src`` (relative to its offset), as ``[rows, ...]``."""
    dim = 1 if src.transpose else 0
    t = reader.read(src.name, dim, src.offset + start, src.offset + stop)
    return t.t() if src.transpose else t


def _shard_range(size: int, shard: ShardSpec | None) -> tuple[int, int]:
    if shard is None:
        return 0, size
    per = size // shard.count
    return shard.index * per, (shard.index + 1) * per


@dataclass(frozen=True)
class Copy(Rule):
    """``libai = hf`` (``hf.T`` with ``transpose``); pads vocabulary rows with zeros."""

    libai_name: str
    hf_name: str
    transpose: bool = False

    def hf_names(self) -> list[str]:
        return [self.hf_name]

    def load(self, reader, padded_shape, logical_shape, shard):
        padded_shape, logical_shape = tuple(padded_shape), tuple(logical_shape)
        if self.transpose and len(logical_shape) != 2:
            raise ValueError(f"{self.libai_name}: only 2-d tensors can be transposed")
        dim = 0 if shard is None else shard.dim
        start, stop = _shard_range(padded_shape[dim], shard)
        real_stop = min(stop, logical_shape[dim])
        hf_dim = (1 - dim) if self.transpose else dim
        if shard is None and padded_shape == logical_shape:
            t = reader.read(self.hf_name)
        elif real_stop > start:
            t = reader.read(self.hf_name, hf_dim, start, real_stop)
        else:  # a shard made only of padding
            t = None
        if t is not None and self.transpose:
            t = t.t()
        local = list(padded_shape)
        local[dim] = stop - start
        if t is not None and list(t.shape) == local:
            return t
        out = torch.zeros(local, dtype=reader.dtype(self.hf_name))
        if t is not None:
            out.narrow(dim, 0, t.shape[dim]).copy_(t)
        return out

    def export(self, full):
        return {self.hf_name: full.t() if self.transpose else full}


@dataclass(frozen=True)
class GroupedFuse(Rule):
    """A libai tensor ``[groups x sum(rows_per_group), ...]`` built from ``sources``.

    Group ``g`` holds rows ``[g * n_c, (g + 1) * n_c)`` of every source ``c`` in turn, with
    ``n_c = rows_per_group[c]``. A tensor-parallel shard (always along dim 0) holds whole
    groups, so each rank reads a contiguous row range of every source.
    """

    libai_name: str
    sources: tuple[Src, ...]
    rows_per_group: tuple[int, ...]
    groups: int

    def hf_names(self) -> list[str]:
        return list(dict.fromkeys(s.name for s in self.sources))

    def load(self, reader, padded_shape, logical_shape, shard):
        if shard is not None and shard.dim != 0:
            raise ValueError(f"{self.libai_name}: a fused projection is split along dim 0")
        g0, g1 = _shard_range(self.groups, shard)
        parts = [
            _read_rows(reader, src, g0 * n, g1 * n).reshape(g1 - g0, n, *logical_shape[1:])
            for src, n in zip(self.sources, self.rows_per_group)
        ]
        return torch.cat(parts, dim=1).reshape(-1, *logical_shape[1:])

    def export(self, full):
        rest = full.shape[1:]
        pieces = full.reshape(self.groups, sum(self.rows_per_group), *rest).split(
            self.rows_per_group, dim=1
        )
        by_name: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for src, piece in zip(self.sources, pieces):
            rows = piece.reshape(-1, *rest)
            by_name.setdefault(src.name, []).append((src.offset, rows))
        out = {}
        for name, chunks in by_name.items():
            rows = torch.cat([t for _, t in sorted(chunks, key=lambda c: c[0])], dim=0)
            transpose = next(s.transpose for s in self.sources if s.name == name)
            out[name] = rows.t() if transpose else rows
        return out


def _src(source: str | Src) -> Src:
    return source if isinstance(source, Src) else Src(source)


def QKV(
    libai_name: str,
    q: str | Src,
    k: str | Src,
    v: str | Src,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    head_size: int,
) -> GroupedFuse:
    """Separate (or row ranges of one fused) q / k / v -> libai's grouped ``query_key_value``."""
    num_kv_heads = num_kv_heads or num_heads
    group = num_heads // num_kv_heads
    return GroupedFuse(
        libai_name,
        (_src(q), _src(k), _src(v)),
        (group * head_size, head_size, head_size),
        num_kv_heads,
    )


def KV(
    libai_name: str, k: str | Src, v: str | Src, *, num_kv_heads: int, head_size: int
) -> GroupedFuse:
    """Separate k / v -> libai's grouped cross-attention ``key_value``."""
    return GroupedFuse(libai_name, (_src(k), _src(v)), (head_size, head_size), num_kv_heads)


def expected_shapes(rule: Rule, logical_shape) -> dict[str, tuple[int, ...]]:
    """The Hugging Face tensor shapes ``rule`` implies for a libai tensor of this shape."""
    meta = torch.empty(tuple(logical_shape), device="meta")
    return {name: tuple(t.shape) for name, t in rule.export(meta).items()}


def _format(value, kw):
    if isinstance(value, str):
        return value.replace("{i}", str(kw["i"]))
    if isinstance(value, Src):
        return replace(value, name=value.name.format(**kw))
    if isinstance(value, tuple):
        return tuple(_format(v, kw) for v in value)
    return value


def expand(table: list[Rule], num_layers: int) -> list[Rule]:
    """Rules with ``{i}`` in their names repeated for layers ``0 .. num_layers - 1``."""
    out = []
    for rule in table:
        names = [rule.libai_name, *rule.hf_names()]
        if not any("{i}" in n for n in names):
            out.append(rule)
            continue
        for i in range(num_layers):
            kw = {"i": i}
            out.append(replace(rule, **{f: _format(getattr(rule, f), kw) for f in _fields(rule)}))
    return out


def _fields(rule: Rule) -> list[str]:
    return [f.name for f in fields(rule)]


@dataclass(frozen=True)
class StackedExperts(Rule):
    """A libai expert weight ``[E, ...]`` from one Hugging Face tensor per expert:
    ``hf_template`` with ``<e>`` standing for the expert index (Mixtral's
    ``experts.<e>.w1.weight``). An expert-parallel shard (dim 0) reads only its experts."""

    libai_name: str
    hf_template: str
    num_experts: int

    def _name(self, e: int) -> str:
        return self.hf_template.replace("<e>", str(e))

    def hf_names(self) -> list[str]:
        return [self._name(e) for e in range(self.num_experts)]

    def load(self, reader, padded_shape, logical_shape, shard):
        if shard is not None and shard.dim != 0:
            raise ValueError(f"{self.libai_name}: experts are split along dim 0 only")
        start, stop = _shard_range(self.num_experts, shard)
        return torch.stack([reader.read(self._name(e)) for e in range(start, stop)])

    def export(self, full):
        return {self._name(e): full[e] for e in range(self.num_experts)}

    def renamed(self, libai_name: str) -> Rule:
        return replace(self, libai_name=libai_name)
