"""The matched call tree: finding the first differing module (top-down) and the log files."""

from __future__ import annotations

import os
from dataclasses import dataclass

from libai.align.compare import CheckConfig, ListDiff, Matching, Node, Pair, compare_entries

HERE = "<---  *** HERE ***"
LEAF = "leaf differs"
CHILDREN_EQUAL = "children equal but this module differs"
ENCLOSING_AGREE = "differs although its enclosing modules agree"


@dataclass
class PhaseResult:
    """The comparison of every matched pair in one phase, and the first difference."""

    phase: str  # "forward" or "backward"
    results: dict[Pair, ListDiff]  # only the pairs taking part in the phase
    order: list[Pair]  # those pairs in phase order
    first: Pair | None = None
    reason: str = ""

    @property
    def differs(self) -> bool:
        return any(r.differs for r in self.results.values())

    @property
    def what(self) -> str:
        return "output" if self.phase == "forward" else "grad"


def is_active(pair: Pair, phase: str) -> bool:
    """Forward: every pair; backward: pairs with gradients on both sides."""
    return phase == "forward" or bool(pair.a.entries(phase) and pair.b.entries(phase))


def phase_key(node: Node, phase: str) -> tuple:
    """Sort key of siblings: call order forward, backward execution order backward."""
    return node.fwd_pos if phase == "forward" else node.bwd_pos


def phase_children(pairs: list[Pair], phase: str) -> list[Pair]:
    """``pairs`` with inactive pairs replaced by their (active) children, in phase order."""
    out: list[Pair] = []
    stack = list(pairs)
    while stack:
        pair = stack.pop()
        if is_active(pair, phase):
            out.append(pair)
        else:
            stack.extend(pair.children)
    return sorted(out, key=lambda p: phase_key(p.a, phase))


def _descend(siblings: list[Pair], result: PhaseResult) -> tuple[Pair, str] | None:
    first = next((p for p in siblings if result.results[p].differs), None)
    if first is None:
        return None
    children = phase_children(first.children, result.phase)
    if not children:
        return first, LEAF
    return _descend(children, result) or (first, CHILDREN_EQUAL)


def compare_phase(matching: Matching, phase: str, cfg: CheckConfig) -> PhaseResult:
    """Compare every active pair and locate the first difference by top-down descent."""
    active = [p for p in matching.pairs if is_active(p, phase)]
    order = sorted(active, key=lambda p: phase_key(p.a, phase))
    results = {
        p: compare_entries(p.a.entries(phase), p.b.entries(phase), p.a.store, p.b.store, cfg)
        for p in order
    }
    result = PhaseResult(phase, results, order)
    found = _descend(phase_children(matching.tops, phase), result)
    if found is None:  # e.g. a loss within tolerance over a module that is not
        late = next((p for p in order if results[p].differs), None)
        found = (None, "")
        if late is not None:  # descend from the first difference whose enclosing agree
            pair, reason = _descend([late], result)
            if pair is late:
                reason = ENCLOSING_AGREE
            else:
                reason = f"{reason}; under {late.a.route}, which {ENCLOSING_AGREE}"
            found = (pair, reason)
    result.first, result.reason = found
    return result


def pair_label(pair: Pair) -> str:
    """``key (call c)  A: <route> <type>  |  B: <route> <type>``."""
    key_a, key_b = pair.a.key or "<root>", pair.b.key or "<root>"
    key = key_a if key_a == key_b else f"{key_a} <-> {key_b}"
    call = (
        f"call {pair.a.call}" if pair.a.call == pair.b.call else f"call {pair.a.call}/{pair.b.call}"
    )
    how = "" if pair.how == "name" else f" [matched by {pair.how}]"
    return (
        f"{key} ({call}){how}  A: {pair.a.route} {pair.a.type}  |  B: {pair.b.route} {pair.b.type}"
    )


def _tree_lines(pairs: list[Pair], result: PhaseResult, depth: int, out: list[str]) -> None:
    for pair in sorted(pairs, key=lambda p: phase_key(p.a, result.phase)):
        if pair in result.results:
            status = result.results[pair].brief(result.what)
        else:
            status = "-- no grads on both sides"
        marker = f"  {HERE} ({result.reason})" if pair is result.first else ""
        out.append(f"{'  ' * depth}{pair_label(pair)}   [{status}]{marker}")
        _tree_lines(pair.children, result, depth + 1, out)


def _unmatched_lines(title: str, nodes: list[Node], transparent: set[int]) -> list[str]:
    if not nodes:
        return []
    lines = ["", title]
    for node in nodes:
        tag = "  [transparent: a descendant is matched]" if id(node) in transparent else ""
        lines.append(f"  {node.describe()}{tag}")
    return lines


def report_log_lines(
    header: list[str], matching: Matching, result: PhaseResult, where_a: str, where_b: str
) -> list[str]:
    """The lines of one report log: header, the matched tree, the unmatched nodes."""
    lines = list(header)
    lines.append("")
    _tree_lines(matching.tops, result, 0, lines)
    lines += _unmatched_lines(
        f"unmatched nodes of side A ({where_a}):", matching.unmatched_a, matching.transparent
    )
    lines += _unmatched_lines(
        f"unmatched nodes of side B ({where_b}):", matching.unmatched_b, matching.transparent
    )
    return lines


def write_log(log_dir: str, name: str, lines: list[str]) -> str:
    """Write ``lines`` to ``<log_dir>/<name>`` and return its path."""
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path
