"""Offline checkers of libai.align on small synthetic dumps written in the documented format."""

from __future__ import annotations

import copy
import glob
import os

import pytest
import torch
from align_dumps import write_params
from safetensors.torch import save_file

from libai.align.checker import check_grads, check_params, check_report, check_weights
from libai.align.compare import compare_tensors, resolve_cfg
from libai.align.dump_format import (
    FORMAT,
    REPORT,
    TENSORS,
    dtype_name,
    step_dir,
    tensor_stats,
    write_json,
)
from libai.align.tree_log import HERE

# ---------------------------------------------------------------------------- fixtures


def _tensor_meta(name: str, t: torch.Tensor) -> dict:
    return {
        "tensor": name,
        "shape": list(t.shape),
        "dtype": dtype_name(t.dtype),
        "stats": tensor_stats(t),
        "placements": None,
        "mesh": None,
    }


def write_report(path, specs, *, rename=False, pp_rank=0, step=0, rank=0):
    """Write report.json + tensors.safetensors for ``specs`` (node dicts with tensors)."""
    os.makedirs(path, exist_ok=True)
    tensors, nodes = {}, []
    for i, spec in enumerate(specs):
        node = {
            "id": i,
            "route": spec["route"],
            "key": spec.get("key", spec["route"]),
            "call": spec.get("call", 0),
            "type": spec.get("type", "Linear"),
            "parent": spec.get("parent"),
            "mapped": spec.get("mapped", False),
            "bwd_order": spec.get("bwd"),
            "outputs": [],
            "grads": [],
        }
        for field, prefix in (("outputs", "fwd"), ("grads", "bwd")):
            for j, t in enumerate(spec.get(field, [])):
                name = f"{prefix}.{i}.{j}"
                tensors[name] = t.contiguous()
                node[field].append(_tensor_meta(name, t))
        nodes.append(node)
    report = {
        "format": FORMAT,
        "model": "tiny",
        "model_class": "Tiny",
        "step": step,
        "rank": rank,
        "world_size": 1,
        "layout": {"dp": 1, "tp": 1, "pp": 1, "dp_rank": 0, "tp_rank": 0, "pp_rank": pp_rank},
        "nodes": nodes,
    }
    if rename:  # a cross-model comparison: keys from rename rules, another model class
        report["rename"] = True
        report["model_class"] = rename if isinstance(rename, str) else "Tiny"
    write_json(os.path.join(path, REPORT), report)
    save_file(tensors, os.path.join(path, TENSORS))


def tiny_nodes():
    """root -> block -> (fc1, fc2); root -> head. Backward: head, fc2, fc1, block, root."""
    gen = torch.Generator().manual_seed(0)

    def t(*shape):
        return torch.rand(*shape, generator=gen) * 2 - 1

    return [
        dict(route="", type="Tiny", parent=None, outputs=[t(2, 3)], grads=[t(2, 4)], bwd=4),
        dict(route="block", type="Block", parent=0, outputs=[t(2, 4)], grads=[t(2, 4)], bwd=3),
        dict(route="block.fc1", parent=1, outputs=[t(2, 4)], grads=[t(2, 4)], bwd=2),
        dict(route="block.fc2", parent=1, outputs=[t(2, 4)], grads=[t(2, 4)], bwd=1),
        dict(route="head", parent=0, outputs=[t(2, 3)], grads=[t(2, 4)], bwd=0),
    ]


def bump(specs, route, field="outputs", delta=1e-3):
    for spec in specs:
        if spec["route"] == route:
            spec[field] = [t + delta for t in spec[field]]
    return specs


def model(tmp_path, name, *steps, **kw):
    """Write a model dir; each step is a list of ranks, each rank a list of node specs."""
    for s, ranks in enumerate(steps):
        for r, specs in enumerate(ranks):
            write_report(step_dir(str(tmp_path), name, s, r), specs, step=s, rank=r, **kw)
    return str(tmp_path / name)


def pair_dirs(tmp_path, specs_a, specs_b, rename=False, **kw):
    """Dumps "a" and "b"; with ``rename`` side B is another model class keyed by rules."""
    return (
        model(tmp_path, "a", [specs_a], rename=rename, **kw),
        model(tmp_path, "b", [specs_b], rename=rename and "TinyPort", **kw),
    )


def log_text(tmp_path, pattern):
    (path,) = glob.glob(str(tmp_path / "align_log" / pattern))
    with open(path, encoding="utf-8") as f:
        return f.read()


def here_line(text):
    (line,) = [line for line in text.splitlines() if HERE in line]
    return line


# ------------------------------------------------------------------------------ reports


def test_identical_dumps_pass_and_write_logs(tmp_path, capsys):
    a, b = pair_dirs(tmp_path, tiny_nodes(), tiny_nodes())
    assert check_report(a, b) is True
    fwd = log_text(tmp_path, "report_forward_step_0_rank_0.log")
    assert HERE not in fwd and "block.fc1 (call 0)  A: block.fc1 Linear" in fwd
    assert os.path.isfile(tmp_path / "align_log" / "report_backward_step_0_rank_0.log")
    assert "report step 0 rank 0: ok (compare_mode=strict" in capsys.readouterr().out


def test_leaf_difference_found_under_parent(tmp_path, capsys):
    specs_b = tiny_nodes()
    for route in ("", "block", "block.fc1", "block.fc2", "head"):
        bump(specs_b, route)  # fc1 is wrong; the error propagates to everything after it
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b, {"diff_phase": "forward"}) is False
    line = here_line(log_text(tmp_path, "report_forward_step_0_rank_0.log"))
    assert line.strip().startswith("block.fc1 (call 0)") and "DIFF" in line
    assert "leaf differs" in line
    out = capsys.readouterr().out
    assert "DIFF at key 'block.fc1'" in out and "max_abs=0.001" in out
    assert "A: block.fc1 (Linear)" in out and "float32" in out
    assert "report_forward_step_0_rank_0.log" in out


def test_parent_differs_children_equal(tmp_path):
    specs_b = tiny_nodes()
    for route in ("", "block", "head"):  # e.g. a wrong residual add inside block
        bump(specs_b, route)
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b, {"diff_phase": "forward"}) is False
    line = here_line(log_text(tmp_path, "report_forward_step_0_rank_0.log"))
    assert line.strip().startswith("block (call 0)")
    assert "children equal but this module differs" in line


def test_backward_descent_follows_backward_order(tmp_path, capsys):
    specs_b = tiny_nodes()
    for route in ("block.fc2", "block.fc1", "block", ""):  # fc2's backward is wrong
        bump(specs_b, route, field="grads")
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b) is False
    line = here_line(log_text(tmp_path, "report_backward_step_0_rank_0.log"))
    assert line.strip().startswith("block.fc2 (call 0)")  # not fc1, the first in call order
    assert HERE not in log_text(tmp_path, "report_forward_step_0_rank_0.log")
    out = capsys.readouterr().out
    assert "forward: ok" in out and "backward: DIFF at key 'block.fc2'" in out
    assert check_report(a, b, {"diff_phase": "forward"}) is True


def test_nodes_without_grads_are_transparent_in_backward(tmp_path):
    specs_a, specs_b = tiny_nodes(), tiny_nodes()
    for specs in (specs_a, specs_b):
        specs[1]["grads"], specs[1]["bwd"] = [], None  # block records no input grads
    bump(specs_b, "block.fc1", field="grads")
    a, b = pair_dirs(tmp_path, specs_a, specs_b)
    assert check_report(a, b, {"diff_phase": "backward"}) is False
    text = log_text(tmp_path, "report_backward_step_0_rank_0.log")
    assert here_line(text).strip().startswith("block.fc1 (call 0)")
    assert "no grads on both sides" in text


def test_difference_under_agreeing_ancestors(tmp_path):
    a, b = pair_dirs(tmp_path, tiny_nodes(), bump(tiny_nodes(), "block.fc2"))
    assert check_report(a, b, {"diff_phase": "forward"}) is False
    line = here_line(log_text(tmp_path, "report_forward_step_0_rank_0.log"))
    assert line.strip().startswith("block.fc2") and "enclosing modules agree" in line


def test_every_step_is_checked(tmp_path):
    a = model(tmp_path, "a", [tiny_nodes()], [tiny_nodes()])
    b = model(tmp_path, "b", [tiny_nodes()], [bump(tiny_nodes(), "head")])
    assert check_report(a, b) is False
    assert HERE in log_text(tmp_path, "report_forward_step_1_rank_0.log")
    assert HERE not in log_text(tmp_path, "report_forward_step_0_rank_0.log")


def test_tolerances_do_not_leak_and_cfg_is_not_mutated(tmp_path):
    a, b = pair_dirs(tmp_path, tiny_nodes(), bump(tiny_nodes(), "head"))
    cfg = {"atol": 1.0, "compare_mode": "strict"}
    assert check_report(a, b, cfg) is True
    assert cfg == {"atol": 1.0, "compare_mode": "strict"}
    assert check_report(a, b) is False


def test_default_is_strict_elementwise_not_mean(tmp_path):
    specs_b = tiny_nodes()
    out = specs_b[4]["outputs"][0].clone()
    out[0, 0] += 1e-3
    out[1, 1] -= 1e-3  # same mean
    specs_b[4]["outputs"] = [out]
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b) is False
    assert check_report(a, b, {"compare_mode": "mean"}) is True


def test_cosine_mode(tmp_path):
    specs_b = tiny_nodes()
    specs_b[4]["outputs"] = [specs_b[4]["outputs"][0] * 1.01]
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b) is False
    assert check_report(a, b, {"compare_mode": "cosine"}) is True
    specs_b[4]["outputs"] = [-specs_b[4]["outputs"][0]]
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b, {"compare_mode": "cosine", "atol": 0.5}) is False


def test_bf16_vs_fp32(tmp_path, capsys):
    specs_b = tiny_nodes()
    for spec in specs_b:
        spec["outputs"] = [t.to(torch.bfloat16) for t in spec["outputs"]]
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b) is False
    assert "bfloat16" in capsys.readouterr().out
    assert check_report(a, b, {"atol": 1e-2}) is True


def test_pipeline_ranks_merge_against_single_process(tmp_path):
    full = tiny_nodes()
    # pipeline stages call their modules directly: the root is not called on either rank
    stage0 = copy.deepcopy(full[1:4])
    for spec in stage0:
        spec["parent"] = None if spec["route"] == "block" else 0
    stage1 = [dict(full[4], parent=None)]
    single = model(tmp_path, "single", [full])
    os.makedirs(tmp_path / "pp")
    write_report(step_dir(str(tmp_path), "pp", 0, 0), stage0, pp_rank=0)
    write_report(step_dir(str(tmp_path), "pp", 0, 1), stage1, pp_rank=1, rank=1)
    pp = str(tmp_path / "pp")
    assert check_report(single, pp) is True
    assert check_report(pp, single) is True
    write_report(step_dir(str(tmp_path), "pp", 0, 1), bump(stage1, "head"), pp_rank=1, rank=1)
    assert check_report(single, pp) is False
    line = here_line(log_text(tmp_path, "report_forward_step_0_rank_0.log"))
    assert line.strip().startswith("head (call 0)")


def test_container_split_over_pipeline_stages_is_transparent(tmp_path):
    # the root runs on both stages (a different part on each): no stage has its output
    full = tiny_nodes()
    stage0 = [dict(full[0], outputs=[torch.zeros(2, 4)]), *full[1:4]]
    stage1 = [full[0], dict(full[4], parent=0)]
    write_report(step_dir(str(tmp_path), "pp", 0, 0), stage0, pp_rank=0)
    write_report(step_dir(str(tmp_path), "pp", 0, 1), stage1, pp_rank=1, rank=1)
    single = model(tmp_path, "single", [full])
    assert check_report(str(tmp_path / "pp"), single) is True
    text = log_text(tmp_path, "report_forward_step_0_rank_0.log")
    assert "\nhead (call 0)  A: head Linear" in text  # a top pair now
    assert "<root> (Tiny, key '', call 0)  [transparent" in text


def test_tensor_parallel_duplicates_merge(tmp_path):
    single = model(tmp_path, "single", [tiny_nodes()])
    tp = model(tmp_path, "tp", [tiny_nodes(), tiny_nodes()])
    assert check_report(tp, single) is True


def test_unequal_rank_counts_raise(tmp_path):
    a = model(tmp_path, "a", [tiny_nodes(), tiny_nodes()])
    b = model(tmp_path, "b", [tiny_nodes(), tiny_nodes(), tiny_nodes()])
    with pytest.raises(ValueError, match="2 rank.*3.*equal rank counts or against a single"):
        check_report(a, b)


def test_step_count_mismatch_raises(tmp_path):
    a = model(tmp_path, "a", [tiny_nodes()], [tiny_nodes()])
    b = model(tmp_path, "b", [tiny_nodes()])
    with pytest.raises(ValueError, match="step counts differ: 2 .* 1"):
        check_report(a, b)


def test_missing_node_raises_naming_it(tmp_path):
    a, b = pair_dirs(tmp_path, tiny_nodes(), tiny_nodes()[:4])
    with pytest.raises(ValueError, match="different models.*head.*side A.*side B") as err:
        check_report(a, b)
    assert os.path.join("b", "step_0", "rank_0") in str(err.value)


def test_transparent_container_is_tolerated(tmp_path):
    specs_b = copy.deepcopy(tiny_nodes()[1:])  # no root call on side B
    specs_b[0]["parent"], specs_b[3]["parent"] = None, None
    specs_b[1]["parent"] = specs_b[2]["parent"] = 0
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b) is True
    text = log_text(tmp_path, "report_forward_step_0_rank_0.log")
    assert "<root> (Tiny" in text and "transparent" in text


def test_rename_tolerates_unmatched_nodes(tmp_path):
    specs_b = tiny_nodes() + [dict(route="extra", parent=0, outputs=[torch.ones(2)])]
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    with pytest.raises(ValueError, match="extra"):
        check_report(a, b)
    a, b = (
        model(tmp_path, "a", [tiny_nodes()], rename=True),
        model(tmp_path, "b", [specs_b], rename=True),
    )
    with pytest.raises(ValueError, match="extra"):  # renamed, but the same model class
        check_report(a, b)
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b, rename=True)
    assert check_report(a, b) is True
    assert "extra (Linear" in log_text(tmp_path, "report_forward_step_0_rank_0.log")


def test_mapped_nodes_pair_by_call_order(tmp_path):
    def specs(names):
        gen = torch.Generator().manual_seed(1)
        out = [dict(route="", type="M", parent=None, outputs=[torch.rand(2, generator=gen)])]
        for name in names:
            out.append(
                dict(route=name, parent=0, mapped=True, outputs=[torch.rand(2, generator=gen)])
            )
        return out

    a, b = pair_dirs(tmp_path, specs(["h.0", "h.1"]), specs(["layers.0", "layers.1"]))
    assert check_report(a, b) is True
    b_specs = bump(specs(["layers.0", "layers.1"]), "layers.1")
    a, b = pair_dirs(tmp_path, specs(["h.0", "h.1"]), b_specs)
    assert check_report(a, b, {"diff_phase": "forward"}) is False
    line = here_line(log_text(tmp_path, "report_forward_step_0_rank_0.log"))
    assert "h.1 <-> layers.1" in line and "B: layers.1" in line


def test_no_common_names_pair_by_order_or_raise(tmp_path):
    specs_b = tiny_nodes()
    for spec in specs_b:
        spec["route"] = "model." + spec["route"]
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b)
    assert check_report(a, b) is True
    a, b = pair_dirs(tmp_path, tiny_nodes(), specs_b[:4])
    with pytest.raises(ValueError, match="different models.*'model.block'"):
        check_report(a, b)


def test_shorter_output_list_compares_common_prefix(tmp_path):
    specs_a = tiny_nodes()
    specs_a[4]["outputs"] = specs_a[4]["outputs"] + [torch.zeros(3)]
    a, b = pair_dirs(tmp_path, specs_a, tiny_nodes())
    assert check_report(a, b) is True
    assert "output counts differ (A 2, B 1)" in log_text(tmp_path, "report_forward_*.log")


def test_step_and_rank_dirs_and_path_errors(tmp_path):
    a, b = pair_dirs(tmp_path, tiny_nodes(), tiny_nodes())
    assert check_report(os.path.join(a, "step_0"), os.path.join(b, "step_0")) is True
    rank_a, rank_b = step_dir(str(tmp_path), "a", 0, 0), step_dir(str(tmp_path), "b", 0, 0)
    assert check_report(rank_a, rank_b, {"log_dir": str(tmp_path / "logs")}) is True
    assert os.path.isfile(tmp_path / "logs" / "report_forward_step_0_rank_0.log")
    with pytest.raises(ValueError, match="cannot compare a model dir"):
        check_report(a, rank_b)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        check_report(a, str(tmp_path / "nowhere"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="holds no alignment dump"):
        check_report(a, str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="'atoll'.*valid keys"):
        check_report(a, b, {"atoll": 1e-3})
    with pytest.raises(ValueError, match="compare_mode"):
        check_report(a, b, {"compare_mode": "loose"})


# ---------------------------------------------------------------------- tensor comparison


def test_compare_tensors_nan_int_and_shape():
    cfg = resolve_cfg(None, "unused")
    nan = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare_tensors(nan, nan.clone(), cfg).equal
    diff = compare_tensors(nan, torch.tensor([1.0, 2.0, float("inf")]), cfg)
    assert not diff.equal and "NaN at different positions" in diff.note
    assert not compare_tensors(torch.tensor([3, 4]), torch.tensor([3, 5]), cfg).equal
    assert compare_tensors(torch.tensor([3, 4]), torch.tensor([3, 4]), cfg).equal
    diff = compare_tensors(torch.zeros(2, 3), torch.zeros(3, 2), cfg)
    assert not diff.equal and "[2, 3]" in diff.numbers() and "[3, 2]" in diff.numbers()
    cos = resolve_cfg({"compare_mode": "cosine"}, "unused")
    assert compare_tensors(torch.zeros(4), torch.zeros(4), cos).equal
    assert compare_tensors(torch.zeros(4), torch.ones(4), cos).cosine == 0.0


# ------------------------------------------------------------------------------- params


def tiny_params(delta=0.0, grads=True):
    gen = torch.Generator().manual_seed(2)
    out = {}
    for key in ("wte.weight", "h.0.fc.weight", "h.0.fc.bias", "head.weight"):
        w = torch.rand(3, 2, generator=gen)
        g = torch.rand(3, 2, generator=gen)
        out[key] = (f"model.{key}", w, g + delta if key.startswith("h.0") else g)
    return out


def params_pair(tmp_path, pa, pb, rename=False, **kw):
    write_params(step_dir(str(tmp_path), "a", 0, 0), pa, rename=rename, **kw)
    write_params(step_dir(str(tmp_path), "b", 0, 0), pb, rename=rename and "TinyPort", **kw)
    return str(tmp_path / "a"), str(tmp_path / "b")


def test_params_identical_and_planted_grad_difference(tmp_path, capsys):
    a, b = params_pair(tmp_path, tiny_params(), tiny_params())
    assert check_params(a, b) is True
    assert check_weights(a, b) is True and check_grads(a, b) is True
    a, b = params_pair(tmp_path, tiny_params(), tiny_params(delta=1e-3))
    assert check_weights(a, b) is True
    assert check_grads(a, b) is False
    assert check_params(a, b) is False
    text = log_text(tmp_path, "params_step_0_rank_0.log")
    assert here_line(text).startswith("h.0.fc.weight  A: model.h.0.fc.weight")
    assert "h.0.fc.bias" in text and text.count("DIFF") == 2
    out = capsys.readouterr().out
    assert "grads: DIFF in 2 of 4 parameters; first key 'h.0.fc.weight'" in out


def test_params_missing_key_and_rename(tmp_path):
    pb = tiny_params()
    del pb["head.weight"]
    a, b = params_pair(tmp_path, tiny_params(), pb)
    with pytest.raises(ValueError, match="'head.weight'.*side A.*side B.*lacks it"):
        check_weights(a, b)
    a, b = params_pair(tmp_path, tiny_params(), pb, rename=True)
    assert check_weights(a, b) is True
    assert "side A only: 'head.weight'" in log_text(tmp_path, "weights_step_0_rank_0.log")


def test_check_grads_without_grads_file(tmp_path):
    a, b = params_pair(tmp_path, tiny_params(), tiny_params(), grads=False)
    assert check_weights(a, b) is True
    with pytest.raises(FileNotFoundError, match="grads.safetensors.*dump_grads"):
        check_grads(a, b)
