"""ZeRO checkpoints reshard (run by tests/distributed/test_zero.py on 2 ranks).

``root`` holds checkpoints saved after 2 of the tiny GPT's AdamW steps by the layout runs
(``ckpt_dp2_2``: dp2 ZeRO-2) and by the test process (``ckpt_single``: one process). Each is
loaded on another layout and stage, and the next 2 steps are recorded beside those of an
uninterrupted run on that layout: dp2 ZeRO-2 -> tp2, one process -> dp2 ZeRO-3. Then a model
that FSDP2 cannot wrap (a parameter shared by two blocks) must fail on every rank before any
collective, leaving the ranks able to go on.
"""

from __future__ import annotations

import os

import torch.distributed as torch_dist
from common import parse_out_dir, run_checks
from zero_runs import make_run, train

from libai import dist
from libai.checkpoint.checkpointer import Checkpointer
from libai.runtime.zero import optimizer_state_bytes, prepare_model

SAVED_AFTER, STEPS = 2, 4


def resume(checkpoint: str, dist_cfg: dict, stage) -> dict:
    """Losses of steps 2, 3: uninterrupted on this layout, and resumed from ``checkpoint``."""
    dist.setup_dist_util(dict(dist_cfg))
    _, runner, optimizer = make_run(stage)
    uninterrupted, _ = train(runner, optimizer, range(STEPS))
    model, runner, optimizer = make_run(stage)
    extra = Checkpointer(model, checkpoint, optimizer=optimizer).resume_or_load(None)
    resumed, _ = train(runner, optimizer, range(SAVED_AFTER, STEPS))
    return {
        "iteration": extra.get("iteration"),
        "uninterrupted": uninterrupted[SAVED_AFTER:],
        "resumed": resumed,
        "state_bytes": optimizer_state_bytes(optimizer),
    }


def unwrappable() -> dict:
    """ZeRO-3 of a model whose two blocks share a weight: a clear error on every rank."""
    dist.setup_dist_util({"data_parallel_size": 2})
    model, runner, _ = make_run(None)
    layers = model.GPT_model.transformer.layers
    layers["1"].mlp.dense_h_to_4h.weight = layers["0"].mlp.dense_h_to_4h.weight
    try:
        prepare_model(runner, 3)
        error = None
    except ValueError as exc:
        error = str(exc)
    torch_dist.barrier()  # every rank got here: none waits in a collective of the failed call
    return {"error": error}


def main():
    out_dir, _, rest = parse_out_dir()
    root = rest[0]

    def checks():
        return {
            "zero2_dp2_to_tp2": resume(
                os.path.join(root, "ckpt_dp2_2"), {"tensor_parallel_size": 2}, None
            ),
            "single_to_zero3_dp2": resume(
                os.path.join(root, "ckpt_single"), {"data_parallel_size": 2}, 3
            ),
            "unwrappable": unwrappable(),
        }

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
