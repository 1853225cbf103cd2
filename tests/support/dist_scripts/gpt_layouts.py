"""GPT-2 under several dp x tp x pp layouts against the single-process reference.

For every layout: the initial weights, the loss of each of STEPS steps, every gradient of
the first step and every parameter after STEPS optimizer steps equal the reference; and the
rank holds only its share (tp shards, its pipeline stage's layers).
"""

from __future__ import annotations

import json

import torch
from common import parse_out_dir, run_checks
from gpt_reference import (
    GRAD_TOL,
    MAX_GRAD_NORM,
    STEPS,
    build_model,
    full_state,
    make_batch,
    make_optimizer,
    max_diff,
)
from torch.distributed.tensor import DTensor, Shard

from libai import dist
from libai.runtime.parallel import ModelRunner

#: losses, gradients, norms and parameters after SGD (linear in the gradients, so nothing
#: amplifies rounding) agree with one process to fp32 rounding on any CPU
TOL = GRAD_TOL


def held_layers(model) -> list[int]:
    return sorted(int(k) for k in model.GPT_model.transformer.layers.keys())


def strided_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view with a row stride one larger (not contiguous)."""
    buffer = torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype)
    buffer[..., :-1] = t
    view = buffer[..., :-1]
    assert not view.is_contiguous()
    return view


def watch_schedule_inputs(runner) -> list[bool]:
    """Wrap the pipeline schedule's ``step``: the list gets, per call, whether every tensor
    handed to ``torch.distributed.pipelining`` was contiguous (torch < 2.13 checks strides
    against the ones the stage was built with)."""
    handed: list[bool] = []
    if runner.pipeline:
        step = runner.stage_schedule.schedule.step

        def watched(*args, **kwargs):
            tensors = [*args, *(v for v in kwargs.values() if isinstance(v, torch.Tensor))]
            handed.append(all(t.is_contiguous() for t in tensors))
            return step(*args, **kwargs)

        runner.stage_schedule.schedule.step = watched
    return handed


def partial_eval(runner, util, row_losses: list[float]) -> float:
    """An evaluation set's smaller last batch (one row short of this rank's share): under pp
    the runner pads it to the stages' batch and scores the real rows only, so its loss is the
    mean of the single-process per-row losses, and ``predict`` gives one output per real row.
    Returns the loss difference."""
    dp, rank = util.layout.data_parallel_size, util.data_parallel_rank
    share = {k: v.chunk(dp)[rank] for k, v in make_batch(STEPS).items()}
    rows = share["input_ids"].shape[0] - 1
    if rows < 1:
        return 0.0
    partial = {k: v[:rows] for k, v in share.items()}
    first = rank * (rows + 1)
    want = sum(row_losses[first : first + rows]) / rows
    out = runner.predict(partial)
    assert out is None or out.shape[0] == rows, f"predict gave {out.shape[0]} rows, not {rows}"
    return abs(float(runner.eval_loss(partial)) - want)


def loop_eval(runner, util, row_losses: list[float]) -> float:
    """The runtime's one evaluation loop (every door's) over this rank's share of a full batch
    and then a one-row-short batch: the mean of the per-batch mean losses of every
    data-parallel rank, computed here from the single-process per-row losses. Returns the
    difference."""
    from libai.runtime.evaluate import evaluate

    dp, rank = util.layout.data_parallel_size, util.data_parallel_rank
    share = {k: v.chunk(dp)[rank] for k, v in make_batch(STEPS).items()}
    rows = share["input_ids"].shape[0]
    if rows < 2:
        return 0.0
    partial = {k: v[: rows - 1] for k, v in share.items()}
    means = []
    for r in range(dp):
        mine = row_losses[r * rows : (r + 1) * rows]
        means += [sum(mine) / rows, sum(mine[:-1]) / (rows - 1)]
    result = evaluate(runner, [share, partial])
    assert result.batches == 2 * dp, f"evaluated {result.batches} batches, not {2 * dp}"
    return abs(result.loss - sum(means) / len(means))


def check_layout(layout: dict, ref: dict) -> dict:
    util = dist.setup_dist_util(dict(layout["dist"]))
    tp, dp = util.layout.tensor_parallel_size, util.layout.data_parallel_size
    model = build_model()
    runner = ModelRunner(model, num_microbatches=layout.get("microbatches", 1))
    init_diff, init_name = max_diff(full_state(model), ref["init"])
    # layout: every tp-sharded parameter holds 1/tp of its dim; others are full size
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            for mesh_dim, placement in enumerate(p.placements):
                if isinstance(placement, Shard):
                    assert util.stage_dims[mesh_dim] == "tp", name
                    full = p.shape[placement.dim]
                    assert p.to_local().shape[placement.dim] * tp == full, name
        else:
            assert tp == 1 and dp == 1, f"{name} is a plain tensor on a multi-rank stage"
    local_numel = sum(
        p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters()
    )
    optimizer = make_optimizer(model)
    losses, grad_diff, grad_name, norms = [], None, None, []
    handed = watch_schedule_inputs(runner)
    for step in range(STEPS):
        batch = {k: v.chunk(dp)[util.data_parallel_rank] for k, v in make_batch(step).items()}
        if step == 0:  # a strided view, as `tokens[:, :-1]` of a seq + 1 buffer is
            batch = {k: strided_view(v) for k, v in batch.items()}
        losses.append(float(runner.forward_backward(batch)))
        if step == 0:
            grad_diff, grad_name = max_diff(full_state(model, with_grads=True), ref["grads"])
        norms.append(float(runner.clip_grad_norm_(MAX_GRAD_NORM)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    final_diff, final_name = max_diff(full_state(model), ref["final"])
    # model.eval() reaches every stage the rank runs (interleaved: copies of the model)
    model.eval()
    partial_diff = partial_eval(runner, util, ref["row_losses"])
    loop_diff = loop_eval(runner, util, ref["row_losses"])
    runner.eval_loss(batch)
    eval_everywhere = True
    if runner.pipeline:
        stage_modules = [m for s in runner.stage_schedule.stages for m in s.submod.model.modules()]
        eval_everywhere = not any(m.training for m in stage_modules)
    model.train()
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref["losses"]))
    norm_diff = max(abs(a - b) for a, b in zip(norms, ref["grad_norms"]))
    result = {
        "name": layout["name"],
        "init_diff": init_diff,
        "loss_diff": loss_diff,
        "grad_diff": grad_diff,
        "grad_worst": grad_name,
        "final_diff": final_diff,
        "grad_norm_diff": norm_diff,
        "final_worst": final_name,
        "losses": losses,
        "layers": held_layers(model),
        "has_embedding": model.GPT_model.embeddings is not None,
        "has_head": model.GPT_model.lm_head is not None,
        "local_numel": local_numel,
        "pipeline_rank": util.pipeline_rank,
        "stage_ids": list(util.layout.layer_stage_ids),
        "eval_everywhere": eval_everywhere,
        "partial_eval_diff": partial_diff,
        "loop_eval_diff": loop_diff,
    }
    assert all(handed) and (handed or not runner.pipeline), (
        f"{layout['name']}: a non-contiguous tensor reached the schedule ({handed})"
    )
    assert eval_everywhere, f"{layout['name']}: a pipeline stage stayed in training mode"
    assert init_diff == 0.0, f"{layout['name']}: initial weights differ ({init_name})"
    checked = ("loss_diff", "grad_diff", "final_diff", "grad_norm_diff", "partial_eval_diff")
    for key in (*checked, "loop_eval_diff"):
        assert result[key] <= TOL, f"{layout['name']}: {key}={result[key]:.3g} > {TOL}"
    return result


def main():
    out_dir, _, rest = parse_out_dir()
    ref_path, layouts = rest[0], json.loads(rest[1])
    ref = torch.load(ref_path)

    def checks():
        return {"layouts": [check_layout(layout, ref) for layout in layouts]}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
