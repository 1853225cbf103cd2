"""``train.zero_optimization``: ZeRO stages 1-3 keep the numbers and shard the state."""

from __future__ import annotations

import json
import types

import pytest
import torch
from gpt_reference import (
    GRAD_TOL,
    MAX_GRAD_NORM,
    STEPS,
    adam_param_tol,
    build_model,
    full_state,
    make_batch,
    max_diff,
)
from launch import torchrun

from libai.engine.parallel import ModelRunner
from libai.engine.zero import partition_parameters, resolve_zero_stage
from libai.utils import distributed as dist

ADAMW = dict(lr=0.01, weight_decay=0.1, eps=1e-6)  # as in dist_scripts/zero_layouts.py
#: parameters after STEPS AdamW steps on two layouts (see gpt_reference.adam_param_tol)
PARAM_TOL = adam_param_tol(ADAMW["lr"], STEPS)


def adamw_reference(batch_of_step=make_batch, grad_hook=None) -> dict:
    """Single-process AdamW run with global-norm clipping.

    ``batch_of_step`` and ``grad_hook`` (applied to every gradient after backward) plant the
    faults that ``test_the_tolerances_still_catch_layout_bugs`` needs.
    """
    dist.setup_dist_util({})
    model = build_model()
    runner = ModelRunner(model)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    norms, grads = [], None
    for step in range(STEPS):
        runner.forward_backward(batch_of_step(step))
        if grad_hook is not None:
            for p in model.parameters():
                p.grad = grad_hook(p.grad)
        if step == 0:
            grads = full_state(model, with_grads=True)
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    state = sum(
        v.numel() * v.element_size()
        for entry in optimizer.state.values()
        for v in entry.values()
        if torch.is_tensor(v)
    )
    return {"final": full_state(model), "grads": grads, "grad_norms": norms, "state_bytes": state}


def layout_matches_reference(run: dict, ref: dict) -> list[str]:
    """What differs between a run and the reference beyond the tolerances (empty: equal).

    Gradients and clipping norms are compared at fp32 rounding (GRAD_TOL); parameters after
    the AdamW steps at PARAM_TOL, since Adam amplifies last-bit gradient differences.
    """
    problems = []
    grad_diff, grad_name = max_diff(run["grads"], ref["grads"])
    if grad_diff > GRAD_TOL:
        problems.append(f"first-step gradient {grad_name} differs by {grad_diff:.3g}")
    norm_diff = max(abs(a - b) for a, b in zip(run["grad_norms"], ref["grad_norms"]))
    if norm_diff > GRAD_TOL:
        problems.append(f"a gradient norm differs by {norm_diff:.3g}")
    final_diff, final_name = max_diff(run["final"], ref["final"])
    if final_diff > PARAM_TOL:
        problems.append(f"parameter {final_name} after AdamW differs by {final_diff:.3g}")
    return problems


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
        name = layout["name"]
        for item in items:  # the layout without ZeRO equals one process
            assert item["base_grad_diff"][0] <= GRAD_TOL, (name, item["base_grad_diff"])
            assert item["base_norm_diff"] <= GRAD_TOL, (name, item["base_norm_diff"])
            assert item["base_ref_diff"][0] <= PARAM_TOL, (name, item["base_ref_diff"])
        for stage in items[0]["stages"]:
            per_rank = [item["stages"][stage] for item in items]
            for item, s in zip(items, per_rank):
                # ZeRO on the same layout runs the same kernels and the same dp reduction
                # (a sum of 2, exact in any order); it only changes which rank updates which
                # entry. So its parameters match those without ZeRO to the last bits on any
                # CPU, even after AdamW's amplification.
                assert s["final_diff"][0] <= 1e-6, (name, stage, s["final_diff"])
                assert s["ref_diff"][0] <= PARAM_TOL, (name, stage, s["ref_diff"])
                # clipping still uses the global norm of the whole model
                assert s["norm_diff"] <= GRAD_TOL, (name, stage, s["norm_diff"])
                # same layout, same process kind: resuming is bitwise
                assert s["resume_diff"][0] == 0.0, (name, stage, s["resume_diff"])
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


def test_the_tolerances_still_catch_layout_bugs(reference):
    """The tolerances admit rounding (the measured tp2 difference is 1/26 of PARAM_TOL) but
    not bugs (a missing all-reduce is 200x PARAM_TOL)."""
    ref, _ = reference
    assert layout_matches_reference(ref, ref) == []
    # rounding: every nonzero gradient entry moved by ~1e-9, the last bits of sums of 1e-2
    # sized terms, as another CPU's kernels do. Adam turns that into parameter moves of
    # ~3e-5 (lr * 1e-9 / eps per step), more than a flat 1e-5 allows; the tolerances pass it
    torch.manual_seed(0)
    jitter = adamw_reference(grad_hook=lambda g: g + 1e-9 * torch.randn_like(g) * (g != 0))
    assert layout_matches_reference(jitter, ref) == []
    assert 1e-5 < max_diff(jitter["final"], ref["final"])[0] < PARAM_TOL / 5
    # a missing dp all-reduce: dp rank 0 steps on the gradient of its half of the batch
    half = adamw_reference(lambda step: {k: v.chunk(2)[0] for k, v in make_batch(step).items()})
    problems = layout_matches_reference(half, ref)
    assert any(p.startswith("parameter") for p in problems), problems
    assert max_diff(half["final"], ref["final"])[0] > 50 * PARAM_TOL
    # an all-reduce that sums instead of averaging over dp2: Adam is scale-invariant and every
    # step clips, so the parameters come out the same; the tight gradient checks catch it
    doubled = adamw_reference(grad_hook=lambda g: 2 * g)
    problems = layout_matches_reference(doubled, ref)
    assert max_diff(doubled["final"], ref["final"])[0] <= PARAM_TOL
    assert any("gradient" in p for p in problems) and any("norm" in p for p in problems)


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
