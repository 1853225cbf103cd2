"""ZeRO stages 1-3 against the same layout without ZeRO and the single-process reference.

For every layout and stage: 3 AdamW steps with global-norm clipping give the parameters of
the run without ZeRO (and of the single-process AdamW run); each rank's optimizer state is
its share; stage 2 leaves a rank only the gradients it owns; stage 3 holds a shard of every
parameter and gradient; ``runner.predict`` (before training and between steps) gives the
predictions of the run without ZeRO and leaves the parameters sharded; a save -> load ->
continue on the same layout equals the uninterrupted run. A layout may ask for HSDP (``hsdp``), activation checkpointing
(``activation_checkpointing``), an AMP check (``amp``) and to keep its checkpoints
(``keep_checkpoints``: a directory the resharding tests load from). The script records the
differences; the test (tests/distributed/test_zero.py) judges them, with the tolerances of
``gpt_reference``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from common import parse_out_dir, run_checks
from gpt_reference import STEPS, full_state, max_diff
from zero_runs import make_run as _make_run
from zero_runs import predict, train

from libai import dist
from libai.checkpoint.checkpointer import Checkpointer
from libai.layers import TransformerLayer
from libai.runtime.zero import ZeroOptimizer, optimizer_state_bytes, owned_parameters


def _local_numel(tensors) -> int:
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() for t in tensors)


def amp_check(layout: dict) -> dict:
    """ZeRO-3 under bf16 AMP: blocks compute on bf16 gathered weights, the shards, their
    gradients and the optimizer stay fp32, and the loss stays near the fp32 one."""
    model, runner, optimizer = _make_run(
        3, hsdp_replicate_size=layout.get("hsdp", 1), amp_dtype=torch.bfloat16
    )
    seen = []
    block = next(m for m in model.modules() if isinstance(m, TransformerLayer))
    block.register_forward_pre_hook(lambda m, args: seen.append(str(next(m.parameters()).dtype)))
    losses, _ = train(runner, optimizer, range(1))
    param = next(block.parameters())
    return {
        "loss": losses[0],
        "gathered_dtype": seen[0],
        "shard_dtype": str(param.dtype),
        "state_dtypes": sorted(
            {str(v.dtype) for s in optimizer.state.values() for k, v in s.items() if k != "step"}
        ),
    }


def check_layout(layout: dict, ref: dict, out_dir) -> dict:
    util = dist.setup_dist_util(dict(layout["dist"]))
    num_microbatches = layout.get("microbatches", 1)
    hsdp = layout.get("hsdp", 1)

    def make_run(stage, num_microbatches):
        return _make_run(
            stage,
            num_microbatches,
            hsdp_replicate_size=hsdp if stage == 3 else 1,
            activation_checkpointing=layout.get("activation_checkpointing", False),
        )

    runs = {}
    stages = layout.get("stages", [1, 2])
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
            if step == 0 and stage == 3:  # a shard of every gradient
                grads_held["grad_numel"] = _local_numel(
                    p.grad for p in model.parameters() if p.grad is not None
                )

        # predictions (what the trainer's evaluation gives an accuracy evaluator) of the
        # initial model, as its first forward, and after a step, between training steps
        predictions = {"initial": predict(runner)}
        losses, norms = train(runner, optimizer, range(1), on_synced=on_synced)
        predictions["after_step"] = predict(runner)
        predict_numel = _local_numel(model.parameters())  # stage 3: gathered and freed again
        more = train(runner, optimizer, range(1, STEPS))
        losses, norms = losses + more[0], norms + more[1]
        runs[stage] = {
            "final": full_state(model),
            "losses": losses,
            "norms": norms,
            "state_bytes": optimizer_state_bytes(optimizer),
            "num_params": len(list(model.parameters())),
            "local_param_numel": _local_numel(model.parameters()),
            "predictions": predictions,
            "predict_numel": predict_numel,
            **grads_held,
        }
    shard_size = util.layout.data_parallel_size // hsdp
    result = {
        "name": layout["name"],
        "stages": {},
        # the ranks that split a state among them: one (pp, tp) position (and HSDP replica)
        "position": [util.pipeline_rank, util.tensor_parallel_rank],
        "replica": util.data_parallel_rank // shard_size,
    }
    base = runs[None]
    result["base_ref_diff"] = max_diff(base["final"], ref["final"])
    result["base_grad_diff"] = max_diff(base.pop("grads"), ref["grads"])
    result["base_norm_diff"] = max(abs(a - b) for a, b in zip(base["norms"], ref["grad_norms"]))
    result["base_state_bytes"] = base["state_bytes"]
    result["base_param_numel"] = base["local_param_numel"]
    base_predictions = base["predictions"]
    if base_predictions["initial"] is not None:  # the last pipeline stage
        dp, dp_rank = util.layout.data_parallel_size, util.data_parallel_rank
        want = ref["predictions"].chunk(dp)[dp_rank]
        result["base_predict_ref_diff"] = (base_predictions["initial"] - want).abs().max().item()
    for stage in stages:
        run = runs[stage]
        item = {
            "final_diff": max_diff(run["final"], base["final"]),
            "ref_diff": max_diff(run["final"], ref["final"]),
            "loss_diff": max(abs(a - b) for a, b in zip(run["losses"], base["losses"])),
            "norm_diff": max(abs(a - b) for a, b in zip(run["norms"], ref["grad_norms"])),
            "state_bytes": run["state_bytes"],
            "param_numel": run["local_param_numel"],
            "predict_param_numel": run["predict_numel"],
            "num_params": run["num_params"],
            "with_grad": run.get("with_grad"),
            "owned": run.get("owned"),
            "grad_numel": run.get("grad_numel"),
        }
        if base_predictions["initial"] is not None:
            for when, got in run["predictions"].items():
                diff = (got - base_predictions[when]).abs().max().item()
                item[f"predict_diff_{when}"] = diff
        result["stages"][str(stage)] = item

    # save after 2 steps, load into a fresh model and optimizer, continue: equals 3 straight
    keep = layout.get("keep_checkpoints")
    for stage in stages:
        ckpt_dir = str(Path(keep or out_dir) / f"ckpt_{layout['name']}_{stage}")
        model, runner, optimizer = make_run(stage, num_microbatches)
        train(runner, optimizer, range(STEPS - 1))
        Checkpointer(model, ckpt_dir, optimizer=optimizer).save("model_mid", iteration=1)
        model2, runner2, optimizer2 = make_run(stage, num_microbatches)
        Checkpointer(model2, ckpt_dir, optimizer=optimizer2).resume_or_load(None)
        assert optimizer_state_bytes(optimizer2) == optimizer_state_bytes(optimizer)
        train(runner2, optimizer2, range(STEPS - 1, STEPS))
        resumed = full_state(model2)
        result["stages"][str(stage)]["resume_diff"] = max_diff(resumed, runs[stage]["final"])
    if layout.get("amp"):
        result["amp"] = amp_check(layout)
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
