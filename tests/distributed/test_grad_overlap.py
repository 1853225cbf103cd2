"""The dp gradient all-reduce overlapped with backward gives the gradients of the all-reduce
after backward (dp4, dp2 x tp2; gradient accumulation), with buckets launched while backward
runs.

The sums are element-wise over the same values. With 2 data ranks a sum of two is exact in
any order, so the result is bitwise equal. With 4, the collective's reduction order depends
on the buffer it is given (the buckets differ), so the result agrees to fp32 rounding; SGD
keeps that rounding from being amplified (see gpt_reference.adam_param_tol).
"""

from __future__ import annotations

import json

from gpt_reference import GRAD_TOL
from launch import torchrun


def test_overlapped_reduce_equals_the_reduce_after_backward():
    layouts = {
        "dp4": {"data_parallel_size": 4},
        "dp2xtp2": {"data_parallel_size": 2, "tensor_parallel_size": 2},
    }
    results = torchrun("grad_overlap.py", 4, json.dumps(layouts))
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
        for name, item in r.items():
            if name == "ok":
                continue
            for key in ("max_diff", "default_max_diff"):
                if name == "dp2xtp2":
                    assert item[key] == 0.0, (rank, name, key, item)
                else:
                    assert item[key] <= GRAD_TOL, (rank, name, key, item)
            # several buckets, all but possibly the last launched inside backward
            assert item["buckets"] > 2, item
            assert all(n >= item["buckets"] - 1 for n in item["launched_in_backward"]), item
            # the runner's own reducer (overlap_grad_reduce's default): the tiny model fits
            # its one bucket, launched inside backward at every step; none without overlap
            assert item["default_buckets"] == 1, item
            steps = len(item["launched_in_backward"])
            assert item["default_launched"] == [1] * steps, item
            assert item["plain_launched"] == [None] * steps, item
