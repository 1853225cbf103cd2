"""``train.zero_optimization``: ZeRO stages 1-3 keep the numbers and shard the state."""

from __future__ import annotations

import json
import types

import pytest
import torch
from gpt_reference import MAX_GRAD_NORM, STEPS, build_model, full_state, make_batch
from launch import torchrun

from libai.engine.parallel import ModelRunner
from libai.engine.zero import partition_parameters, resolve_zero_stage
from libai.utils import distributed as dist

ADAMW = dict(lr=0.01, weight_decay=0.1, eps=1e-6)  # as in dist_scripts/zero_layouts.py


def adamw_reference() -> dict:
    """Single-process AdamW run with global-norm clipping."""
    dist.setup_dist_util({})
    model = build_model()
    runner = ModelRunner(model)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    norms = []
    for step in range(STEPS):
        runner.forward_backward(make_batch(step))
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    state = sum(
        v.numel() * v.element_size()
        for entry in optimizer.state.values()
        for v in entry.values()
        if torch.is_tensor(v)
    )
    return {"final": full_state(model), "grad_norms": norms, "state_bytes": state}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("zero") / "reference.pt"
    ref = adamw_reference()
    torch.save(ref, path)
    return ref, str(path)


def run_zero(reference, nproc, layouts):
    ref, path = reference
    results = torchrun("zero_layouts.py", nproc, path, json.dumps(layouts))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
    return ref, results


def check_results(ref, results):
    for li, layout in enumerate(results[0]["layouts"]):
        items = [r["layouts"][li] for r in results]
        for stage in items[0]["stages"]:
            per_rank = [item["stages"][stage] for item in items]
            for item, s in zip(items, per_rank):
                # same parameters as without ZeRO (same layout) and as one process
                assert s["final_diff"] <= 1e-6, (layout["name"], stage, s)
                assert s["ref_diff"] <= 1e-5, (layout["name"], stage, s)
                assert item["base_ref_diff"] <= 1e-5
                # clipping still uses the global norm of the whole model
                assert s["norm_diff"] <= 1e-5, (layout["name"], stage, s["norm_diff"])
                assert s["resume_diff"] == 0.0
                # each rank holds its share of the optimizer state
                assert s["state_bytes"] < 0.75 * item["base_state_bytes"], (stage, s, item)
                if stage == "3":  # and of the parameters
                    assert s["param_numel"] < 0.75 * item["base_param_numel"], (s, item)
            # the dp ranks of one (pp, tp) position split the state: their sum is the total
            # (stage 3: plus every rank's own scalar AdamW "step" per parameter shard)
            groups = {}
            for item in items:
                groups.setdefault(tuple(item["position"]), []).append(item)
            for position, group in groups.items():
                dp = len(group)
                total = sum(i["stages"][stage]["state_bytes"] for i in group)
                extra = (
                    0 if stage != "3" else (dp - 1) * group[0]["stages"][stage]["num_params"] * 4
                )
                assert total == group[0]["base_state_bytes"] + extra, (stage, position, total)
                if stage == "2":  # after the sync a rank holds only the gradients it owns,
                    for i in group:  # and the dp ranks own disjoint sets covering the stage
                        s = i["stages"][stage]
                        assert s["with_grad"] == s["owned"], (s["with_grad"], s["owned"])
                    owned = [n for i in group for n in i["stages"][stage]["owned"]]
                    assert len(owned) == len(set(owned)) == group[0]["stages"][stage]["num_params"]
        if len(groups) == 1:  # the whole model's state, as one process holds it
            assert items[0]["base_state_bytes"] == ref["state_bytes"]


def state_bytes_table(results) -> dict:
    layout = results[0]["layouts"][0]
    return {
        "without_zero": layout["base_state_bytes"],
        **{
            f"stage{s}": [r["layouts"][0]["stages"][s]["state_bytes"] for r in results]
            for s in layout["stages"]
        },
    }


def test_zero_dp2_stages_1_2_3(reference):
    ref, results = run_zero(
        reference, 2, [{"name": "dp2", "dist": {"data_parallel_size": 2}, "stage3": True}]
    )
    print("dp2 optimizer-state bytes per rank:", state_bytes_table(results))
    check_results(ref, results)


@pytest.mark.parametrize(
    "layout",
    [
        {"name": "dp2xtp2", "dist": {"data_parallel_size": 2, "tensor_parallel_size": 2}},
        {
            "name": "dp2xpp2",
            "dist": {
                "data_parallel_size": 2,
                "pipeline_parallel_size": 2,
                "pipeline_num_layers": 4,
            },
            "microbatches": 2,
        },
    ],
    ids=lambda layout: layout["name"],
)
def test_zero_4_ranks_stages_1_2(reference, layout):
    ref, results = run_zero(reference, 4, [layout])
    print(f"{layout['name']} optimizer-state bytes per rank:", state_bytes_table(results))
    check_results(ref, results)


def test_partition_is_balanced_and_deterministic():
    owners = partition_parameters([100, 10, 60, 50, 5, 5], 2)
    assert owners == partition_parameters([100, 10, 60, 50, 5, 5], 2)
    loads = [sum(n for n, o in zip([100, 10, 60, 50, 5, 5], owners) if o == r) for r in (0, 1)]
    assert loads == [115, 115]


def _layout(dp=2, tp=1, pp=1):
    return types.SimpleNamespace(
        data_parallel_size=dp, tensor_parallel_size=tp, pipeline_parallel_size=pp
    )


def test_unsupported_stage_and_layout_raise():
    assert resolve_zero_stage({"enabled": False, "stage": 3}, _layout()) is None
    assert resolve_zero_stage({"enabled": True, "stage": 1}, _layout()) == 1
    assert resolve_zero_stage({"enabled": True, "stage": 2}, _layout(tp=2, pp=2)) == 2
    assert resolve_zero_stage({"enabled": True, "stage": 3}, _layout()) == 3
    for layout in (_layout(tp=2), _layout(pp=2)):
        with pytest.raises(ValueError, match=r"zero_optimization.stage=3.*pure data-parallel"):
            resolve_zero_stage({"enabled": True, "stage": 3}, layout)
    with pytest.raises(ValueError, match=r"zero_optimization.stage=4.*supported stages"):
        resolve_zero_stage({"enabled": True, "stage": 4}, _layout())
    with pytest.raises(ValueError, match="data_parallel_size > 1"):
        resolve_zero_stage({"enabled": True, "stage": 1}, _layout(dp=1, tp=2))
