"""Mixed precision O1 / O2 on a layout: per layout, 3 AdamW steps of a tiny GPT (each global
batch split over dp); records the losses, the dtypes and local shapes of a tensor-parallel
weight and its master, this rank's training-state bytes with gradients held (masters
included), and with ``resume`` the last step's loss after a save / load into a fresh run.
The test (tests/distributed/test_master_weights_layouts.py) compares with the
single-process O2 run."""

from __future__ import annotations

import json

import torch
from common import parse_out_dir, run_checks
from master_weights_cases import GPT

from libai import dist
from libai.checkpoint import Checkpointer
from libai.models import GPTForPreTraining
from libai.runtime.parallelize import parallelize, shard_optimizer_for
from libai.runtime.spec import AmpSpec, RunSpec, ZeroSpec
from libai.runtime.zero import optimizer_state_bytes


def batch_of(step: int) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, GPT["vocab_size"], (4, 13), generator=g)
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def build(layout: dict):
    """Model, run parts and the (ZeRO-wrapped) AdamW of ``layout`` (``level``: O1 or O2;
    ``dtype``: bf16, or fp16 with its dynamic loss scaler)."""
    torch.manual_seed(layout.get("seed", 0))
    model = GPTForPreTraining(**GPT)
    zero = ZeroSpec(enabled=bool(layout.get("zero")), stage=layout.get("zero") or 1)
    spec = RunSpec(
        amp=AmpSpec(
            enabled=True, dtype=layout.get("dtype", "bf16"), level=layout.get("level", "O2")
        ),
        zero_optimization=zero,
        num_accumulation_steps=layout.get("microbatches", 1),
        dist=dict(layout["dist"]),
    )
    parts = parallelize(model, spec)
    optimizer = shard_optimizer_for(
        parts, torch.optim.AdamW(parts.runner.model.parameters(), lr=1e-2, weight_decay=0.1)
    )
    return parts, optimizer


def train(parts, optimizer, steps) -> list[float]:
    util = dist.get_dist_util()
    dp, rank = util.layout.data_parallel_size, util.data_parallel_rank
    losses = []
    for step in steps:
        batch = {k: v.chunk(dp)[rank] for k, v in batch_of(step).items()}
        losses.append(float(parts.runner.forward_backward(batch)))
        parts.runner.optimizer_step(optimizer, max_grad_norm=1.0)
    return losses


def state_bytes(model, optimizer) -> int:
    """Parameters and gradients, the optimizer's parameters that are not the model's (O2's
    masters) and the optimizer state: this rank's training state."""
    params = list(model.parameters())
    ids = {id(p) for p in params}
    extra = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in ids]
    grads = [p.grad for p in params if p.grad is not None]
    held = sum(_local(t).numel() * _local(t).element_size() for t in params + extra + grads)
    return held + optimizer_state_bytes(optimizer)


def run_layout(layout: dict, out_dir) -> dict:
    dist.setup_dist_util(dict(layout["dist"]))
    parts, optimizer = build(layout)
    losses = train(parts, optimizer, range(2))
    # the state after a backward, before the step: gradients held
    util = dist.get_dist_util()
    dp, rank = util.layout.data_parallel_size, util.data_parallel_rank
    parts.runner.forward_backward({k: v.chunk(dp)[rank] for k, v in batch_of(9).items()})
    held = state_bytes(parts.runner.model, optimizer)
    optimizer.zero_grad(set_to_none=True)
    losses += train(parts, optimizer, [2])
    weight = next(
        p for n, p in parts.runner.model.named_parameters() if "query_key_value.weight" in n
    )
    masters = parts.runner.master_weights
    master = None if masters is None else masters._master_of.get(id(weight))
    result = {
        "losses": losses,
        "weight_dtype": str(_local(weight).dtype),  # the local tensor: what computes
        "weight_local_shape": list(_local(weight).shape),
        "master_dtype": None if master is None else str(_local(master).dtype),
        "master_local_shape": None if master is None else list(_local(master).shape),
        "state_bytes": held,
    }
    if layout.get("resume"):  # save after 2 steps, load into a fresh run, step 3 again
        parts, optimizer = build(layout)
        train(parts, optimizer, range(2))
        ckpt = Checkpointer(parts.runner.model, str(out_dir), optimizer=optimizer)
        ckpt.save("model_0000001")
        parts, optimizer = build({**layout, "seed": 5})
        Checkpointer(parts.runner.model, str(out_dir), optimizer=optimizer).load(
            str(out_dir / "model_0000001")
        )
        result["resumed_losses"] = train(parts, optimizer, [2])
    return result


def main():
    out_dir, _, rest = parse_out_dir()
    layouts = json.loads(rest[0])
    run_checks(out_dir, lambda: {"layouts": [run_layout(layout, out_dir) for layout in layouts]})


if __name__ == "__main__":
    main()
