"""Offline checkers of alignment dumps: find the first module (or parameter) where two
recorded runs disagree.

``path_a`` and ``path_b`` are both model dirs (``<root>/<model>``, holding ``step_*``),
both step dirs (holding ``rank_*``) or both rank dirs (holding ``report.json`` /
``params.json``); see :mod:`libai.align.dump_format`. Every step is checked, rank ``i``
against rank ``i``; a side with N > 1 ranks compared with a single-rank side is merged
into one logical dump first (tensor- / pipeline-parallel run vs a single process).

``cfg`` keys: ``atol`` (1e-6), ``rtol`` (1e-5), ``compare_mode`` (``"strict"`` |
``"mean"`` | ``"cosine"``), ``diff_phase`` (``"both"`` | ``"forward"`` | ``"backward"``;
reports only) and ``log_dir`` (default ``<dir of path_b>/align_log``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from libai.align.compare import (
    CheckConfig,
    Matching,
    Node,
    Pair,
    ReportSide,
    TensorDiff,
    TensorStore,
    compare_tensors,
    cross_model,
    match_nodes,
    resolve_cfg,
)
from libai.align.dump_format import (
    GRADS,
    PARAMS,
    REPORT,
    TENSORS,
    WEIGHTS,
    numbered_subdirs,
    read_json,
)
from libai.align.tree_log import (
    HERE,
    PhaseResult,
    compare_phase,
    pair_label,
    report_log_lines,
    write_log,
)

__all__ = ["check_report", "check_params", "check_weights", "check_grads"]

WRITERS = {
    REPORT: "dump_report",
    TENSORS: "dump_report",
    PARAMS: "dump_params, dump_weights or dump_grads",
    WEIGHTS: "dump_weights or dump_params",
    GRADS: "dump_grads or dump_params",
}
_PREFIX = "[libai.align]"


# ------------------------------------------------------------------------------ dump paths


@dataclass
class Unit:
    """One comparison: a step and the rank dirs of each side (several when merged)."""

    step: int
    rank: int
    dirs_a: list[str]
    dirs_b: list[str]

    @property
    def title(self) -> str:
        if len(self.dirs_a) == len(self.dirs_b) == 1:
            return f"step {self.step} rank {self.rank}"
        return f"step {self.step} (A: {len(self.dirs_a)} rank(s), B: {len(self.dirs_b)}, merged)"

    @property
    def tag(self) -> str:
        return f"step_{self.step}_rank_{self.rank}"


def _number(path: str) -> int:
    m = re.search(r"_(\d+)$", os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else 0


def _level(path: str) -> str:
    """``"model"``, ``"step"`` or ``"rank"``: what kind of dump dir ``path`` is."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"alignment dump path {path!r} does not exist")
    if not os.path.isdir(path):
        raise ValueError(f"alignment dump path {path!r} is not a directory")
    if os.path.isfile(os.path.join(path, REPORT)) or os.path.isfile(os.path.join(path, PARAMS)):
        return "rank"
    if numbered_subdirs(path, "rank"):
        return "step"
    if numbered_subdirs(path, "step"):
        return "model"
    raise ValueError(
        f"{path!r} holds no alignment dump: expected a model dir (with step_*), a step dir "
        f"(with rank_*) or a rank dir (with {REPORT} / {PARAMS})"
    )


def _steps(path: str, level: str) -> list[tuple[int, dict[int, str]]]:
    """``[(step, {rank: rank dir})]`` of a dump dir of the given level."""
    if level == "rank":
        return [(_number(os.path.dirname(os.path.normpath(path))), {_number(path): path})]
    if level == "step":
        return [(_number(path), numbered_subdirs(path, "rank"))]
    steps = [(k, numbered_subdirs(d, "rank")) for k, d in numbered_subdirs(path, "step").items()]
    for k, ranks in steps:
        if not ranks:
            raise ValueError(f"{os.path.join(path, f'step_{k}')} holds no rank_* dirs")
    return steps


def _units(path_a: str, path_b: str) -> list[Unit]:
    """Pair the steps and ranks of both dumps (merging a multi-rank side when needed)."""
    level_a, level_b = _level(path_a), _level(path_b)
    if level_a != level_b:
        raise ValueError(
            f"cannot compare a {level_a} dir ({path_a}) with a {level_b} dir ({path_b}): "
            "pass two model dirs, two step dirs or two rank dirs"
        )
    steps_a, steps_b = _steps(path_a, level_a), _steps(path_b, level_b)
    if len(steps_a) != len(steps_b):
        raise ValueError(
            f"step counts differ: {len(steps_a)} step(s) in {path_a} vs {len(steps_b)} in "
            f"{path_b}; dump the same steps of both runs"
        )
    units = []
    for (step, ranks_a), (_, ranks_b) in zip(steps_a, steps_b):
        if len(ranks_a) == len(ranks_b):
            units += [
                Unit(step, r, [da], [db]) for (r, da), db in zip(ranks_a.items(), ranks_b.values())
            ]
        elif len(ranks_a) == 1 or len(ranks_b) == 1:
            rank = next(iter(ranks_a if len(ranks_a) == 1 else ranks_b))
            units.append(Unit(step, rank, list(ranks_a.values()), list(ranks_b.values())))
        else:
            raise ValueError(
                f"rank counts differ at step {step}: {len(ranks_a)} rank(s) in {path_a} vs "
                f"{len(ranks_b)} in {path_b}; compare runs with equal rank counts or against "
                "a single-process run"
            )
    return units


def _require(dirs: list[str], names: list[str]) -> None:
    for d in dirs:
        for name in names:
            TensorStore(os.path.join(d, name), WRITERS[name]).require()


def _config(cfg: dict | None, path_b: str) -> CheckConfig:
    default_log_dir = os.path.join(os.path.dirname(os.path.abspath(path_b)), "align_log")
    return resolve_cfg(cfg, default_log_dir)


# ------------------------------------------------------------------------------- reports


def _drop_split_containers(kept: dict, parent_of: dict, stages: dict[tuple, set[int]]) -> None:
    """Drop calls recorded on several pipeline stages (a container such as ``GPT_model``
    whose forward runs a different part on each stage: no stage holds its whole output);
    their children hang from the dropped call's parent instead."""
    split = {ident for ident, seen in stages.items() if len(seen) > 1}
    for ident in split:
        kept.pop(ident, None)

    def surviving(ident):
        while ident in split:
            ident = parent_of.get(ident)
        return ident

    for ident in list(parent_of):
        parent_of[ident] = surviving(parent_of[ident])


def load_report(name: str, path: str, rank_dirs: list[str]) -> ReportSide:
    """Read ``report.json`` of ``rank_dirs`` and merge them into one side.

    Nodes are unioned by ``(key, call)``, the first rank winning; a node keeps the parent
    link of its own rank (re-pointed at the winning node of the parent's identity). Nodes
    are ordered by (pipeline stage, id) forward and (reversed stage, bwd_order) backward.
    """
    kept: dict[tuple, Node] = {}
    parent_of: dict[tuple, tuple | None] = {}
    stages: dict[tuple, set[int]] = {}
    rename = False
    for rank_index, rank_dir in enumerate(rank_dirs):
        report = read_json(os.path.join(rank_dir, REPORT))
        rename = rename or bool(report.get("rename"))
        model_class = report.get("model_class", "")
        store = TensorStore(os.path.join(rank_dir, TENSORS), WRITERS[TENSORS])
        stage = (report.get("layout") or {}).get("pp_rank") or 0
        by_id = {n["id"]: n for n in report.get("nodes", [])}
        for info in report.get("nodes", []):
            node = Node(-1, info, store)
            stages.setdefault(node.ident, set()).add(stage)
            if node.ident in kept:
                continue
            bwd = info.get("bwd_order")
            node.fwd_pos = (stage, info["id"], rank_index)
            node.bwd_pos = (-stage, bwd, rank_index) if bwd is not None else (float("inf"),)
            parent = by_id.get(info.get("parent"))
            kept[node.ident] = node
            parent_of[node.ident] = parent and (parent["key"], parent.get("call", 0))
    _drop_split_containers(kept, parent_of, stages)
    nodes = sorted(kept.values(), key=lambda n: n.fwd_pos)
    for uid, node in enumerate(nodes):
        node.uid = uid
    for node in nodes:
        parent = kept.get(parent_of[node.ident])
        node.parent = None if parent is None or parent is node else parent.uid
    return ReportSide(name, path, rank_dirs, nodes, rename, model_class)


def _input_index(pair: Pair, phase: str, index: int) -> str:
    entry = pair.a.entries(phase)[index]
    return f" (input {entry['index']})" if "index" in entry and entry["index"] != index else ""


def _phase_summary(result: PhaseResult, log_path: str) -> list[str]:
    phase = result.phase
    if not result.results:
        return [f"  {phase}: nothing to compare (no {result.what}s recorded on both sides)"]
    if result.first is None:
        return [f"  {phase}: ok ({len(result.results)} module calls compared)  log: {log_path}"]
    pair, diff = result.first, result.results[result.first]
    index = diff.first
    count = sum(r.differs for r in result.results.values())
    lines = [
        f"  {phase}: DIFF at key {pair.a.key!r} (call {pair.a.call}): {result.reason}",
        f"    A: {pair.a.route} ({pair.a.type})",
        f"    B: {pair.b.route} ({pair.b.type})",
        f"    {result.what} {index}{_input_index(pair, phase, index)} of "
        f"{min(diff.len_a, diff.len_b)} compared:",
    ]
    lines += [f"      {text}" for text in diff.diffs[index].details()]
    if diff.length_note(result.what):
        lines.append(f"    note: {diff.length_note(result.what)}")
    lines.append(f"    {count} of {len(result.results)} module calls differ; log: {log_path}")
    return lines


def _report_header(
    unit: Unit,
    phase: str,
    sides: tuple[ReportSide, ReportSide],
    conf: CheckConfig,
    result: PhaseResult,
    matching: Matching,
) -> list[str]:
    how = {}
    for pair in matching.pairs:
        how[pair.how] = how.get(pair.how, 0) + 1
    if result.first is None:
        verdict = "ok" if result.results else "nothing to compare"
    else:
        verdict = f"DIFF at {pair_label(result.first)} ({result.reason})"
    return [
        f"libai.align report check, {phase} phase, {unit.title}",
        f"A: {sides[0].where()}",
        f"B: {sides[1].where()}",
        conf.describe(),
        f"matched pairs: {len(matching.pairs)} {how}; unmatched: A {len(matching.unmatched_a)}"
        f", B {len(matching.unmatched_b)}",
        f"result: {verdict}",
    ]


def _check_report_unit(
    unit: Unit, side_a: ReportSide, side_b: ReportSide, matching: Matching, conf: CheckConfig
) -> bool:
    phases = ["forward", "backward"] if conf.diff_phase == "both" else [conf.diff_phase]
    ok = True
    lines = []
    for phase in phases:
        result = compare_phase(matching, phase, conf)
        header = _report_header(unit, phase, (side_a, side_b), conf, result, matching)
        body = report_log_lines(header, matching, result, side_a.where(), side_b.where())
        log_path = write_log(conf.log_dir, f"report_{phase}_{unit.tag}.log", body)
        lines += _phase_summary(result, log_path)
        ok = ok and not result.differs
    for node in side_a.nodes + side_b.nodes:
        node.store.release()
    title = f"{_PREFIX} report {unit.title}: {'ok' if ok else 'DIFF'} ({conf.describe()})"
    where = f"  A: {side_a.where()}\n  B: {side_b.where()}"
    print(title, where, *lines, sep="\n")
    return ok


def check_report(path_a: str, path_b: str, cfg: dict | None = None) -> bool:
    """Compare the recorded forward outputs / input gradients of two dumps.

    Returns ``True`` when every matched module call agrees within tolerance at every
    step and rank. Prints a summary per step/rank with the first differing module and
    writes ``report_<phase>_step_<k>_rank_<r>.log`` (the matched tree) into ``log_dir``.
    Raises ``FileNotFoundError`` for a missing path or file and ``ValueError`` for dumps
    that cannot be compared (different models, step or rank counts, bad ``cfg``).
    """
    conf = _config(cfg, path_b)
    units = _units(path_a, path_b)
    for unit in units:
        _require(unit.dirs_a + unit.dirs_b, [REPORT, TENSORS])
    matched = []
    for unit in units:  # structural errors before any tensor is compared
        side_a = load_report("A", path_a, unit.dirs_a)
        side_b = load_report("B", path_b, unit.dirs_b)
        matched.append((unit, side_a, side_b, match_nodes(side_a, side_b)))
    results = [_check_report_unit(*args, conf) for args in matched]
    return all(results)


# ------------------------------------------------------------------------------ parameters


@dataclass
class ParamsSide:
    """``params.json`` entries of one side by key (ranks merged, first rank wins)."""

    name: str
    where: str
    entries: dict[str, tuple[dict, dict[str, TensorStore]]]
    rename: bool
    model_class: str = ""


@dataclass
class ParamRow:
    key: str
    name_a: str
    name_b: str
    differs: bool
    diff: TensorDiff | None = None
    note: str = ""

    def status(self) -> str:
        if self.diff is None:
            return self.note
        return f"DIFF {self.diff.numbers()}" if self.differs else "ok"


def load_params(name: str, rank_dirs: list[str]) -> ParamsSide:
    """Read and merge ``params.json`` of ``rank_dirs`` (first rank wins per key)."""
    entries: dict[str, tuple[dict, dict[str, TensorStore]]] = {}
    rename, model_class = False, ""
    for rank_dir in rank_dirs:
        meta = read_json(os.path.join(rank_dir, PARAMS))
        rename = rename or bool(meta.get("rename"))
        model_class = meta.get("model_class", "")
        stores = {
            kind: TensorStore(os.path.join(rank_dir, file), WRITERS[file])
            for kind, file in (("weights", WEIGHTS), ("grads", GRADS))
        }
        for info in meta.get("params", []):
            entries.setdefault(info["key"], (info, stores))
    where = rank_dirs[0]
    if len(rank_dirs) > 1:
        where = f"{len(rank_dirs)} ranks merged under {os.path.dirname(rank_dirs[0])}"
    return ParamsSide(name, where, entries, rename, model_class)


def _match_params(side_a: ParamsSide, side_b: ParamsSide) -> tuple[list[str], list[str]]:
    """Common keys (A's order) and a description of the unmatched keys; raises on errors."""
    common = [k for k in side_a.entries if k in side_b.entries]
    if not common:
        raise ValueError(
            f"no parameter key of side A ({side_a.where}) is found in side B "
            f"({side_b.where}): A has {list(side_a.entries)[:5]}, B has "
            f"{list(side_b.entries)[:5]}"
        )
    lone = []
    for has, lacks in ((side_a, side_b), (side_b, side_a)):
        for key, (info, _) in has.entries.items():
            if key in lacks.entries:
                continue
            if not cross_model(side_a, side_b):
                raise ValueError(
                    f"parameter key {key!r} ({info.get('name', key)}) is in side {has.name} "
                    f"({has.where}) but side {lacks.name} ({lacks.where}) lacks it"
                )
            lone.append(f"  side {has.name} only: {key!r} ({info.get('name', key)})")
    return common, lone


def _param_row(key: str, side_a: ParamsSide, side_b: ParamsSide, kind: str, conf) -> ParamRow:
    (info_a, stores_a), (info_b, stores_b) = side_a.entries[key], side_b.entries[key]
    row = ParamRow(key, info_a.get("name", key), info_b.get("name", key), False)
    has_a, has_b = stores_a[kind].has(key), stores_b[kind].has(key)
    if not (has_a and has_b):
        row.differs = has_a != has_b
        which = "A" if has_a else "B"
        row.note = f"DIFF {kind} only on side {which}" if row.differs else f"no {kind}"
        return row
    row.diff = compare_tensors(stores_a[kind].get(key), stores_b[kind].get(key), conf)
    row.differs = not row.diff.equal
    return row


def _kind_lines(kind: str, rows: list[ParamRow]) -> list[str]:
    first = next((r for r in rows if r.differs), None)
    lines = [f"[{kind}]"]
    for row in rows:
        marker = f"  {HERE}" if row is first else ""
        lines.append(f"{row.key}  A: {row.name_a}  |  B: {row.name_b}   [{row.status()}]{marker}")
    return lines


def _kind_summary(kind: str, rows: list[ParamRow]) -> list[str]:
    bad = [r for r in rows if r.differs]
    if not bad:
        return [f"  {kind}: ok ({len(rows)} parameters compared)"]
    first = bad[0]
    lines = [
        f"  {kind}: DIFF in {len(bad)} of {len(rows)} parameters; first key {first.key!r}",
        f"    A: {first.name_a}",
        f"    B: {first.name_b}",
    ]
    lines += [f"      {t}" for t in (first.diff.details() if first.diff else [first.note])]
    for row in bad[1:11]:
        lines.append(f"    also {row.key!r} (A: {row.name_a}, B: {row.name_b}): {row.status()}")
    if len(bad) > 11:
        lines.append(f"    ... and {len(bad) - 11} more (see the log)")
    return lines


def _check_params(path_a: str, path_b: str, cfg: dict | None, kinds: tuple[str, ...]) -> bool:
    conf = _config(cfg, path_b)
    units = _units(path_a, path_b)
    files = [PARAMS] + [WEIGHTS if kind == "weights" else GRADS for kind in kinds]
    for unit in units:
        _require(unit.dirs_a + unit.dirs_b, files)
    sides = [(load_params("A", u.dirs_a), load_params("B", u.dirs_b)) for u in units]
    matched = [_match_params(a, b) for a, b in sides]
    log_name = "params" if len(kinds) > 1 else kinds[0]
    ok = True
    for unit, (side_a, side_b), (common, lone) in zip(units, sides, matched):
        body, summary, unit_ok = [], [], True
        for kind in kinds:
            rows = [_param_row(key, side_a, side_b, kind, conf) for key in common]
            body += [""] + _kind_lines(kind, rows)
            summary += _kind_summary(kind, rows)
            unit_ok = unit_ok and not any(r.differs for r in rows)
        ok = ok and unit_ok
        if lone:
            body += ["", "unmatched keys (rename rules applied):"] + lone
        header = [
            f"libai.align {log_name} check, {unit.title}",
            f"A: {side_a.where}",
            f"B: {side_b.where}",
            conf.describe(),
        ]
        log_path = write_log(conf.log_dir, f"{log_name}_{unit.tag}.log", header + body)
        verdict = "ok" if unit_ok else "DIFF"
        title = f"{_PREFIX} {log_name} {unit.title}: {verdict} ({conf.describe()})"
        where = f"  A: {side_a.where}\n  B: {side_b.where}"
        print(title, where, *summary, f"  log: {log_path}", sep="\n")
        for entries in (side_a.entries, side_b.entries):
            for _, stores in entries.values():
                for store in stores.values():
                    store.release()
    return ok


def check_params(path_a: str, path_b: str, cfg: dict | None = None) -> bool:
    """Compare parameter values and gradients (``weights`` and ``grads`` safetensors).

    Entries are matched by ``key``; every differing parameter is reported, the first (in
    A's ``params.json`` order) marked in ``params_step_<k>_rank_<r>.log``.
    """
    return _check_params(path_a, path_b, cfg, ("weights", "grads"))


def check_weights(path_a: str, path_b: str, cfg: dict | None = None) -> bool:
    """Compare parameter values only (log ``weights_step_<k>_rank_<r>.log``)."""
    return _check_params(path_a, path_b, cfg, ("weights",))


def check_grads(path_a: str, path_b: str, cfg: dict | None = None) -> bool:
    """Compare parameter gradients only (log ``grads_step_<k>_rank_<r>.log``)."""
    return _check_params(path_a, path_b, cfg, ("grads",))
