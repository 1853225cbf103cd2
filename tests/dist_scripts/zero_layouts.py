"""ZeRO stages 1 and 2 against the same layout without ZeRO and the single-process reference.

For every layout and stage: 3 AdamW steps with global-norm clipping give the parameters of
the run without ZeRO (and of the single-process AdamW run); each rank's optimizer state is
its share; stage 2 leaves a rank only the gradients it owns; a save -> load -> continue on the
same layout equals the uninterrupted run. The script records the differences; the test
(tests/test_zero.py) judges them, with the tolerances of ``gpt_reference``.
"""

from __future__ import annotations

import json

import torch
from common import parse_out_dir, run_checks
from gpt_reference import MAX_GRAD_NORM, STEPS, build_model, full_state, make_batch, max_diff

from libai.engine.parallel import ModelRunner
from libai.engine.zero import (
    ZeroOptimizer,
    optimizer_state_bytes,
    owned_parameters,
    prepare_model,
    shard_optimizer,
)
from libai.utils import distributed as dist
from libai.utils.checkpoint import Checkpointer

ADAMW = dict(lr=0.01, weight_decay=0.1, eps=1e-6)


def make_run(stage, num_microbatches=1):
    model = build_model()
    runner = ModelRunner(model, num_microbatches=num_microbatches)
    prepare_model(runner, stage)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    if stage is not None:
        optimizer = shard_optimizer(runner, optimizer, stage)
    return model, runner, optimizer


def train(runner, optimizer, steps, *, on_synced=None):
    util = dist.get_dist_util()
    dp = util.layout.data_parallel_size
    losses, norms = [], []
    for step in steps:
        batch = {k: v.chunk(dp)[util.data_parallel_rank] for k, v in make_batch(step).items()}
        losses.append(float(runner.forward_backward(batch)))
        if on_synced is not None:
            on_synced(step)
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, norms


def check_layout(layout: dict, ref: dict, out_dir) -> dict:
    util = dist.setup_dist_util(dict(layout["dist"]))
    num_microbatches = layout.get("microbatches", 1)
    runs = {}
    stages = [1, 2] + ([3] if layout.get("stage3") else [])
    for stage in [None, *stages]:
        model, runner, optimizer = make_run(stage, num_microbatches)
        grads_held = {}

        def on_synced(step, model=model, optimizer=optimizer, grads_held=grads_held, stage=stage):
            if step == 0 and stage is None:  # the synced gradients of the first step
                grads_held["grads"] = full_state(model, with_grads=True)
            if step == 0 and isinstance(optimizer, ZeroOptimizer):
                names = {id(p): n for n, p in model.named_parameters()}
                grads_held["with_grad"] = sorted(
                    names[id(p)] for p in model.parameters() if p.grad is not None
                )
                grads_held["owned"] = sorted(names[id(p)] for p in owned_parameters(optimizer))

        losses, norms = train(runner, optimizer, range(STEPS), on_synced=on_synced)
        runs[stage] = {
            "final": full_state(model),
            "losses": losses,
            "norms": norms,
            "state_bytes": optimizer_state_bytes(optimizer),
            "num_params": len(list(model.parameters())),
            "local_param_numel": sum(
                (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
            ),
            **grads_held,
        }
    result = {
        "name": layout["name"],
        "stages": {},
        "position": [util.pipeline_rank, util.tensor_parallel_rank],
    }
    base = runs[None]
    result["base_ref_diff"] = max_diff(base["final"], ref["final"])
    result["base_grad_diff"] = max_diff(base.pop("grads"), ref["grads"])
    result["base_norm_diff"] = max(abs(a - b) for a, b in zip(base["norms"], ref["grad_norms"]))
    result["base_state_bytes"] = base["state_bytes"]
    result["base_param_numel"] = base["local_param_numel"]
    for stage in stages:
        run = runs[stage]
        item = {
            "final_diff": max_diff(run["final"], base["final"]),
            "ref_diff": max_diff(run["final"], ref["final"]),
            "loss_diff": max(abs(a - b) for a, b in zip(run["losses"], base["losses"])),
            "norm_diff": max(abs(a - b) for a, b in zip(run["norms"], ref["grad_norms"])),
            "state_bytes": run["state_bytes"],
            "param_numel": run["local_param_numel"],
            "num_params": run["num_params"],
            "with_grad": run.get("with_grad"),
            "owned": run.get("owned"),
        }
        result["stages"][str(stage)] = item

    # save after 2 steps, load into a fresh model and optimizer, continue: equals 3 straight
    for stage in stages:
        ckpt_dir = str(out_dir / f"ckpt_{layout['name']}_{stage}")
        model, runner, optimizer = make_run(stage, num_microbatches)
        train(runner, optimizer, range(STEPS - 1))
        Checkpointer(model, ckpt_dir, optimizer=optimizer).save("model_mid", iteration=1)
        model2, runner2, optimizer2 = make_run(stage, num_microbatches)
        Checkpointer(model2, ckpt_dir, optimizer=optimizer2).resume_or_load(None)
        assert optimizer_state_bytes(optimizer2) == optimizer_state_bytes(optimizer)
        train(runner2, optimizer2, range(STEPS - 1, STEPS))
        resumed = full_state(model2)
        result["stages"][str(stage)]["resume_diff"] = max_diff(resumed, runs[stage]["final"])
    return result


def main():
    out_dir, _, rest = parse_out_dir()
    ref_path, layouts = rest[0], json.loads(rest[1])
    ref = torch.load(ref_path)

    def checks():
        return {"layouts": [check_layout(layout, ref, out_dir) for layout in layouts]}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
