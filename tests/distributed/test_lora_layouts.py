"""LoRA on every layout: a tiny Llama with adapters on q, v (segments of the fused
projection), o_proj, gate_proj, down_proj and the token embedding trains on dp2, tp2 (with
and without sequence parallel), pp2 (also with the head tied to the embedding), tp2 x pp2, ZeRO-1 x dp2, ZeRO-3 x dp2 and dp2 with activation checkpointing
exactly as on one process (losses, every gradient of the first step, clipping norms,
parameters after three steps, merged weights); on every rank no base weight holds a
gradient or optimizer state, and the gradient and optimizer-state bytes are the adapters'
own; the PEFT adapter exported from tp2 and tp2 x pp2 equals the one-process export and
loads back onto the layout."""

from __future__ import annotations

import json

import pytest
import torch
from gpt_reference import GRAD_TOL
from launch import torchrun_cases
from lora_reference import LORA_SAVED, lora_reference_run

from libai import dist

PP = {"pipeline_parallel_size": 2, "pipeline_num_layers": 2}
CASES_2 = [
    {"name": "dp2", "dist": {"data_parallel_size": 2}},
    {"name": "tp2", "dist": {"tensor_parallel_size": 2}},
    {"name": "tp2-sp", "dist": {"tensor_parallel_size": 2, "sequence_parallel": True}},
    {"name": "pp2", "dist": PP, "microbatches": 2},
    # the LM head tied to the adapted embedding: the last stage's copy takes the merged table
    {"name": "pp2-tied", "dist": PP, "microbatches": 2, "lora": "tied"},
    {"name": "dp2-zero1", "dist": {"data_parallel_size": 2}, "zero": 1},
    {"name": "dp2-zero3", "dist": {"data_parallel_size": 2}, "zero": 3},
    # checkpointed blocks recompute the adapters' forward in backward
    {
        "name": "dp2-recompute",
        "dist": {"data_parallel_size": 2},
        "runner": {"activation_checkpointing": "full"},
    },
    # modules_to_save: the vocab-parallel LM head trained whole beside the adapters
    {"name": "tp2-saved", "dist": {"tensor_parallel_size": 2}, "lora": "saved"},
]
CASES_4 = [{"name": "tp2-pp2", "dist": {"tensor_parallel_size": 2, **PP}, "microbatches": 2}]


@pytest.fixture(scope="module")
def peft_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_peft")
    return {name: str(root / name) for name in ("one", "tp2", "tp2-pp2", "saved", "tp2-saved")}


@pytest.fixture(scope="module")
def references(tmp_path_factory, peft_dirs):
    path = tmp_path_factory.mktemp("lora") / "references.pt"
    one = lora_reference_run(peft_dir=peft_dirs["one"])
    saved = lora_reference_run(peft_dir=peft_dirs["saved"], config=LORA_SAVED)
    tied = lora_reference_run(microbatches=2, tied=True)
    mb2 = lora_reference_run(microbatches=2)
    torch.save({"one": one, "mb2": mb2, "saved": saved, "tied": tied}, path)
    dist.reset_dist_util()
    return str(path)


def with_peft(cases, peft_dirs):
    return [{**c, "peft_dir": peft_dirs[c["name"]]} if c["name"] in peft_dirs else c for c in cases]


@pytest.fixture(scope="module")
def two_ranks(references, peft_dirs):
    return torchrun_cases("lora_layouts.py", 2, references, with_peft(CASES_2, peft_dirs))


@pytest.fixture(scope="module")
def four_ranks(references, peft_dirs):
    return torchrun_cases("lora_layouts.py", 4, references, with_peft(CASES_4, peft_dirs))


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
        if "peft_reload_diff" in item:  # exported and loaded back on this layout
            assert item["peft_reloaded"] > 0 and item["peft_reload_diff"] == 0.0, where


def test_peft_exports_from_tp2_and_tp2_pp2_equal_one_process(two_ranks, four_ranks, peft_dirs):
    """The adapter directory written from tp2 and from tp2 x pp2 (stages gathered) holds the
    one-process export's tensors and config."""
    from safetensors.torch import load_file

    for reference, name in (("one", "tp2"), ("one", "tp2-pp2"), ("saved", "tp2-saved")):
        want = load_file(f"{peft_dirs[reference]}/adapter_model.safetensors")
        config = open(f"{peft_dirs[reference]}/adapter_config.json").read()
        got = load_file(f"{peft_dirs[name]}/adapter_model.safetensors")
        assert sorted(got) == sorted(want), name
        for key, value in want.items():
            assert (got[key] - value).abs().max() < GRAD_TOL, (name, key)
        assert open(f"{peft_dirs[name]}/adapter_config.json").read() == config
    # the LM head's whole trained weight travels as PEFT writes modules_to_save
    saved = load_file(f"{peft_dirs['tp2-saved']}/adapter_model.safetensors")
    assert "base_model.model.lm_head.weight" in saved
    assert json.load(open(f"{peft_dirs['tp2-saved']}/adapter_config.json"))["modules_to_save"] == [
        "lm_head"
    ]


@pytest.mark.parametrize("case", [c["name"] for c in CASES_2])
def test_two_ranks_equal_one_process(two_ranks, case):
    check(two_ranks[case], pipeline=case.startswith("pp"))


@pytest.mark.parametrize("case", [c["name"] for c in CASES_4])
def test_four_ranks_equal_one_process(four_ranks, case):
    check(four_ranks[case], pipeline=True)
