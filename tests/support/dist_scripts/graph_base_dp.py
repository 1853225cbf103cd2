"""LiBai's ``GraphBase`` on two data-parallel ranks against one process.

Each rank trains the tiny GPT through a training ``GraphBase`` (two accumulation steps) on
its half of every batch; the losses it returns and the parameters after STEPS steps equal
one process's plain loop on the whole batch (the reference the test passes in), and the
gradients were synced over dp: without the sync each rank would step on its own half.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # compile is not what is tested here

import torch  # noqa: E402
from common import parse_out_dir, run_checks  # noqa: E402
from gpt_reference import STEPS, build_model, full_state, make_batch, max_diff  # noqa: E402

from libai import dist  # noqa: E402
from libai.models.utils import GraphBase  # noqa: E402


def main():
    out_dir, _, rest = parse_out_dir()
    ref = torch.load(rest[0])

    def checks():
        util = dist.setup_dist_util({"data_parallel_size": 2})
        model = build_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=ref["lr"], momentum=0.9)
        graph = GraphBase(model, optimizer, grad_acc_steps=2, device="cpu")
        dp, rank = util.data_parallel_size, util.data_parallel_rank
        losses = []
        for step in range(STEPS):
            batch = {k: v.chunk(dp)[rank] for k, v in make_batch(step).items()}
            losses.append(float(graph(**batch)["lm_loss"]))
        return {
            "losses": losses,
            "loss_diff": max(abs(a - b) for a, b in zip(losses, ref["losses"])),
            "final_diff": max_diff(full_state(model), ref["final"]),
        }

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
