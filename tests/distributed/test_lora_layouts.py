"""LoRA on every layout: a tiny Llama with adapters on q, v (segments of the fused
projection), o_proj, gate_proj and down_proj trains on dp2, tp2 (with and without sequence
parallel), pp2, tp2 x pp2, ZeRO-1 x dp2 and ZeRO-3 x dp2 exactly as on one process (losses,
every gradient of the first step, clipping norms, parameters after three steps, merged
weights); on every rank no base weight holds a gradient or optimizer state, and the
gradient and optimizer-state bytes are the adapters' own."""

from __future__ import annotations

import pytest
import torch
from gpt_reference import GRAD_TOL
from launch import torchrun_cases
from lora_reference import lora_reference_run

from libai import dist

PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": 2}
CASES_2 = [
    {"name": "dp2", "dist": {"data_parallel_size": 2}},
    {"name": "tp2", "dist": {"tensor_parallel_size": 2}},
    {"name": "tp2-sp", "dist": {"tensor_parallel_size": 2, "sequence_parallel": True}},
    {"name": "pp2", "dist": PP, "microbatches": 2},
    {"name": "dp2-zero1", "dist": {"data_parallel_size": 2}, "zero": 1},
    {"name": "dp2-zero3", "dist": {"data_parallel_size": 2}, "zero": 3},
]
CASES_4 = [{"name": "tp2-pp2", "dist": {"tensor_parallel_size": 2, **PP}, "microbatches": 2}]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora") / "references.pt"
    torch.save({"one": lora_reference_run(), "mb2": lora_reference_run(microbatches=2)}, path)
    dist.reset_dist_util()
    return str(path)


@pytest.fixture(scope="module")
def two_ranks(references):
    return torchrun_cases("lora_layouts.py", 2, references, CASES_2)


@pytest.fixture(scope="module")
def four_ranks(references):
    return torchrun_cases("lora_layouts.py", 4, references, CASES_4)


def check(items, pipeline: bool):
    for item in items:
        where = f"{item['name']} (pp rank {item['pipeline_rank']})"
        assert item["init_diff"] == 0.0, (where, item["init_worst"])
        if not pipeline or item["pipeline_rank"] == 1:  # the last stage reports the loss
            assert item["loss_diff"] < GRAD_TOL, where
        assert item["grads_checked"] > 0
        assert item["grad_diff"] < 1e-6, (where, item["grad_worst"], item["grad_diff"])
        assert item["grad_norm_diff"] < GRAD_TOL, where
        assert item["final_diff"] < GRAD_TOL, (where, item["final_worst"])
        assert item["merged_diff"] < 1e-6, (where, item["merged_worst"], item["merged_diff"])
        held = item["held"]
        assert held["base_with_grad"] == [] and held["base_with_state"] == [], (where, held)
        assert held["adapters_here"] > 0
        assert held["grad_bytes"] <= held["adapter_bytes"], (where, held)
        # SGD with momentum: one buffer per adapter parameter (ZeRO-1: this rank's share)
        if "zero1" not in item["name"]:
            assert held["state_bytes"] == held["adapter_bytes"], (where, held)
        else:
            assert 0 < held["state_bytes"] < held["adapter_bytes"], (where, held)


@pytest.mark.parametrize("case", [c["name"] for c in CASES_2])
def test_two_ranks_equal_one_process(two_ranks, case):
    check(two_ranks[case], pipeline=case.startswith("pp"))


@pytest.mark.parametrize("case", [c["name"] for c in CASES_4])
def test_four_ranks_equal_one_process(four_ranks, case):
    check(four_ranks[case], pipeline=True)
