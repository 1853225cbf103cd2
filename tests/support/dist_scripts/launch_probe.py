"""What a rank sees of its launch: the job's environment, its argv, path, working directory,
thread count and random draws, and a gloo collective over the group (with
``LAUNCH_PROBE_FAIL``, rank 1 raises or hangs instead)."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch
import torch.distributed as torch_dist
from common import parse_out_dir, run_checks

out_dir, _, rest = parse_out_dir()
ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")


def checks() -> dict:
    from libai import dist

    dist.setup_dist_util({})
    fail = os.environ.get("LAUNCH_PROBE_FAIL")
    if fail and torch_dist.get_rank() == 1:
        if fail == "hang":
            import time

            time.sleep(600)
        raise RuntimeError("rank 1 fails on purpose")
    total = torch.tensor([float(torch_dist.get_rank() + 1)])
    torch_dist.all_reduce(total)
    return {
        "env": {k: os.environ.get(k) for k in ENV},
        "job_variable": os.environ.get("LAUNCH_PROBE"),
        "argv": sys.argv[1:],
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "main": __name__,
        "threads": torch.get_num_threads(),
        "python_random": random.random(),
        "numpy_random": float(np.random.rand()),
        "torch_random": float(torch.rand(1)),
        "sum": float(total),
        "rest": rest,
    }


if __name__ == "__main__":
    run_checks(out_dir, checks)
