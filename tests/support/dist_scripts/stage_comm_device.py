"""Stage-to-stage messages on a real pp2 launch while the default device is ``meta``: every
tensor the pipe makes (header, receive buffers) must be on the pipe's device, so the tuple
arrives as sent; one made without ``device=`` would be a meta tensor and the send fails."""

from __future__ import annotations

import torch
from common import parse_out_dir, run_checks

from libai import dist
from libai.inference.stage_comm import StagePipe

out_dir, _, _ = parse_out_dir()
SENT = (torch.arange(6.0).view(2, 3), None, torch.tensor([True, False]), torch.tensor(7))


def described(tensors) -> list:
    return [None if t is None else [str(t.dtype), list(t.shape), t.tolist()] for t in tensors]


def checks() -> dict:
    dist.setup_dist_util({"pipeline_parallel_size": 2, "pipeline_num_layers": 2})
    pipe = StagePipe()
    with torch.device("meta"):  # the default device of factory calls without device=
        if pipe.is_first:
            pipe.send(SENT)
            return {"stage": 0, "sent": described(SENT)}
        return {"stage": 1, "received": described(pipe.recv())}


run_checks(out_dir, checks)
