"""GPT-2 on dp / tp / pp layouts equals the single-process run, and each rank holds its share."""

from __future__ import annotations

import json

import pytest
import torch
from gpt_reference import GRAD_TOL, TINY_GPT, reference_run
from launch import torchrun

PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": TINY_GPT["hidden_layers"]}

LAYOUTS_2 = [
    {"name": "dp2", "dist": {"data_parallel_size": 2}},
    {"name": "tp2", "dist": {"tensor_parallel_size": 2}},
    {"name": "pp2-1F1B", "dist": {**PP, "pipeline_schedule": "1F1B"}, "microbatches": 4},
    {"name": "pp2-GPipe", "dist": {**PP, "pipeline_schedule": "GPipe"}, "microbatches": 2},
    {
        "name": "pp2-interleaved",
        "dist": {**PP, "pipeline_schedule": "Interleaved1F1B", "virtual_pipeline_size": 2},
        "microbatches": 4,
    },
    {
        "name": "pp2-custom",
        "dist": {**PP, "custom_pipeline_stage_id": [0, 1, 1, 1]},
        "microbatches": 2,
    },
]
LAYOUTS_4 = [
    {"name": "dp2xtp2", "dist": {"data_parallel_size": 2, "tensor_parallel_size": 2}},
    {"name": "tp2xpp2", "dist": {**PP, "tensor_parallel_size": 2}, "microbatches": 2},
    {"name": "dp2xpp2", "dist": {**PP, "data_parallel_size": 2}, "microbatches": 2},
    {"name": "tp4", "dist": {"tensor_parallel_size": 4}},
    # gradient accumulation: 2 micro-batches of 2 per dp rank equal the batch of 8 at once
    {"name": "dp2xtp2-accumulate2", "dist": {"tensor_parallel_size": 2}, "microbatches": 2},
]
LAYOUTS_8 = [
    {"name": "dp2xtp2xpp2", "dist": {**PP, "tensor_parallel_size": 2}, "microbatches": 2},
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt") / "reference.pt"
    ref = reference_run()
    torch.save(ref, path)
    return ref, str(path)


def run_layouts(reference, nproc, layouts):
    ref, path = reference
    results = torchrun("gpt_layouts.py", nproc, path, json.dumps(layouts))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
    by_layout = {}
    for result in results:
        for item in result["layouts"]:
            by_layout.setdefault(item["name"], []).append(item)
    return ref, by_layout


def check_numbers(items):
    """fp32 rounding tolerances throughout: the optimizer is SGD with momentum, linear in the
    gradients, so parameters after it do not amplify last-bit differences (gpt_reference)."""
    for item in items:
        assert item["init_diff"] == 0.0
        assert item["loss_diff"] <= GRAD_TOL, item
        assert item["grad_diff"] <= GRAD_TOL, (item["grad_worst"], item["grad_diff"])
        assert item["final_diff"] <= GRAD_TOL, (item["final_worst"], item["final_diff"])
        # clipping uses the global norm of the whole model, not of this rank's shard
        assert item["grad_norm_diff"] <= GRAD_TOL, item["grad_norm_diff"]
        # every rank reports the same loss
        assert item["losses"] == items[0]["losses"]


def check_pipeline_share(items, num_layers, pp):
    """Pipeline rank r holds exactly the layers whose stage id maps to r, and nothing else."""
    stage_ids = items[0]["stage_ids"]
    assert len(stage_ids) == num_layers
    held = {}
    for item in items:
        r = item["pipeline_rank"]
        expected = [i for i, s in enumerate(stage_ids) if s % pp == r]
        assert item["layers"] == expected, (r, item["layers"], expected)
        assert item["has_embedding"] == (r == 0)
        assert item["has_head"] == (r == pp - 1)
        held.setdefault(r, item["layers"])
    all_layers = sorted(i for layers in held.values() for i in layers)
    assert all_layers == list(range(num_layers))  # disjoint and complete


def total_numel(ref):
    return sum(t.numel() for t in ref["init"].values())


def test_layouts_on_2_ranks(reference):
    ref, by_layout = run_layouts(reference, 2, LAYOUTS_2)
    assert set(by_layout) == {layout["name"] for layout in LAYOUTS_2}
    for items in by_layout.values():
        check_numbers(items)
    L, V, H = TINY_GPT["hidden_layers"], TINY_GPT["vocab_size"], TINY_GPT["hidden_size"]
    # data parallel: full replicas
    assert all(i["local_numel"] == total_numel(ref) for i in by_layout["dp2"])
    # tensor parallel: strictly less than a full replica on each rank
    assert all(i["local_numel"] < 0.6 * total_numel(ref) for i in by_layout["tp2"])
    for name in ("pp2-1F1B", "pp2-GPipe", "pp2-interleaved", "pp2-custom"):
        check_pipeline_share(by_layout[name], L, 2)
        # the two stages together hold the model once, plus the last stage's tied head copy
        assert sum(i["local_numel"] for i in by_layout[name]) == total_numel(ref) + V * H
    assert by_layout["pp2-custom"][0]["stage_ids"] == [0, 1, 1, 1]
    assert by_layout["pp2-interleaved"][0]["stage_ids"] == [0, 1, 2, 3]
    # the three schedules agree with each other (and with the reference, above)
    schedule_losses = [
        by_layout[n][0]["losses"] for n in ("pp2-1F1B", "pp2-GPipe", "pp2-interleaved")
    ]
    for losses in schedule_losses:
        assert losses == pytest.approx(ref["losses"], abs=GRAD_TOL)


def test_layouts_on_4_ranks(reference):
    ref, by_layout = run_layouts(reference, 4, LAYOUTS_4)
    for items in by_layout.values():
        check_numbers(items)
    L = TINY_GPT["hidden_layers"]
    check_pipeline_share(by_layout["tp2xpp2"], L, 2)
    check_pipeline_share(by_layout["dp2xpp2"], L, 2)
    assert all(i["local_numel"] < 0.35 * total_numel(ref) for i in by_layout["tp4"])


def test_layout_2x2x2_on_8_ranks(reference):
    ref, by_layout = run_layouts(reference, 8, LAYOUTS_8)
    items = by_layout["dp2xtp2xpp2"]
    assert len(items) == 8
    check_numbers(items)
    check_pipeline_share(items, TINY_GPT["hidden_layers"], 2)


def test_two_models_on_two_meshes_train_side_by_side(reference):
    """A tp2 x dp2 GPT and a dp4 GPT built on two meshes of the same four processes; each
    runs its steps while the *other* model's mesh is current (dist_scripts/two_meshes.py).
    Both equal one process (loss, every gradient, global norm, final parameters) and each
    rank holds its own mesh's share: a layer, loss or runner that read the current mesh at
    run time would use the other model's tp / dp groups and diverge."""
    _, path = reference
    results = torchrun("two_meshes.py", 4, path)
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
        for name, tp, dp in (("tp2xdp2", 2, 2), ("dp4", 1, 4)):
            run = result[name]
            assert (run["tensor_parallel_size"], run["data_parallel_size"]) == (tp, dp)
            assert run["mesh_of_is_own"], name
            assert run["init_diff"] == 0.0, name
            assert run["loss_diff"] <= GRAD_TOL, (name, run["loss_diff"])
            assert run["grad_diff"][0] <= GRAD_TOL, (name, run["grad_diff"])
            assert run["norm_diff"] <= GRAD_TOL, (name, run["norm_diff"])
            assert run["final_diff"][0] <= GRAD_TOL, (name, run["final_diff"])
        a, b = result["tp2xdp2"], result["dp4"]
        # tp2: every tp-sharded parameter is held by half, the rest whole; dp4: all whole
        halves = {n for n, f in a["fractions"].items() if f == 0.5}
        assert a["tp_sharded"] and set(a["tp_sharded"]) == halves
        assert set(a["fractions"].values()) == {0.5, 1.0}
        assert b["tp_sharded"] == [] and set(b["fractions"].values()) == {1.0}
