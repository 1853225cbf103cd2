"""libai.align across layouts: a tp2 and a pp2 run of the tiny GPT, recorded under torchrun,
compare equal to the single-process run; a perturbed tp shard is found at its module."""

from __future__ import annotations

import os
import re

import pytest
from align_reference import build_model, make_batch
from launch import torchrun

from libai import dist
from libai.align import check_grads, check_params, check_report, check_weights, create_model
from libai.align.dump_format import read_json, step_dir
from libai.align.tree_log import HERE
from libai.runtime.parallel import ModelRunner

CFG = {"atol": 1e-6, "rtol": 1e-5}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A dump root holding the single-process run as ``single/gpt``."""
    path = tmp_path_factory.mktemp("align_layouts")
    dist.setup_dist_util({})
    model = build_model()
    recorder = create_model(model, "gpt")
    ModelRunner(model).forward_backward(make_batch())
    recorder.dump_report(str(path / "single"))
    recorder.dump_params(str(path / "single"))
    recorder.close()
    return path


def run_layout(root, layout: str, *extra: str) -> tuple[str, list[dict]]:
    results = torchrun("align_layouts.py", 2, "--dump", str(root), "--layout", layout, *extra)
    assert all(r["ok"] for r in results), results
    return str(root / layout / "gpt"), results


def nodes(root, layout: str, rank: int) -> dict[str, dict]:
    report = read_json(os.path.join(step_dir(str(root), layout + "/gpt", 0, rank), "report.json"))
    return {n["route"]: n for n in report["nodes"]}


def test_tp2_equals_single_process_and_holds_shards(root):
    tp2, results = run_layout(root, "tp2")
    single = str(root / "single" / "gpt")
    cfg = {**CFG, "log_dir": str(root / "log_tp2")}
    assert check_report(single, tp2, cfg) is True
    assert check_params(single, tp2, cfg) is True
    # layout: each rank computed with half of a column-parallel weight ...
    for r in results:
        assert r["local_shapes"]["GPT_model.transformer.layers.0.mlp.dense_h_to_4h.weight"] == [
            32,
            32,
        ]
    # ... recorded its output as a tp shard, and the dump holds the gathered whole
    for rank in (0, 1):
        fc = nodes(root, "tp2", rank)["GPT_model.transformer.layers.0.mlp.dense_h_to_4h"]
        (out,) = fc["outputs"]
        assert out["placements"] == ["S(-1)"] and out["mesh"]["shape"] == [2]
        assert out["shape"] == [4, 12, 64]
        head = nodes(root, "tp2", rank)["GPT_model.lm_head"]
        assert head["outputs"][0]["shape"] == [4, 12, 99]  # vocab padding (100) cut
    params = read_json(os.path.join(step_dir(str(root), "tp2/gpt", 0, 0), "params.json"))
    placements = {p["name"]: p["placements"] for p in params["params"]}
    assert "S(0)" in str(placements["GPT_model.transformer.layers.0.mlp.dense_h_to_4h.weight"])


def test_pp2_equals_single_process_and_each_rank_holds_its_stage(root):
    pp2, _ = run_layout(root, "pp2")
    single = str(root / "single" / "gpt")
    cfg = {**CFG, "log_dir": str(root / "log_pp2")}
    assert check_report(single, pp2, cfg) is True
    assert check_grads(single, pp2, cfg) is True
    assert check_weights(single, pp2, cfg) is True
    layers = [
        {
            int(m.group(1))
            for r in nodes(root, "pp2", rank)
            if (m := re.search(r"layers\.(\d+)$", r))
        }
        for rank in (0, 1)
    ]
    assert layers == [{0, 1}, {2, 3}]
    assert "GPT_model.lm_head" in nodes(root, "pp2", 1)
    assert "GPT_model.lm_head" not in nodes(root, "pp2", 0)


def test_a_perturbed_tp_shard_is_found_at_its_module(root, capsys):
    tp2, _ = run_layout(root, "tp2", "--perturb")
    single = str(root / "single" / "gpt")
    log_dir = str(root / "log_perturbed")
    assert check_report(single, tp2, {**CFG, "log_dir": log_dir, "diff_phase": "forward"}) is False
    with open(os.path.join(log_dir, "report_forward_step_0_rank_0.log"), encoding="utf-8") as f:
        (here,) = [line for line in f if HERE in line]
    assert "transformer.h.1.mlp.c_proj (call 0)" in here
    assert check_weights(single, tp2, {**CFG, "log_dir": log_dir}) is False
    assert "first key 'transformer.h.1.mlp.c_proj.weight'" in capsys.readouterr().out
