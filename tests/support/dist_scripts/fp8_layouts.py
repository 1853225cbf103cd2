"""FP8 training on two data-parallel ranks: per layout (fp8 recipe, ZeRO stage or none),
the loss and every gradient of the first step (rank 0's micro-batch is rows 0-1 of the
global batch, rank 1's rows 2-3), the losses of 3 steps, and which Linear layers this rank
runs in float8. The test (tests/distributed/test_fp8.py) compares with one process running
the same two micro-batches."""

from __future__ import annotations

import json

from common import parse_out_dir, run_checks
from fp8_cases import batch_of, build, train

from libai import dist


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run_layout(layout: dict) -> dict:
    dist.setup_dist_util({"data_parallel_size": 2})
    util = dist.get_dist_util()
    dp, rank = util.layout.data_parallel_size, util.data_parallel_rank
    parts, optimizer = build(
        layout["fp8"], zero=layout.get("zero"), dist_cfg={"data_parallel_size": 2}
    )
    model = parts.runner.model
    batch = {k: v.chunk(dp)[rank] for k, v in batch_of(0).items()}
    first_loss = float(parts.runner.forward_backward(batch))
    grads = {n: _full(p.grad).tolist() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.zero_grad(set_to_none=True)
    parts, optimizer = build(
        layout["fp8"], zero=layout.get("zero"), dist_cfg={"data_parallel_size": 2}
    )
    losses = train(parts, optimizer, 3, dp=dp, rank=rank)
    fp8_layers = sorted(
        n for n, m in parts.runner.model.named_modules() if getattr(m, "float8", None) is not None
    )
    params = list(parts.runner.model.parameters())
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
    return {
        "first_loss": first_loss,
        "grads": grads,
        "losses": losses,
        "fp8_layers": fp8_layers,
        "param_share": local / sum(p.numel() for p in params),
    }


def main():
    out_dir, _, rest = parse_out_dir()
    layouts = json.loads(rest[0])
    run_checks(out_dir, lambda: {"layouts": [run_layout(layout) for layout in layouts]})


if __name__ == "__main__":
    main()
