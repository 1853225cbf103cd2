"""The dp gradient all-reduce overlapped with backward against the one after backward: the
tiny GPT's parameters after 3 SGD steps (2 micro-batches each, clipped), and buckets must
have gone out while backward was running: with small buckets, and with the reducer the
runner builds itself (one bucket of its default size). The script records the largest
differences."""

from __future__ import annotations

import json

from common import parse_out_dir, run_checks
from gpt_reference import STEPS, build_model, full_state, make_batch, make_optimizer, max_diff

from libai import dist
from libai.runtime.grad_overlap import OverlappedGradReducer
from libai.runtime.parallel import ModelRunner


def train(overlap: bool, small_buckets: bool = True) -> tuple[dict, list[int], int]:
    """``(state, buckets launched in backward per step, bucket count)``; the launches are
    ``None`` for a step after which the runner had no reducer."""
    util = dist.get_dist_util()
    dp = util.layout.data_parallel_size
    model = build_model()
    runner = ModelRunner(model, num_microbatches=2, overlap_grad_reduce=overlap)
    if overlap and small_buckets:  # several all-reduces, most of them during backward
        runner.grads.reducer = OverlappedGradReducer(
            list(model.parameters()), util.dp_group, dp, bucket_bytes=8192
        )
    optimizer = make_optimizer(model)
    launched = []
    for step in range(STEPS):
        batch = {k: v.chunk(dp)[util.data_parallel_rank] for k, v in make_batch(step).items()}
        runner.train_step(batch, optimizer, max_grad_norm=0.5)
        reducer = runner.grads.reducer
        launched.append(None if reducer is None else reducer.launched_in_backward)
    reducer = runner.grads.reducer
    return full_state(model), launched, (0 if reducer is None else len(reducer.buckets))


def main():
    out_dir, _, rest = parse_out_dir()
    layouts = json.loads(rest[0])

    def checks():
        results = {}
        for name, dist_cfg in layouts.items():
            dist.setup_dist_util(dict(dist_cfg))
            plain, plain_launched, _ = train(False)
            overlapped, launched, buckets = train(True)
            default, default_launched, default_buckets = train(True, small_buckets=False)
            results[name] = {
                "max_diff": max_diff(overlapped, plain)[0],
                "launched_in_backward": launched,
                "buckets": buckets,
                "plain_launched": plain_launched,
                "default_max_diff": max_diff(default, plain)[0],
                "default_launched": default_launched,
                "default_buckets": default_buckets,
            }
        return results

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
