"""LoRA on a layout against the single-process reference (tests/distributed/test_lora_layouts.py).

For each case: the initial weights, each step's loss, every gradient of the first step, the
clipping norms, every parameter after STEPS steps and the merged weights equal the
reference; and the layout is measured on live tensors: no base weight holds a gradient,
optimizer state exists for adapter parameters only, and its bytes equal the adapters'
local bytes.
"""

from __future__ import annotations

import torch
from common import run_cases
from gpt_reference import max_diff
from lora_reference import CONFIGS, build_lora_llama, lora_batch, lora_state, merged_weights
from moe_reference import make_optimizer, train

from libai import dist
from libai.layers.param import local_value
from libai.runtime.parallel import ModelRunner
from libai.runtime.zero import prepare_model, shard_optimizer


def _bytes(t) -> int:
    return local_value(t).nbytes


def check_case(case: dict, refs: dict) -> dict:
    util = dist.setup_dist_util(case["dist"])
    dp = util.layout.data_parallel_size
    microbatches = case.get("microbatches", 1)
    kind = case.get("lora", "adapters")
    ref = refs[kind if kind != "adapters" else "mb2" if microbatches > 1 else "one"]
    model = build_lora_llama(CONFIGS[kind], tied=kind == "tied")
    runner = ModelRunner(model, num_microbatches=microbatches, **case.get("runner", {}))
    stage = case.get("zero")
    prepare_model(runner, stage)
    init_diff, init_name = max_diff(lora_state(model), ref["init"])

    def local_batch(step):
        rank = util.data_parallel_rank
        return {
            k: torch.cat([mb.chunk(dp)[rank] for mb in v.chunk(microbatches)])
            for k, v in lora_batch(step).items()
        }

    optimizer = make_optimizer(model)
    if stage is not None:
        optimizer = shard_optimizer(runner, optimizer, stage)
    out = train(runner, local_batch, lora_state, optimizer)
    params = dict(model.named_parameters())
    adapters = {n for n, p in params.items() if p.requires_grad}  # and modules_to_save
    state_bytes = sum(
        _bytes(v)
        for p in optimizer.state
        for v in optimizer.state[p].values()
        if torch.is_tensor(v)
    )
    held = {
        "base_with_grad": sorted(
            n for n, p in params.items() if n not in adapters and p.grad is not None
        ),
        "base_with_state": sorted(
            n for n, p in params.items() if n not in adapters and p in optimizer.state
        ),
        "adapter_bytes": sum(_bytes(params[n]) for n in adapters),
        "state_bytes": state_bytes,
        "grad_bytes": sum(_bytes(p.grad) for p in params.values() if p.grad is not None),
        "adapters_here": len(adapters),
    }
    final_diff, final_name = max_diff(lora_state(model), ref["final"])
    peft = peft_round_trip(model, case) if case.get("peft_dir") else {}
    grad_diff, grad_name = max_diff(out["grads"], ref["grads"])
    merged_diff, merged_name = max_diff(merged_weights(model), ref["merged"])
    return {
        "name": case["name"],
        "pipeline_rank": util.pipeline_rank,
        "init_diff": init_diff,
        "init_worst": init_name,
        "loss_diff": max(abs(a - b) for a, b in zip(out["losses"], ref["losses"])),
        "grad_diff": grad_diff,
        "grad_worst": grad_name,
        "grads_checked": len(out["grads"]),
        "grad_norm_diff": max(abs(a - b) for a, b in zip(out["grad_norms"], ref["grad_norms"])),
        "final_diff": final_diff,
        "final_worst": final_name,
        "merged_diff": merged_diff,
        "merged_worst": merged_name,
        "held": held,
        **peft,
    }


def peft_round_trip(model, case: dict) -> dict:
    """The trained adapters exported from this layout as a PEFT directory (for the test to
    compare with the one-process export), and loaded back onto a fresh model on this
    layout: the same adapter values."""
    from libai.models.lora_peft import load_peft_adapter, save_peft_adapter

    config = CONFIGS[case.get("lora", "adapters")]
    path = case["peft_dir"]
    save_peft_adapter(model, config, path)
    fresh = build_lora_llama(config, tied=case.get("lora") == "tied")
    fresh = ModelRunner(fresh, num_microbatches=case.get("microbatches", 1)).model
    trained = {n for n, p in fresh.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for p in fresh.parameters():  # forget the seeded values: only the file counts
            if p.requires_grad:
                p.zero_()
    load_peft_adapter(fresh, path)
    got = {n: v for n, v in lora_state(fresh).items() if n in trained}
    want = {n: v for n, v in lora_state(model).items() if n in trained}
    return {"peft_reload_diff": max_diff(got, want)[0], "peft_reloaded": len(got)}


if __name__ == "__main__":
    run_cases(check_case)
