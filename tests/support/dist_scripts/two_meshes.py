"""Two GPTs on two meshes of one process group, trained side by side (4 ranks).

Model A is built on a tp2 x dp2 mesh and model B on a dp4 mesh of the same four processes.
Each model's runner is made, and each step run, while the *other* model's mesh is the
current one: a layer, loss or runner reading the current mesh instead of the one its model
was built on would use the other model's groups and sizes. For each model: the initial weights, the loss of every
step, every gradient of the first step, the clipped global norm and the parameters after the
last step equal the single-process run (``gpt_reference``), and each rank holds its share.
"""

from __future__ import annotations

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

MESHES = {"tp2xdp2": {"tensor_parallel_size": 2, "data_parallel_size": 2}, "dp4": {}}


class Run:
    """One model on its own mesh: the runner, optimizer and what it measured."""

    def __init__(self, name: str, dist_cfg: dict):
        self.name = name
        self.util = dist.setup_dist_util(dist_cfg)  # current until the next setup
        self.model = build_model()
        self.init = full_state(self.model)
        self.losses, self.norms, self.grads = [], [], None

    def prepare(self) -> None:
        """The runner (pipeline-free here: gradient sync, clipping) and the optimizer."""
        self.runner = ModelRunner(self.model)
        self.optimizer = make_optimizer(self.model)

    def step(self, step: int) -> None:
        dp, rank = self.util.data_parallel_size, self.util.data_parallel_rank
        batch = {k: v.chunk(dp)[rank] for k, v in make_batch(step).items()}
        self.losses.append(float(self.runner.forward_backward(batch)))
        if step == 0:
            self.grads = full_state(self.model, with_grads=True)
        self.norms.append(float(self.runner.clip_grad_norm_(MAX_GRAD_NORM)))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def held_fraction(self) -> dict[str, float]:
        """Each parameter's local numel over its full numel on this rank."""
        out = {}
        for name, p in self.model.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            out[name] = local.numel() / p.numel()
        return out

    def tp_sharded(self) -> list[str]:
        return [
            name
            for name, p in self.model.named_parameters()
            if isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements)
        ]

    def report(self, ref: dict) -> dict:
        fractions = self.held_fraction()
        return {
            "init_diff": max_diff(self.init, ref["init"])[0],
            "loss_diff": max(abs(a - b) for a, b in zip(self.losses, ref["losses"])),
            "grad_diff": max_diff(self.grads, ref["grads"]),
            "norm_diff": max(abs(a - b) for a, b in zip(self.norms, ref["grad_norms"])),
            "final_diff": max_diff(full_state(self.model), ref["final"]),
            "tp_sharded": self.tp_sharded(),
            "fractions": fractions,
            "mesh_of_is_own": dist.mesh_of(self.model) is self.util,
            "data_parallel_size": self.util.data_parallel_size,
            "tensor_parallel_size": self.util.tensor_parallel_size,
        }


def main():
    out_dir, _, rest = parse_out_dir()
    ref = torch.load(rest[0])

    def checks():
        a = Run("tp2xdp2", MESHES["tp2xdp2"])
        b = Run("dp4", MESHES["dp4"])
        with dist.use_dist_util(b.util):
            a.prepare()
        with dist.use_dist_util(a.util):
            b.prepare()
        for step in range(STEPS):
            with dist.use_dist_util(b.util):  # A runs while B's mesh is current
                a.step(step)
            with dist.use_dist_util(a.util):  # and B while A's is
                b.step(step)
        return {"tp2xdp2": a.report(ref), "dp4": b.report(ref)}

    run_checks(out_dir, checks)


if __name__ == "__main__":
    assert GRAD_TOL > 0
    main()
