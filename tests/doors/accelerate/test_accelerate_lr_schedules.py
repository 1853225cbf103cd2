"""Rapidformer's LR flags through the black box (``--lr-decay-style``, ``--lr-warmup-iters``
/ ``--lr-warmup-fraction``, ``--lr-decay-iters``, ``--min-lr``): the LR metrics.json records
at every step equals Megatron's annealing formula, written out here (≤1e-12): a linear
warmup from 0 reaching ``--lr`` at its last step, then linear or cosine decay to
``--min-lr`` at ``--lr-decay-iters``, held after it."""

from __future__ import annotations

import math

import pytest
from accelerate_helpers import task_argv
from train_net_helpers import read_metrics

from libai import dist
from libai.accelerate import cli

STEPS, LR = 12, 3e-3


def megatron_lr(step, style, warmup, decay, min_lr):
    if warmup > 0 and step <= warmup:
        return LR * step / warmup
    if style == "constant":
        return LR
    if step > decay:
        return min_lr
    ratio = (step - warmup) / (decay - warmup)
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return min_lr + coeff * (LR - min_lr)


@pytest.mark.parametrize(
    "style, warmup_flags, warmup, decay, min_lr",
    [
        ("cosine", ["--lr-warmup-iters", "3"], 3, 12, 3e-4),
        ("linear", ["--lr-warmup-fraction", "0.2"], 2, 8, 1e-4),  # ceil(0.2 x 8) = 2
        ("constant", ["--lr-warmup-iters", "4"], 4, 12, 0.0),
    ],
)
def test_black_box_lr_equals_megatrons_formula(
    accelerate_files, tmp_path, style, warmup_flags, warmup, decay, min_lr
):
    flags = ["--lr-decay-style", style, *warmup_flags, "--min-lr", str(min_lr)]
    if decay != STEPS:
        flags += ["--lr-decay-iters", str(decay)]
    argv = task_argv(accelerate_files, "sequence_classification", tmp_path, *flags, steps=STEPS)
    dist.setup_dist_util({})
    assert cli.main(argv) == 0
    metrics = read_metrics(tmp_path)
    got = [metrics[t]["lr"] for t in range(STEPS)]
    want = [megatron_lr(t, style, warmup, decay, min_lr) for t in range(STEPS)]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-12, (got, want)
