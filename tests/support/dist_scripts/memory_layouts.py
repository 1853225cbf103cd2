"""The memory estimator against what each rank really holds, on several layouts.

For every layout and ZeRO stage (``stages``, default none, 1, 2, 3; ``hsdp``: stage 3 as
HSDP with that replicate size): one AdamW step of the tiny GPT
(``tests/support/zero_runs.py``), then this rank's parameter, synced-gradient and
optimizer-state bytes next to :func:`libai.runtime.memory_estimator.estimate_memory`'s row for
this rank. A layout with ``activations`` also records one micro-batch's held activation bytes
of a larger GPT (with and without sequence parallel). The test
(tests/unit/runtime/test_memory_estimator.py) judges.
"""

from __future__ import annotations

import json

from common import parse_out_dir, run_checks
from gpt_reference import BATCH, SEQ, TINY_GPT
from memory_cases import (
    ACT_BATCH,
    ACT_GPT,
    ACT_SEQ,
    activation_case,
    local_bytes,
    measured_state,
    predicted_row,
)
from zero_runs import make_run, train

from libai import dist


def bytes_case(stage, num_microbatches: int, hsdp: int = 1) -> dict:
    util = dist.get_dist_util()
    hsdp = hsdp if stage == 3 else 1
    model, runner, optimizer = make_run(stage, num_microbatches, hsdp_replicate_size=hsdp)
    held = {}

    def on_synced(step):
        held["grads"] = local_bytes(p.grad for p in {id(p): p for p in model.parameters()}.values())

    train(runner, optimizer, range(1), on_synced=on_synced)
    dp = util.layout.data_parallel_size
    predicted = predicted_row(
        TINY_GPT,
        util.layout,
        util.rank,
        micro_batch_size=BATCH // dp // num_microbatches,
        seq_length=SEQ,
        num_microbatches=num_microbatches,
        zero_stage=stage,
        hsdp_replicate_size=hsdp,
    )
    predicted.pop("activations_micro_batch")
    return {"measured": measured_state(model, optimizer, held["grads"]), "predicted": predicted}


def check_layout(layout: dict) -> dict:
    util = dist.setup_dist_util(dict(layout["dist"]))
    m = layout.get("microbatches", 1)
    stages = layout.get("stages", [None, 1, 2, 3])
    result = {str(stage): bytes_case(stage, m, layout.get("hsdp", 1)) for stage in stages}
    if layout.get("activations"):
        result["act"] = activation_case(util.layout, util.rank, dp_rank=util.data_parallel_rank)
        sp = dist.setup_dist_util({**layout["dist"], "sequence_parallel": True})
        result["act_sp"] = activation_case(sp.layout, sp.rank, dp_rank=sp.data_parallel_rank)
    if layout.get("cp_activations"):  # a cp rank's share, and one process's whole sequence
        result["act_cp"] = activation_case(util.layout, util.rank, dp_rank=util.data_parallel_rank)
        one = predicted_row(
            ACT_GPT, dist.resolve_layout({}, 1), 0, seq_length=ACT_SEQ, micro_batch_size=ACT_BATCH
        )
        result["act_one_predicted"] = one["activations_micro_batch"]
    return result


def main():
    out_dir, _, rest = parse_out_dir()
    layouts = json.loads(rest[0])
    run_checks(out_dir, lambda: {item["name"]: check_layout(item) for item in layouts})


if __name__ == "__main__":
    main()
