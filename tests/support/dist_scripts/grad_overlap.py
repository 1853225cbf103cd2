"""The dp gradient all-reduce overlapped with backward against the one after backward: the
tiny GPT's parameters after 3 SGD steps (2 micro-batches each, clipped), and buckets must
have gone out while backward was running. The script records the largest difference."""

from __future__ import annotations

import json

from common import parse_out_dir, run_checks
from gpt_reference import STEPS, build_model, full_state, make_batch, make_optimizer, max_diff

from libai import dist
from libai.runtime.grad_overlap import OverlappedGradReducer
from libai.runtime.parallel import ModelRunner


def train(overlap: bool) -> tuple[dict, list[int]]:
    util = dist.get_dist_util()
    dp = util.layout.data_parallel_size
    model = build_model()
    runner = ModelRunner(model, num_microbatches=2, overlap_grad_reduce=overlap)
    if overlap:  # small buckets: several all-reduces, most of them during backward
        runner._grad_reducer = OverlappedGradReducer(
            list(model.parameters()), util.dp_group, dp, bucket_bytes=8192
        )
    optimizer = make_optimizer(model)
    launched = []
    for step in range(STEPS):
        batch = {k: v.chunk(dp)[util.data_parallel_rank] for k, v in make_batch(step).items()}
        runner.train_step(batch, optimizer, max_grad_norm=0.5)
        if overlap:
            launched.append(runner._grad_reducer.launched_in_backward)
    return full_state(model), launched, (len(runner._grad_reducer.buckets) if overlap else 0)


def main():
    out_dir, _, rest = parse_out_dir()
    layouts = json.loads(rest[0])

    def checks():
        results = {}
        for name, dist_cfg in layouts.items():
            dist.setup_dist_util(dict(dist_cfg))
            plain, _, _ = train(False)
            overlapped, launched, buckets = train(True)
            results[name] = {
                "max_diff": max_diff(overlapped, plain)[0],
                "launched_in_backward": launched,
                "buckets": buckets,
            }
        return results

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
