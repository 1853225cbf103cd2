"""Mixed precision O2 on two processes: dp2 (with and without ZeRO-1), tp2 and pp2 against
the single-process O2 run (tests/unit/runtime/test_master_weights.py has the one-process
checks)."""

from __future__ import annotations

import json

import pytest
import torch
from launch import torchrun
from master_weights_cases import GPT

from libai import dist
from libai.models import GPTForPreTraining
from libai.runtime.parallelize import parallelize, shard_optimizer_for
from libai.runtime.spec import AmpSpec, RunSpec


def test_o2_on_dp2_zero1_tp2_and_pp2_follows_the_single_process_run():
    """Two processes: dp2, dp2 with ZeRO-1 and with ZeRO-2, tp2 and pp2 under O2 (and dp2
    with ZeRO-1 under O1 for the memory comparison). The losses follow the single-process O2 run on the same
    global batches within bf16 rounding. Layout: under tp2 each rank holds half of the fused
    QKV weight in bf16 and half of its master in fp32; under ZeRO-1 a rank keeps masters only
    for the parameters it owns, so its training state (bf16 parameters and gradients, its
    share of masters and Adam moments) is the formula's 2 + 2 + 12 / 2 = 10 bytes per
    parameter against O1's 4 + 4 + 8 / 2 = 12 (within the norms' fp32 share and the
    balance of the partition). ZeRO-1 and ZeRO-2 checkpoints (masters gathered from their
    owners) resume to the uninterrupted run's loss exactly."""
    single = _single_process_losses()
    dp = {"data_parallel_size": 2}
    pp = {"pipeline_parallel_size": 2, "pipeline_num_layers": 2, "data_parallel_size": 1}
    layouts = [
        {"dist": dp},
        {"dist": dp, "zero": 1, "resume": True},
        {"dist": {"tensor_parallel_size": 2, "data_parallel_size": 1}},
        {"dist": pp, "microbatches": 2},
        {"dist": dp, "zero": 1, "level": "O1"},
        {"dist": dp, "zero": 2, "resume": True},
        {"dist": pp, "microbatches": 2, "dtype": "fp16", "level": "O1"},
    ]
    ranks = torchrun("master_weights_layouts.py", 2, json.dumps(layouts))
    total = sum(p.numel() for p in GPTForPreTraining(**GPT).parameters())
    for rank in ranks:
        assert rank["ok"], rank.get("trace")
        plain, zero1, tp2, pp2, zero1_o1, zero2, pp2_fp16 = rank["layouts"]
        for run in (plain, zero1, tp2, zero2):
            assert run["losses"] == pytest.approx(single, rel=1e-2)
            assert run["weight_dtype"] == "torch.bfloat16"
        for run in (plain, tp2):
            assert run["master_dtype"] == "torch.float32"
        assert tp2["weight_local_shape"][0] * 2 == plain["weight_local_shape"][0]
        assert tp2["master_local_shape"] == tp2["weight_local_shape"]
        assert zero1["resumed_losses"] == zero1["losses"][2:]
        assert zero2["resumed_losses"] == zero2["losses"][2:]
        # ZeRO-2 also drops the gradients a rank does not own: 2 + 12 / 2 + 2 / 2 = 9
        assert zero2["state_bytes"] == pytest.approx(9 * total, rel=0.1)
        assert plain["state_bytes"] == pytest.approx(16 * total, rel=0.02)
        assert zero1["state_bytes"] == pytest.approx(10 * total, rel=0.1)
        assert zero1_o1["state_bytes"] == pytest.approx(12 * total, rel=0.1)
        assert zero1["state_bytes"] < 0.9 * zero1_o1["state_bytes"]
    # ZeRO-1: the weight's master lives on its owner only
    assert sorted(str(r["layouts"][1]["master_dtype"]) for r in ranks) == ["None", "torch.float32"]
    # pp: the loss is the last stage's, reduced to every stage; under fp16 the schedule's
    # losses carry the loss scale (2**16 at first), taken out before they are reported
    for rank in ranks:
        assert rank["layouts"][3]["losses"] == pytest.approx(single, rel=1e-2)
        assert rank["layouts"][6]["losses"] == pytest.approx(single, rel=1e-2)


def _single_process_losses():
    dist.setup_dist_util({})
    torch.manual_seed(0)
    model = GPTForPreTraining(**GPT)
    spec = RunSpec(amp=AmpSpec(enabled=True, dtype="bf16", level="O2"), num_accumulation_steps=1)
    parts = parallelize(model, spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    optimizer = shard_optimizer_for(parts, optimizer)
    losses = []
    for step in range(3):
        g = torch.Generator().manual_seed(100 + step)
        tokens = torch.randint(0, GPT["vocab_size"], (4, 13), generator=g)
        batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}
        losses.append(float(parts.runner.forward_backward(batch)))
        parts.runner.optimizer_step(optimizer, max_grad_norm=1.0)
    return losses
