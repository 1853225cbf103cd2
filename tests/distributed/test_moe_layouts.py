"""Expert parallel (``train.dist.expert_parallel_size``): a tiny Mixture-of-Experts Llama on
dp x ep, cp x ep (experts on context-parallel ranks too), tp x ep (with and without sequence
parallel), pp x ep and ZeRO-2 / ZeRO-3 x ep equals the single-process run (losses, every
gradient, clipping norms, parameters after three steps) in dropless and capacity modes
(padded to static shapes too: against the unpadded reference) and with DeepSeek-V3's routing; each rank holds E / ep experts and its experts
receive exactly the router's assignments of its ep group."""

from __future__ import annotations

import pytest
import torch
from gpt_reference import GRAD_TOL
from launch import torchrun_cases
from moe_reference import MOE, moe_reference_run

from libai import dist

PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": 2}
CASES_2 = [
    {"name": "dp2-ep2", "variant": "dropless", "dist": {"expert_parallel_size": 2}},
    {
        "name": "dp2-ep2-zero1",
        "variant": "dropless",
        "dist": {"expert_parallel_size": 2},
        "zero": 1,
    },
    {"name": "dp2-ep2-capacity", "variant": "capacity", "dist": {"expert_parallel_size": 2}},
    # padded to the capacity: equal all-to-all splits; compared with the unpadded reference
    {"name": "dp2-ep2-padded", "variant": "padded", "dist": {"expert_parallel_size": 2}},
    # experts borrow context-parallel ranks: each sequence's statistics over both shares
    {
        "name": "cp2-ep2-deepseek",
        "variant": "deepseek",
        "dist": {"context_parallel_size": 2, "expert_parallel_size": 2},
        "errors": True,
    },
    # checkpointed blocks recompute their routing and all-to-alls in backward
    {
        "name": "dp2-ep2-deepseek-recompute",
        "variant": "deepseek",
        "dist": {"expert_parallel_size": 2},
        "runner": {"activation_checkpointing": "full"},
    },
]
CASES_4 = [
    # ep borrows 2 of the 4 dp ranks: every expert on two ranks (the expert-data group)
    {"name": "dp4-ep2", "variant": "deepseek", "dist": {"expert_parallel_size": 2}},
    # ep over dp x cp = 4 ranks: one expert each
    {
        "name": "dp2-cp2-ep4",
        "variant": "deepseek",
        "dist": {"context_parallel_size": 2, "expert_parallel_size": 4},
    },
    {
        "name": "dp2-tp2-ep2",
        "variant": "dropless",
        "dist": {"tensor_parallel_size": 2, "expert_parallel_size": 2},
    },
    {
        "name": "dp2-tp2-sp-ep2-capacity",
        "variant": "capacity",
        "dist": {"tensor_parallel_size": 2, "sequence_parallel": True, "expert_parallel_size": 2},
        "shares": True,
    },
    {
        "name": "dp2-tp2-sp-ep2-padded",
        "variant": "padded",
        "dist": {"tensor_parallel_size": 2, "sequence_parallel": True, "expert_parallel_size": 2},
    },
    # ZeRO over dp for the dense weights; the experts stay whole on their ranks
    {
        "name": "dp4-ep2-zero2",
        "variant": "dropless",
        "dist": {"expert_parallel_size": 2},
        "zero": 2,
    },
    {
        "name": "dp4-ep2-zero3",
        "variant": "deepseek",
        "dist": {"expert_parallel_size": 2},
        "zero": 3,
    },
    # HSDP: the dense weights sharded over 2 ranks, replicated over 2 groups
    {
        "name": "dp4-ep2-hsdp2",
        "variant": "dropless",
        "dist": {"expert_parallel_size": 2},
        "zero": 3,
        "hsdp": 2,
    },
    {
        "name": "pp2-dp2-ep2",
        "variant": "dropless",
        "dist": {**PP, "expert_parallel_size": 2},
        "microbatches": 2,
    },
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``ep1``: the one-process reference's checkpoint; ``ep2``: where dp2 x ep2 saves."""
    root = tmp_path_factory.mktemp("moe_checkpoints")
    return {name: str(root / name) for name in ("ep1", "ep2", "ep2-zero1")}


@pytest.fixture(scope="module")
def references(tmp_path_factory, checkpoints):
    path = tmp_path_factory.mktemp("moe") / "references.pt"
    refs = {v: moe_reference_run(v) for v in ("capacity", "deepseek")}
    refs["padded"] = refs["capacity"]  # padding changes the shapes, not the numbers
    refs["dropless"] = moe_reference_run("dropless", save_dir=checkpoints["ep1"])
    # per micro-batch balancing statistics, as the pipeline's schedule has them
    refs["dropless/mb2"] = moe_reference_run("dropless", microbatches=2)
    torch.save(refs, path)
    dist.reset_dist_util()
    return str(path)


def run_cases(references, nproc, cases) -> dict[str, list[dict]]:
    return torchrun_cases("moe_layouts.py", nproc, references, cases)


def check_numbers(items, pipeline=False):
    for item in items:
        where = f"{item['name']} (pp rank {item['pipeline_rank']})"
        assert item["init_diff"] == 0.0, (where, item["init_worst"])
        # a pipeline reports the last stage's LM loss; the balancing terms of earlier stages
        # reach the gradients, not the logged loss
        loss_diff = item["lm_loss_diff"] if pipeline else item["loss_diff"]
        if not pipeline or item["pipeline_rank"] == 1:
            assert loss_diff < GRAD_TOL, where
        if item["term_diff"] is not None:
            assert item["term_diff"] < GRAD_TOL, where
        assert item["grad_diff"] < 1e-6, (where, item["grad_worst"], item["grad_diff"])
        assert item["grad_norm_diff"] < GRAD_TOL, where
        assert item["final_diff"] < GRAD_TOL, (where, item["final_worst"], item["final_diff"])
        assert item["momentum_diff"] < GRAD_TOL, where


def check_layout(items, ep: int):
    for item in items:
        for name, shape in item["experts"].items():
            assert shape["local"] == [MOE["num_experts"] // ep, 48, 32], (item["name"], name)
            assert shape["bytes"] == MOE["num_experts"] // ep * 48 * 32 * 4
        for name, counts in item["routing"].items():
            if "capacity" not in item["name"]:
                assert counts["received"] == counts["expected"], (item["name"], name, counts)


@pytest.fixture(scope="module")
def two_ranks(references, checkpoints):
    cases = [dict(c) for c in CASES_2]
    # dp2 x ep2 saves its checkpoint, and loads the one-process one
    cases[0].update(save_to=checkpoints["ep2"], load_from=checkpoints["ep1"])
    cases[1].update(save_to=checkpoints["ep2-zero1"])  # ZeRO's partial state, experts whole
    return run_cases(references, 2, cases)


@pytest.fixture(scope="module")
def four_ranks(references):
    return run_cases(references, 4, CASES_4)


@pytest.mark.parametrize("case", [c["name"] for c in CASES_2])
def test_two_ranks_equal_one_process(two_ranks, case):
    items = two_ranks[case]
    check_numbers(items)
    check_layout(items, 2 if "ep2" in case else 1)


@pytest.mark.parametrize("case", [c["name"] for c in CASES_4])
def test_four_ranks_equal_one_process(four_ranks, case):
    items = four_ranks[case]
    check_numbers(items, pipeline=case.startswith("pp"))
    check_layout(items, 4 if "ep4" in case else 2)
    for item in items:  # every rank steps its own experts: 3 weights x its MoE layers
        held = item["held"]
        assert held["expert_states"] == (3 if case.startswith("pp") else 6), (case, held)
        if "zero2" in case:  # ZeRO-2 partitions the dense weights' state over 4 dp ranks
            assert 0 < held["dense_states"] < held["dense_params"], (case, held)
    if case.endswith("sp-ep2-capacity"):  # each tp rank numbers its share's slots as one
        assert all(i["shares"] == {"slots_equal": True, "keep_equal": True} for i in items)
    if "zero2" in case:
        assert sum(i["held"]["dense_states"] for i in items) == items[0]["held"]["dense_params"]


def test_checkpoints_reshard_between_ep2_and_one_process(two_ranks, references, checkpoints):
    """The one-process checkpoint loads on dp2 x ep2 (each rank reading its experts), and
    dp2 x ep2's (also with ZeRO-1: each rank saving its share of the dense weights' state
    and its own experts') loads on one process: parameters, expert biases and momenta."""
    from gpt_reference import max_diff
    from moe_reference import build_moe_llama, make_optimizer, moe_state, momenta

    from libai.checkpoint.checkpointer import Checkpointer

    for item in two_ranks["dp2-ep2"]:
        assert item["loaded_diff"] == 0.0 and item["loaded_momentum_diff"] == 0.0, item
    ref = torch.load(references)["dropless"]
    dist.setup_dist_util({})
    for name in ("ep2", "ep2-zero1"):
        model = build_moe_llama("dropless")
        optimizer = make_optimizer(model)
        Checkpointer(model, checkpoints[name], optimizer=optimizer).load(
            checkpoints[name] + "/model_final"
        )
        assert max_diff(moe_state(model), ref["final"])[0] < GRAD_TOL, name
        loaded = momenta(model, optimizer)
        assert sorted(loaded) == sorted(ref["momenta"]), name  # every parameter's, once
        assert max_diff(loaded, ref["momenta"])[0] < GRAD_TOL, name
    fresh = build_moe_llama("dropless")  # the control: an unloaded model is far from it
    assert max_diff(moe_state(fresh), ref["final"])[0] > 1e-3
    dist.reset_dist_util()


def test_bad_expert_layouts_are_one_line_errors(two_ranks):
    """On cp2 x ep2: a dense model under ep > 1, experts that do not split over ep, and
    capacity mode under context parallel each raise one line, before any collective."""
    for item in two_ranks["cp2-ep2-deepseek"]:
        errors = item["errors"]
        assert errors["dense_model"].startswith(
            "train.dist.expert_parallel_size=2, but LlamaForCausalLM has no Mixture-of-Experts"
        ), errors
        assert errors["experts_not_divisible"].startswith(
            "3 experts do not split over train.dist.expert_parallel_size=2"
        ), errors
        assert errors["capacity_under_cp"].startswith(
            "moe.capacity_factor with train.dist.context_parallel_size > 1"
        ), errors
