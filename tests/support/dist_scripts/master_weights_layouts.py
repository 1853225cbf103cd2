"""Mixed precision O2 on a layout: per layout, 3 AdamW steps of a tiny GPT (each global
batch split over dp); records the losses, the dtypes and local shapes of a tensor-parallel
weight and its master, and this rank's optimizer-state bytes (masters included). The test
(tests/unit/runtime/test_master_weights.py) compares with the single-process O2 run."""

from __future__ import annotations

import json

import torch
from common import parse_out_dir, run_checks

from libai import dist
from libai.models import GPTForPreTraining
from libai.runtime.parallelize import parallelize, shard_optimizer_for
from libai.runtime.spec import AmpSpec, RunSpec, ZeroSpec
from libai.runtime.zero import optimizer_state_bytes

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


def batch_of(step: int) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, GPT["vocab_size"], (4, 13), generator=g)
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def run_layout(layout: dict) -> dict:
    util = dist.setup_dist_util(dict(layout["dist"]))
    torch.manual_seed(0)
    model = GPTForPreTraining(**GPT)
    zero = ZeroSpec(enabled=bool(layout.get("zero")), stage=1)
    spec = RunSpec(
        amp=AmpSpec(enabled=True, dtype="bf16", level="O2"),
        zero_optimization=zero,
        num_accumulation_steps=layout.get("microbatches", 1),
        dist=dict(layout["dist"]),
    )
    parts = parallelize(model, spec)
    optimizer = shard_optimizer_for(
        parts, torch.optim.AdamW(parts.runner.model.parameters(), lr=1e-2, weight_decay=0.1)
    )
    dp, rank = util.layout.data_parallel_size, util.data_parallel_rank
    losses = []
    for step in range(3):
        batch = {k: v.chunk(dp)[rank] for k, v in batch_of(step).items()}
        losses.append(float(parts.runner.forward_backward(batch)))
        parts.runner.optimizer_step(optimizer, max_grad_norm=1.0)
    weight = next(
        p for n, p in parts.runner.model.named_parameters() if "query_key_value.weight" in n
    )
    master = parts.runner.master_weights._master_of[id(weight)]
    return {
        "losses": losses,
        "weight_dtype": str(weight.dtype),
        "weight_local_shape": list(_local(weight).shape),
        "master_dtype": str(master.dtype),
        "master_local_shape": list(_local(master).shape),
        "state_bytes": optimizer_state_bytes(optimizer),
    }


def main():
    out_dir, _, rest = parse_out_dir()
    layouts = json.loads(rest[0])
    run_checks(out_dir, lambda: {"layouts": [run_layout(layout) for layout in layouts]})


if __name__ == "__main__":
    main()
