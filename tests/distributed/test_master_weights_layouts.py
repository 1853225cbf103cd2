"""Mixed precision O2 on two processes: dp2 (with and without ZeRO-1), tp2 and pp2 against
the single-process O2 run (tests/unit/runtime/test_master_weights.py has the one-process
checks)."""

from __future__ import annotations

import json

import pytest
import torch
from launch import torchrun

from libai import dist
from libai.models import GPTForPreTraining
from libai.runtime.parallelize import parallelize, shard_optimizer_for
from libai.runtime.spec import AmpSpec, RunSpec

#: the dist script's model (tests/support/dist_scripts/master_weights_layouts.py)
GPT = dict(
    hidden_layers=2,
    vocab_size=64,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    max_seq_length=16,
    embedding_dropout_prob=0.0,
    attention_dropout_prob=0.0,
    output_dropout_prob=0.0,
)


def test_o2_on_dp2_zero1_tp2_and_pp2_follows_the_single_process_run():
    """Two processes: dp2 with ZeRO-1 (each rank's optimizer state -- fp32 masters and Adam
    moments -- is its share: about half of dp2 without ZeRO), tp2 (each rank holds half of
    the fused QKV weight in bf16 and half of its master in fp32) and pp2. The losses follow
    the single-process O2 run on the same global batches within bf16 rounding."""
    single = _single_process_losses()
    dp = {"data_parallel_size": 2}
    layouts = [
        {"dist": dp},
        {"dist": dp, "zero": True},
        {"dist": {"tensor_parallel_size": 2, "data_parallel_size": 1}},
        {
            "dist": {
                "pipeline_parallel_size": 2,
                "pipeline_num_layers": 2,
                "data_parallel_size": 1,
            },
            "microbatches": 2,
        },
    ]
    ranks = torchrun("master_weights_layouts.py", 2, json.dumps(layouts))
    for rank in ranks:
        assert rank["ok"], rank.get("trace")
        plain, zero1, tp2, pp2 = rank["layouts"]
        for run in (plain, zero1, tp2):
            assert run["losses"] == pytest.approx(single, rel=1e-2)
            assert (run["weight_dtype"], run["master_dtype"]) == ("torch.bfloat16", "torch.float32")
        assert zero1["state_bytes"] < 0.65 * plain["state_bytes"]
        assert tp2["weight_local_shape"][0] * 2 == plain["weight_local_shape"][0]
        assert tp2["master_local_shape"] == tp2["weight_local_shape"]
    # pp: the loss is the last stage's, reduced to every stage
    assert ranks[0]["layouts"][3]["losses"] == pytest.approx(single, rel=1e-2)


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
