"""Comparing recorded tensors: the checker configuration, tensor tolerance tests, lazy
tensor files.

Every comparison runs in float64, so dumps of different dtypes (bf16 against fp32) can be
compared; whether they pass depends on the tolerances. ``b`` is always side B (the
reference of the relative tolerance).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
from safetensors.torch import load_file

from libai.align.dump_format import tensor_stats

COMPARE_MODES = ("strict", "mean", "cosine")
DIFF_PHASES = ("both", "forward", "backward")
DEFAULT_CFG = {
    "atol": 1e-6,
    "rtol": 1e-5,
    "compare_mode": "strict",
    "diff_phase": "both",
    "log_dir": None,
}


@dataclass(frozen=True)
class CheckConfig:
    """The resolved settings of one checker call (never shared between calls)."""

    atol: float
    rtol: float
    compare_mode: str
    diff_phase: str
    log_dir: str

    def describe(self) -> str:
        return f"compare_mode={self.compare_mode} atol={self.atol:g} rtol={self.rtol:g}"


def resolve_cfg(cfg: dict | None, default_log_dir: str) -> CheckConfig:
    """Validate ``cfg`` (never mutated) and fill in the defaults of :data:`DEFAULT_CFG`.

    A key set to ``None`` takes its default. Unknown keys raise ``ValueError``.
    """
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise TypeError(f"cfg must be a dict or None, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(DEFAULT_CFG))
    if unknown:
        raise ValueError(f"unknown cfg key(s) {unknown}; valid keys are {sorted(DEFAULT_CFG)}")
    values = {k: (cfg[k] if cfg.get(k) is not None else v) for k, v in DEFAULT_CFG.items()}
    for name in ("atol", "rtol"):
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ValueError(f"cfg[{name!r}] must be a number >= 0, got {value!r}")
    if values["compare_mode"] not in COMPARE_MODES:
        raise ValueError(
            f"cfg['compare_mode'] must be one of {COMPARE_MODES}, got {values['compare_mode']!r}"
        )
    if values["diff_phase"] not in DIFF_PHASES:
        raise ValueError(
            f"cfg['diff_phase'] must be one of {DIFF_PHASES}, got {values['diff_phase']!r}"
        )
    return CheckConfig(
        atol=float(values["atol"]),
        rtol=float(values["rtol"]),
        compare_mode=values["compare_mode"],
        diff_phase=values["diff_phase"],
        log_dir=os.fspath(values["log_dir"] or default_log_dir),
    )


class TensorStore:
    """One ``.safetensors`` file of a rank dir, loaded on first use."""

    def __init__(self, path: str, writer: str):
        self.path = path
        self.writer = writer
        self._tensors: dict[str, torch.Tensor] | None = None

    def exists(self) -> bool:
        return os.path.isfile(self.path)

    def require(self) -> None:
        """Raise ``FileNotFoundError`` naming the file and what writes it when it is missing."""
        if not self.exists():
            raise FileNotFoundError(f"{self.path} not found: it is written by {self.writer}")

    def _load(self) -> dict[str, torch.Tensor]:
        if self._tensors is None:
            self.require()
            self._tensors = load_file(self.path)
        return self._tensors

    def release(self) -> None:
        """Drop the loaded tensors (they are read again on the next use)."""
        self._tensors = None

    def has(self, key: str) -> bool:
        return key in self._load()

    def get(self, key: str) -> torch.Tensor:
        tensors = self._load()
        if key not in tensors:
            raise ValueError(f"{self.path} holds no tensor {key!r} (the dump is incomplete)")
        return tensors[key]


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _stats_text(stats: dict) -> str:
    parts = [f"{k}={_fmt(stats[k], 6)}" for k in ("mean", "std", "min", "max") if k in stats]
    if stats.get("nonfinite"):
        parts.append(f"nonfinite={stats['nonfinite']}")
    return " ".join(parts) or "empty"


@dataclass
class TensorDiff:
    """The outcome of comparing tensor ``a`` (side A) with ``b`` (side B)."""

    equal: bool
    mode: str
    shape_a: list[int]
    shape_b: list[int]
    dtype_a: str
    dtype_b: str
    stats_a: dict = field(default_factory=dict)
    stats_b: dict = field(default_factory=dict)
    max_abs: float | None = None
    max_rel: float | None = None
    mean_a: float | None = None
    mean_b: float | None = None
    cosine: float | None = None
    note: str = ""

    def numbers(self) -> str:
        """The deciding numbers in one line (``max_abs=.. max_rel=..`` in strict mode)."""
        if self.shape_a != self.shape_b:
            return f"shape A {self.shape_a} != B {self.shape_b}"
        if self.mode == "mean":
            text = f"mean_a={_fmt(self.mean_a)} mean_b={_fmt(self.mean_b)}"
        elif self.mode == "cosine":
            text = f"cosine={_fmt(self.cosine)}"
        else:
            text = f"max_abs={_fmt(self.max_abs)} max_rel={_fmt(self.max_rel)}"
        return f"{text} ({self.note})" if self.note else text

    def details(self) -> list[str]:
        """Numbers, shapes, dtypes and statistics of both sides, one item per line."""
        lines = [self.numbers()]
        if self.mode != "strict" and self.max_abs is not None:
            lines.append(f"max_abs={_fmt(self.max_abs)} max_rel={_fmt(self.max_rel)}")
        for side, shape, dtype, stats in (
            ("A", self.shape_a, self.dtype_a, self.stats_a),
            ("B", self.shape_b, self.dtype_b, self.stats_b),
        ):
            lines.append(f"{side}: shape {shape} {dtype}  {_stats_text(stats)}")
        return lines


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.to(torch.float64)


def _strict_numbers(x: torch.Tensor, y: torch.Tensor, cfg: CheckConfig) -> tuple:
    """``(all_close, max_abs, max_rel, note)``; equal NaN/inf positions count as equal."""
    both_nan = torch.isnan(x) & torch.isnan(y)
    same = (x == y) | both_nan
    diff = torch.where(same, torch.zeros_like(x), (x - y).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    ok = same | (torch.isfinite(diff) & (diff <= cfg.atol + cfg.rtol * y.abs()))
    scale = y.abs()
    rel = torch.where(scale > 0, diff / scale, torch.where(diff > 0, math.inf, 0.0))
    nan_a, nan_b = int(torch.isnan(x).sum()), int(torch.isnan(y).sum())
    note = ""
    if nan_a != int(both_nan.sum()) or nan_b != int(both_nan.sum()):
        note = f"NaN at different positions: A has {nan_a}, B has {nan_b}"
    return bool(ok.all()), diff.max().item(), rel.max().item(), note


def _means_close(ma: float, mb: float, cfg: CheckConfig) -> bool:
    if ma == mb or (math.isnan(ma) and math.isnan(mb)):
        return True
    return math.isfinite(ma - mb) and abs(ma - mb) <= cfg.atol + cfg.rtol * abs(mb)


def _cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors: 1 for two zero vectors, 0 for one."""
    x, y = x.flatten(), y.flatten()
    nx, ny = x.norm().item(), y.norm().item()
    if nx == 0 and ny == 0:
        return 1.0
    if nx == 0 or ny == 0:
        return 0.0
    return (torch.dot(x, y).item()) / (nx * ny)


def compare_tensors(a: torch.Tensor, b: torch.Tensor, cfg: CheckConfig) -> TensorDiff:
    """Compare ``a`` (side A) with ``b`` (side B) under ``cfg.compare_mode``.

    - different shapes: never equal;
    - two non-floating tensors (token ids, masks): compared exactly;
    - ``strict``: ``|a-b| <= atol + rtol*|b|`` elementwise (NaN in the same places is equal);
    - ``mean``: ``|mean(a)-mean(b)| <= atol + rtol*|mean(b)|``;
    - ``cosine``: ``1 - cos(a, b) <= atol`` on the flattened tensors.
    """
    diff = TensorDiff(
        equal=False,
        mode=cfg.compare_mode,
        shape_a=list(a.shape),
        shape_b=list(b.shape),
        dtype_a=str(a.dtype).removeprefix("torch."),
        dtype_b=str(b.dtype).removeprefix("torch."),
        stats_a=tensor_stats(a.real if a.is_complex() else a),
        stats_b=tensor_stats(b.real if b.is_complex() else b),
    )
    if a.shape != b.shape:
        diff.note = "shapes differ"
        return diff
    if a.numel() == 0:
        diff.equal = True
        return diff
    x, y = _as_float64(a), _as_float64(b)
    close, diff.max_abs, diff.max_rel, diff.note = _strict_numbers(x, y, cfg)
    if not _is_float(a) and not _is_float(b):
        diff.equal = bool(torch.equal(x, y))
        diff.note = "non-floating tensors, compared exactly"
        return diff
    if cfg.compare_mode == "strict":
        diff.equal = close
    elif cfg.compare_mode == "mean":
        diff.mean_a, diff.mean_b = x.mean().item(), y.mean().item()
        diff.equal = _means_close(diff.mean_a, diff.mean_b, cfg)
    else:
        diff.cosine = _cosine(x, y)
        diff.equal = (1.0 - diff.cosine) <= cfg.atol
    return diff


def _is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


@dataclass
class ListDiff:
    """Pairwise comparison of two lists of recorded tensors (outputs or input grads).

    Only the common prefix decides; a length mismatch is noted but is not a difference.
    """

    diffs: list[TensorDiff]
    len_a: int
    len_b: int

    @property
    def first(self) -> int | None:
        """Index of the first differing tensor, or ``None``."""
        return next((i for i, d in enumerate(self.diffs) if not d.equal), None)

    @property
    def differs(self) -> bool:
        return self.first is not None

    def length_note(self, what: str) -> str:
        if self.len_a == self.len_b:
            return ""
        return (
            f"{what} counts differ (A {self.len_a}, B {self.len_b}); "
            f"compared the first {min(self.len_a, self.len_b)}"
        )

    def brief(self, what: str) -> str:
        """``ok`` or ``DIFF <what> i: <numbers>``, plus a length note."""
        first = self.first
        text = "ok" if first is None else f"DIFF {what} {first}: {self.diffs[first].numbers()}"
        note = self.length_note(what)
        return f"{text}; {note}" if note else text


def compare_entries(
    entries_a: list[dict],
    entries_b: list[dict],
    store_a: TensorStore,
    store_b: TensorStore,
    cfg: CheckConfig,
) -> ListDiff:
    """Compare two ``outputs`` (or ``grads``) lists of report nodes position by position."""
    diffs = [
        compare_tensors(store_a.get(ea["tensor"]), store_b.get(eb["tensor"]), cfg)
        for ea, eb in zip(entries_a, entries_b)
    ]
    return ListDiff(diffs, len(entries_a), len(entries_b))


# ---------------------------------------------------------------------------- node matching


@dataclass(eq=False)
class Node:
    """One recorded module call of a (possibly rank-merged) report."""

    uid: int  # index in the side's node list (sorted by forward position)
    info: dict  # the node entry of report.json
    store: TensorStore  # tensors.safetensors of the rank it came from
    parent: int | None = None  # uid of the enclosing call on the same side
    fwd_pos: tuple = ()
    bwd_pos: tuple = ()

    @property
    def ident(self) -> tuple[str, int]:
        return (self.info["key"], self.info.get("call", 0))

    @property
    def key(self) -> str:
        return self.info["key"]

    @property
    def call(self) -> int:
        return self.info.get("call", 0)

    @property
    def route(self) -> str:
        return self.info.get("route", self.info["key"]) or "<root>"

    @property
    def type(self) -> str:
        return self.info.get("type", "?")

    def entries(self, phase: str) -> list[dict]:
        """The forward ``outputs`` or the backward input ``grads``."""
        return self.info.get("outputs" if phase == "forward" else "grads") or []

    def describe(self) -> str:
        return f"{self.route} ({self.type}, key {self.key!r}, call {self.call})"


@dataclass
class ReportSide:
    """The nodes of one side's report at one step (ranks already merged)."""

    name: str  # "A" or "B"
    path: str  # the path the user passed
    rank_dirs: list[str]
    nodes: list[Node]
    rename: bool = False
    model_class: str = ""

    def where(self) -> str:
        if len(self.rank_dirs) == 1:
            return self.rank_dirs[0]
        return f"{len(self.rank_dirs)} ranks merged under {os.path.dirname(self.rank_dirs[0])}"


@dataclass(eq=False)
class Pair:
    """A node of side A matched with a node of side B."""

    a: Node
    b: Node
    how: str  # "name", "mapped" or "order"
    parent: Pair | None = None
    children: list[Pair] = field(default_factory=list)


@dataclass
class Matching:
    """Matched pairs (in A's call order), the matched tree, and the unmatched nodes."""

    pairs: list[Pair]
    tops: list[Pair]
    unmatched_a: list[Node]
    unmatched_b: list[Node]
    transparent: set[int] = field(default_factory=set)  # id() of unmatched transparent nodes


def _pair_by_name(side_a: ReportSide, side_b: ReportSide) -> dict[int, Pair]:
    index: dict[tuple, Node] = {}
    for node in side_b.nodes:
        index.setdefault(node.ident, node)
    return {a.uid: Pair(a, index[a.ident], "name") for a in side_a.nodes if a.ident in index}


def _pair_mapped(side_a: ReportSide, side_b: ReportSide, pairs: dict[int, Pair]) -> None:
    """Pair unmatched ``mapped`` nodes of both sides k-th with k-th in call order."""
    used_b = {p.b.uid for p in pairs.values()}
    free_a = [n for n in side_a.nodes if n.info.get("mapped") and n.uid not in pairs]
    free_b = [n for n in side_b.nodes if n.info.get("mapped") and n.uid not in used_b]
    for a, b in zip(free_a, free_b):
        pairs[a.uid] = Pair(a, b, "mapped")


def _first_keys(side: ReportSide, n: int = 5) -> str:
    return ", ".join(repr(node.key) for node in side.nodes[:n]) + (
        ", ..." if len(side.nodes) > n else ""
    )


def _transparent(side: ReportSide, matched: set[int]) -> set[int]:
    """uids of the nodes of ``side`` with a matched descendant (on the same side)."""
    found: set[int] = set()
    for uid in matched:
        parent = side.nodes[uid].parent
        while parent is not None and parent not in found:
            found.add(parent)
            parent = side.nodes[parent].parent
    return found


def _missing_error(node: Node, has: ReportSide, lacks: ReportSide, more: int) -> ValueError:
    extra = f" ({more} more unmatched node(s) are listed by the log)" if more else ""
    return ValueError(
        f"the dumps hold different models: module call {node.describe()} is recorded by side "
        f"{has.name} ({has.where()}) but side {lacks.name} ({lacks.where()}) has no module "
        f"call with key {node.key!r} / call {node.call}{extra}. If the models name their "
        'modules differently, record with rename rules (report.json "rename": true) or a '
        "layer map"
    )


def _build_tree(side_a: ReportSide, pairs: dict[int, Pair]) -> list[Pair]:
    """Link each pair to the pair of A's nearest matched ancestor; return the top pairs."""
    tops = []
    for uid in sorted(pairs):
        pair = pairs[uid]
        parent = side_a.nodes[uid].parent
        while parent is not None and parent not in pairs:
            parent = side_a.nodes[parent].parent
        if parent is None:
            tops.append(pair)
        else:
            pair.parent = pairs[parent]
            pairs[parent].children.append(pair)
    return tops


def cross_model(side_a, side_b) -> bool:
    """Two different models keyed by rename rules (a libai port against the transformers
    original): modules or parameters without a counterpart are expected. The class names
    alone do not tell (libai's and transformers' ``LlamaForCausalLM``): a side keyed by
    rules against one keyed by its own names is a cross-model comparison too."""
    renamed = side_a.rename or side_b.rename
    return renamed and (side_a.model_class != side_b.model_class or side_a.rename != side_b.rename)


def match_nodes(side_a: ReportSide, side_b: ReportSide) -> Matching:
    """Pair the nodes of two reports and build the matched tree.

    By ``(key, call)``; then unmatched ``mapped`` nodes k-th with k-th; when no name
    matched at all, every node by call order (equal node counts required). Unmatched
    nodes without a matched descendant raise ``ValueError`` unless either report has
    ``"rename": true``.
    """
    pairs = _pair_by_name(side_a, side_b)
    named = bool(pairs)
    _pair_mapped(side_a, side_b, pairs)
    if not named:
        if len(side_a.nodes) == len(side_b.nodes):
            pairs = {a.uid: Pair(a, b, "order") for a, b in zip(side_a.nodes, side_b.nodes)}
        elif not pairs:
            raise ValueError(
                f"the dumps hold different models: no module key of side A ({side_a.where()}) "
                f"is found in side B ({side_b.where()}) and the node counts differ "
                f"({len(side_a.nodes)} vs {len(side_b.nodes)}); A records {_first_keys(side_a)}"
                f"; B records {_first_keys(side_b)}"
            )
    used_b = {p.b.uid for p in pairs.values()}
    trans_a = _transparent(side_a, set(pairs))
    trans_b = _transparent(side_b, used_b)
    lone_a = [n for n in side_a.nodes if n.uid not in pairs]
    lone_b = [n for n in side_b.nodes if n.uid not in used_b]
    if not cross_model(side_a, side_b):
        for lone, trans, has, lacks in (
            (lone_a, trans_a, side_a, side_b),
            (lone_b, trans_b, side_b, side_a),
        ):
            missing = [n for n in lone if n.uid not in trans]
            if missing:
                raise _missing_error(missing[0], has, lacks, len(missing) - 1)
    transparent = {id(n) for n in lone_a if n.uid in trans_a}
    transparent |= {id(n) for n in lone_b if n.uid in trans_b}
    tops = _build_tree(side_a, pairs)
    ordered = [pairs[uid] for uid in sorted(pairs)]
    return Matching(ordered, tops, lone_a, lone_b, transparent)
