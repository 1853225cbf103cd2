"""libai.align's rename rules, call indices, dump headers, report merging and report output
against references known by construction: tiny hand-built torch models recorded through
the recorder, dumps written by hand in the documented format (libai/align/dump_format.py),
keys derived here with ``re.sub`` and numbers worked out by hand."""

from __future__ import annotations

import glob
import json
import math
import os
import re

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from libai.align.checker import check_report, check_weights
from libai.align.compare import compare_tensors, resolve_cfg
from libai.align.dump_format import (
    FORMAT,
    PARAMS,
    REPORT,
    TENSORS,
    dtype_name,
    step_dir,
    tensor_stats,
    write_json,
)
from libai.align.recorder import create_model
from libai.align.tree_log import HERE

# ---------------------------------------------------------------------------- helpers


class _Tiny(nn.Module):
    """``second(tanh(first(x)))``: two Linear layers named ``first`` and ``second``."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 4)
        self.second = nn.Linear(4, 2)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


class _Port(nn.Module):
    """The same computation with the layers in a ModuleList (routes ``lin.0``, ``lin.1``);
    with ``post`` an extra identity module runs on the output."""

    def __init__(self, post: bool = False):
        super().__init__()
        self.lin = nn.ModuleList([nn.Linear(3, 4), nn.Linear(4, 2)])
        self.post = nn.Identity() if post else None

    def forward(self, x):
        y = self.lin[1](torch.tanh(self.lin[0](x)))
        return self.post(y) if self.post is not None else y


def _tiny_and_port(post: bool = False) -> tuple[_Tiny, _Port]:
    """A ``_Tiny`` and a ``_Port`` holding the same weights."""
    torch.manual_seed(0)
    tiny, port = _Tiny(), _Port(post)
    with torch.no_grad():
        for src, dst in ((tiny.first, port.lin[0]), (tiny.second, port.lin[1])):
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)
    return tiny, port


_X = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])


def _record(model: nn.Module, name: str, root, rename=None, black_root=False) -> str:
    """Record one forward + backward of ``model`` on ``_X``, dump step 0; the model dir."""
    rec = create_model(model, name, rename=rename)
    if black_root:
        rec.update_black_list(model, "self")
    try:
        out = rec(_X.clone().requires_grad_(True))
        rec.backward(out.pow(2).sum())
        rec.try_dump(str(root))
    finally:
        rec.close()
    return str(root / name)


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _log(log_dir, name: str) -> str:
    with open(os.path.join(str(log_dir), name), encoding="utf-8") as f:
        return f.read()


def _here_line(text: str) -> str:
    (line,) = [line for line in text.splitlines() if HERE in line]
    return line


def _write_report(path, specs, *, pp_rank=0, rank=0, model_class="Tiny"):
    """report.json + tensors.safetensors in the documented format. ``specs``: dicts with
    ``route``, ``parent`` (an id), optional ``call`` (left out when absent), ``bwd`` and
    ``outputs`` / ``grads`` (lists of tensors)."""
    os.makedirs(path, exist_ok=True)
    tensors, nodes = {}, []
    for i, spec in enumerate(specs):
        node = {
            "id": i,
            "route": spec["route"],
            "key": spec["route"],
            "type": spec.get("type", "Linear"),
            "parent": spec.get("parent"),
            "mapped": False,
            "bwd_order": spec.get("bwd"),
            "outputs": [],
            "grads": [],
        }
        if "call" in spec:
            node["call"] = spec["call"]
        for field, prefix in (("outputs", "fwd"), ("grads", "bwd")):
            for j, t in enumerate(spec.get(field, [])):
                name = f"{prefix}.{i}.{j}"
                tensors[name] = t.contiguous()
                node[field].append(
                    {
                        "tensor": name,
                        "shape": list(t.shape),
                        "dtype": dtype_name(t.dtype),
                        "stats": tensor_stats(t),
                        "placements": None,
                        "mesh": None,
                    }
                )
        nodes.append(node)
    layout = {"dp": 1, "tp": 1, "pp": 1, "dp_rank": 0, "tp_rank": 0, "pp_rank": pp_rank}
    report = {"format": FORMAT, "model": "tiny", "model_class": model_class, "step": 0}
    report.update({"rank": rank, "world_size": 1, "layout": layout, "nodes": nodes})
    write_json(os.path.join(path, REPORT), report)
    save_file(tensors, os.path.join(path, TENSORS))


def _t(*values) -> torch.Tensor:
    return torch.tensor([list(values)])


# ------------------------------------------------------------------------ rename rules

_RULES = [(r"^first", "layer.0"), (r"^second", "layer.1"), (r"^layer\.", "lin.")]


def test_rename_rules_key_modules_and_parameters_by_re_sub_in_turn(tmp_path):
    """``create_model(model, rename=rules)`` keys every module and parameter by ``re.sub``
    of each rule in turn: the keys in report.json / params.json equal the routes and names
    passed through ``re.sub`` here (``first`` -> ``layer.0`` -> ``lin.0``: the third rule
    applies to the output of the first), and the header says ``"rename": true``."""

    def by_hand(name: str) -> str:
        for pattern, replacement in _RULES:
            name = re.sub(pattern, replacement, name)
        return name

    assert by_hand("first") == "lin.0" and by_hand("second.bias") == "lin.1.bias"
    tiny, _ = _tiny_and_port()
    root = _record(tiny, "tiny", tmp_path, rename=_RULES)
    report = _read(os.path.join(step_dir(str(tmp_path), "tiny", 0, 0), REPORT))
    assert report["rename"] is True
    assert [(n["route"], n["key"]) for n in report["nodes"]] == [
        ("", ""),
        ("first", "lin.0"),
        ("second", "lin.1"),
    ]
    assert all(n["key"] == by_hand(n["route"]) for n in report["nodes"])
    params = _read(os.path.join(step_dir(str(tmp_path), "tiny", 0, 0), PARAMS))
    names = [name for name, _ in tiny.named_parameters()]
    assert [(p["name"], p["key"]) for p in params["params"]] == [(n, by_hand(n)) for n in names]
    assert os.path.isdir(root)


def test_renamed_model_pairs_with_a_model_using_the_natural_names(tmp_path, capsys):
    """``_Tiny`` recorded with rules mapping ``first``/``second`` to ``lin.0``/``lin.1``
    pairs by name with a ``_Port`` (same weights) keyed by its own routes: every module and
    parameter agrees; after adding 0.5 to ``lin.1``'s bias of the port the first forward
    difference is at ``lin.1``, whose A route is ``second``."""
    tiny, port = _tiny_and_port()
    a = _record(tiny, "tiny", tmp_path, rename=_RULES)
    b = _record(port, "port", tmp_path)
    log_dir = tmp_path / "logs"
    assert check_report(a, b, {"log_dir": str(log_dir)}) is True
    assert check_weights(a, b, {"log_dir": str(log_dir)}) is True
    text = _log(log_dir, "report_forward_step_0_rank_0.log")
    assert "\n  lin.0 (call 0)  A: first Linear  |  B: lin.0 Linear   [ok]" in text
    assert "\n  lin.1 (call 0)  A: second Linear  |  B: lin.1 Linear   [ok]" in text

    tiny, port = _tiny_and_port()
    with torch.no_grad():
        port.lin[1].bias.add_(0.5)
    a = _record(tiny, "tiny2", tmp_path, rename=_RULES)
    b = _record(port, "port2", tmp_path)
    capsys.readouterr()
    assert check_report(a, b, {"log_dir": str(log_dir), "diff_phase": "forward"}) is False
    line = _here_line(_log(log_dir, "report_forward_step_0_rank_0.log"))
    assert line.startswith("  lin.1 (call 0)  A: second Linear  |  B: lin.1 Linear   [DIFF")


@pytest.mark.parametrize(
    ("rules", "error", "pattern"),
    [
        ([("first(", "x")], ValueError, r"^rename\[0\]: bad regular expression 'first\('"),
        ([("a", "b"), ("a", "b", "c")], TypeError, r"^rename\[1\] must be a \(regex, "),
        (["first"], TypeError, r"^rename\[0\] must be a \(regex, replacement\) pair"),
    ],
)
def test_bad_rename_rules_are_named_in_the_error(rules, error, pattern):
    """A rule that is no valid regular expression raises ValueError, one that is not a
    pair TypeError; both name the rule's index."""
    with pytest.raises(error, match=pattern):
        create_model(_Tiny(), "tiny", rename=rules)


def test_both_sides_renamed_different_classes_is_cross_model(tmp_path):
    """Two different model classes both keyed by rename rules form a cross-model comparison
    (docs: "a side keyed by rename or loader rules against another model class"): the extra
    ``post`` module of the port is listed as unmatched instead of raising. The same class on
    both sides with the same rules is not cross-model: the extra module is an error."""
    tiny, port = _tiny_and_port(post=True)
    a = _record(tiny, "tiny", tmp_path, rename=[(r"^first", "layer.0"), (r"^second", "layer.1")])
    b = _record(port, "port", tmp_path, rename=[(r"^lin\.", "layer.")])
    log_dir = tmp_path / "logs"
    assert check_report(a, b, {"log_dir": str(log_dir)}) is True
    text = _log(log_dir, "report_forward_step_0_rank_0.log")
    assert "unmatched nodes of side B" in text
    assert "post (Identity, key 'post', call 0)" in text

    _, port1 = _tiny_and_port(post=False)
    _, port2 = _tiny_and_port(post=True)
    a = _record(port1, "p1", tmp_path, rename=[(r"^lin\.", "layer.")])
    b = _record(port2, "p2", tmp_path, rename=[(r"^lin\.", "layer.")])
    with pytest.raises(ValueError, match="the dumps hold different models"):
        check_report(a, b, {"log_dir": str(log_dir)})


# ------------------------------------------------------------------------ recorder


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(self.fc(x))


def test_call_index_counts_the_calls_of_a_module_in_the_step(tmp_path):
    """A module called twice in one forward is recorded as calls 0 and 1 (the c-th call of
    that module in the step); the root once, call 0."""
    torch.manual_seed(0)
    rec = create_model(_Twice(), "twice")
    try:
        rec(torch.ones(1, 2))
        rec.dump_report(str(tmp_path))
    finally:
        rec.close()
    report = _read(os.path.join(step_dir(str(tmp_path), "twice", 0, 0), REPORT))
    assert [(n["route"], n["call"]) for n in report["nodes"]] == [("", 0), ("fc", 0), ("fc", 1)]


def test_dump_headers_hold_the_step_and_model_class(tmp_path):
    """report.json and params.json carry the documented header fields: ``"step"`` is the
    step of the dir they are in (the number of try_dump calls before), ``"model_class"``
    the model's class name."""
    torch.manual_seed(0)
    rec = create_model(_Tiny(), "tiny")
    try:
        for _ in range(2):
            rec(_X).sum().backward()
            rec.try_dump(str(tmp_path))
    finally:
        rec.close()
    for step in (0, 1):
        for file in (REPORT, PARAMS):
            header = _read(os.path.join(step_dir(str(tmp_path), "tiny", step, 0), file))
            assert (header["step"], header["model_class"]) == (step, "_Tiny"), (step, file)


def test_tensor_stats_of_a_small_tensor_by_hand():
    """tensor_stats of [1, 2, 3, -6]: numel 4, mean 0, std sqrt(50/3) (unbiased), min -6,
    max 3, abs_mean 3, norm sqrt(50); no nonfinite item. An empty tensor gives numel 0."""
    stats = tensor_stats(torch.tensor([1.0, 2.0, 3.0, -6.0]))
    expected = {
        "numel": 4,
        "mean": 0.0,
        "std": math.sqrt(50 / 3),
        "min": -6.0,
        "max": 3.0,
        "abs_mean": 3.0,
        "norm": math.sqrt(50),
    }
    assert set(stats) == set(expected)
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    assert tensor_stats(torch.zeros(0)) == {"numel": 0}


# ------------------------------------------------------------------------ compare


def test_float16_tensors_compare_in_float64_without_overflow():
    """Two float16 tensors 60000 and -60000: in float64 they are 120000 apart (beyond
    float16's range), so max_abs is 1.2e+05, max_rel 2, and atol 1e6 accepts them."""
    a = torch.tensor([60000.0], dtype=torch.float16)
    d = compare_tensors(a, -a, resolve_cfg(None, "log"))
    assert (d.max_abs, d.max_rel, d.equal) == (120000.0, 2.0, False)
    assert d.numbers() == "max_abs=1.2e+05 max_rel=2"
    assert compare_tensors(a, -a, resolve_cfg({"atol": 1e6}, "log")).equal is True


def test_calls_without_a_common_key_pair_by_order_and_the_log_says_so(tmp_path, capsys):
    """Roots black-listed (``"self"``), ``_Tiny`` (``first``, ``second``) and ``_Port``
    (``lin.0``, ``lin.1``) share no key and record 2 calls each: they pair by position,
    every log line marked ``[matched by order]`` and the header counting 2 order pairs."""
    tiny, port = _tiny_and_port()
    a = _record(tiny, "tiny", tmp_path, black_root=True)
    b = _record(port, "port", tmp_path, black_root=True)
    log_dir = tmp_path / "logs"
    assert check_report(a, b, {"log_dir": str(log_dir)}) is True
    text = _log(log_dir, "report_forward_step_0_rank_0.log")
    assert "matched pairs: 2 {'order': 2}; unmatched: A 0, B 0" in text
    assert (
        "\nfirst <-> lin.0 (call 0) [matched by order]  A: first Linear  |  B: lin.0 Linear"
        "   [ok]\n" in text
    )
    assert (
        "\nsecond <-> lin.1 (call 0) [matched by order]  A: second Linear  |  B: lin.1 Linear"
        "   [ok]\n" in text
    )


def test_report_names_the_dumps_and_labels_keys_like_the_routes(tmp_path, capsys):
    """Two recordings of the same plain model: the printed summary names both rank dirs
    compared (``A: <dir>`` / ``B: <dir>``), and every tree line of the log,
    ``key (call c)  A: <route> <type>  |  B: <route> <type>``, shows one key equal to both
    routes (a plain model is keyed by its routes; the root is shown the same way)."""
    a = _record(_tiny_and_port()[0], "a", tmp_path)
    b = _record(_tiny_and_port()[0], "b", tmp_path)
    log_dir = tmp_path / "logs"
    capsys.readouterr()
    assert check_report(a, b, {"log_dir": str(log_dir)}) is True
    out = capsys.readouterr().out.splitlines()
    assert f"  A: {step_dir(str(tmp_path), 'a', 0, 0)}" in out
    assert f"  B: {step_dir(str(tmp_path), 'b', 0, 0)}" in out
    label = re.compile(r"^( *)(\S+) \(call (\d+)\)  A: (\S+) (\S+)  \|  B: (\S+) (\S+)   \[ok\]$")
    for phase in ("forward", "backward"):
        text = _log(log_dir, f"report_{phase}_step_0_rank_0.log")
        rows = [label.match(line) for line in text.splitlines() if "(call " in line]
        assert len(rows) == 3 and all(rows), text
        for m in rows:
            assert m.group(2) == m.group(4) == m.group(6), m.group(0)
            assert m.group(5) == m.group(7)


# ------------------------------------------------------------------------ checker


def test_backward_search_follows_the_order_gradients_were_produced(tmp_path, capsys):
    """Two micro-batches in one step (forward + backward each): the backward of call 0 of
    ``fc`` runs before that of call 1. With ``fc``'s weight differing between the sides
    every gradient differs, so the first backward difference is in the first backward run:
    ``fc`` call 0 (under root call 0), not call 1."""

    def run(name: str, scale: float) -> str:
        torch.manual_seed(0)
        model = nn.Sequential()
        model.add_module("fc", nn.Linear(2, 2))
        with torch.no_grad():
            model.fc.weight.mul_(scale)
        rec = create_model(model, name)
        try:
            for x in (torch.ones(1, 2), torch.full((1, 2), 2.0)):
                rec.backward(rec(x.requires_grad_(True)).sum())
            rec.try_dump(str(tmp_path))
        finally:
            rec.close()
        return str(tmp_path / name)

    a, b = run("a", 1.0), run("b", 2.0)
    log_dir = tmp_path / "logs"
    assert check_report(a, b, {"log_dir": str(log_dir), "diff_phase": "backward"}) is False
    line = _here_line(_log(log_dir, "report_backward_step_0_rank_0.log"))
    assert line.startswith("  fc (call 0)  A: fc Linear"), line
    assert line.endswith("(leaf differs)")


def test_nodes_without_a_call_field_nest_under_their_parent(tmp_path):
    """Hand-written reports whose nodes leave out ``"call"`` (it defaults to 0): the child
    ``block.fc`` still hangs under ``block``, so with both differing the search descends to
    ``block.fc`` (leaf differs, indented one level) instead of stopping at ``block``."""
    specs = [
        dict(route="block", type="Block", parent=None, outputs=[_t(1.0, 2.0)]),
        dict(route="block.fc", parent=0, outputs=[_t(3.0, 4.0)]),
    ]
    other = [
        dict(specs[0], outputs=[_t(1.5, 2.0)]),
        dict(specs[1], outputs=[_t(3.5, 4.0)]),
    ]
    _write_report(step_dir(str(tmp_path), "a", 0, 0), specs)
    _write_report(step_dir(str(tmp_path), "b", 0, 0), other)
    log_dir = tmp_path / "logs"
    cfg = {"log_dir": str(log_dir), "diff_phase": "forward"}
    assert check_report(str(tmp_path / "a"), str(tmp_path / "b"), cfg) is False
    line = _here_line(_log(log_dir, "report_forward_step_0_rank_0.log"))
    assert line.startswith("  block.fc (call 0)  A: block.fc Linear")
    assert line.endswith("(leaf differs)")


def test_split_container_children_hang_from_its_surviving_parent(tmp_path):
    """Pipeline dump: ``outer`` runs on stage 0 only, ``outer.mid`` on both stages (split:
    dropped), ``outer.mid.a`` on stage 0 and ``outer.mid.b`` on stage 1. The children of the
    dropped container hang from its parent ``outer``: with ``outer`` and ``outer.mid.a``
    differing from the single-process dump, the search descends from ``outer`` to
    ``outer.mid.a`` (leaf differs, one level down)."""
    full = [
        dict(route="outer", type="Outer", parent=None, outputs=[_t(1.0, 1.0)]),
        dict(route="outer.mid", type="Mid", parent=0, outputs=[_t(2.0, 2.0)]),
        dict(route="outer.mid.a", parent=1, outputs=[_t(3.0, 3.0)]),
        dict(route="outer.mid.b", parent=1, outputs=[_t(4.0, 4.0)]),
    ]
    stage0 = [
        dict(full[0], outputs=[_t(1.5, 1.0)]),
        dict(full[1], outputs=[_t(9.0, 9.0)]),
        dict(full[2], outputs=[_t(3.5, 3.0)]),
    ]
    stage1 = [dict(full[1], parent=None), dict(full[3], parent=0)]
    _write_report(step_dir(str(tmp_path), "pp", 0, 0), stage0, pp_rank=0)
    _write_report(step_dir(str(tmp_path), "pp", 0, 1), stage1, pp_rank=1, rank=1)
    _write_report(step_dir(str(tmp_path), "single", 0, 0), full)
    log_dir = tmp_path / "logs"
    cfg = {"log_dir": str(log_dir), "diff_phase": "forward"}
    assert check_report(str(tmp_path / "pp"), str(tmp_path / "single"), cfg) is False
    text = _log(log_dir, "report_forward_step_0_rank_0.log")
    assert "\n  outer.mid.b (call 0)  A: outer.mid.b Linear" in text
    line = _here_line(text)
    assert line.startswith("  outer.mid.a (call 0)  A: outer.mid.a Linear"), line
    assert line.endswith("(leaf differs)")


def test_merged_unit_is_named_after_the_single_process_rank_on_either_side(tmp_path):
    """A 2-rank pipeline dump (ranks 1 and 2) against a single-process dump (rank 0) is one
    merged unit tagged with the single side's rank: its log is ``..._rank_0.log`` whichever
    side the single-process dump is passed as."""
    fc = dict(route="fc", parent=None, outputs=[_t(1.0, 2.0)])
    head = dict(route="head", parent=None, outputs=[_t(3.0, 4.0)])
    _write_report(step_dir(str(tmp_path), "pp", 0, 1), [fc], pp_rank=0, rank=1)
    _write_report(step_dir(str(tmp_path), "pp", 0, 2), [head], pp_rank=1, rank=2)
    _write_report(step_dir(str(tmp_path), "single", 0, 0), [fc, head])
    pp, single = str(tmp_path / "pp"), str(tmp_path / "single")
    for i, (a, b) in enumerate(((single, pp), (pp, single))):
        log_dir = tmp_path / f"logs{i}"
        assert check_report(a, b, {"log_dir": str(log_dir), "diff_phase": "forward"}) is True
        logs = sorted(os.path.basename(p) for p in glob.glob(str(log_dir / "*.log")))
        assert logs == ["report_forward_step_0_rank_0.log"], (a, b)
