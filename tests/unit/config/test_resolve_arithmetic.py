"""Batch and iteration arithmetic at its edges, against LiBai's formulas written out here:
``global = micro x dp x acc`` (ints, exact division) and
``train_iter = max(train_iter, ceil(samples x epochs / global))``,
``warmup_iter = ceil(train_iter x warmup_ratio)``."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from libai.config import resolve_batch_sizes, resolve_train_iters


def _batch(**kwargs):
    return OmegaConf.create(kwargs)


@pytest.mark.parametrize(
    "micro, glob, acc, dp",
    [
        (3, 18, None, 2),  # acc derived: 18 / (3 x 2) = 3
        (None, 30, 5, 3),  # micro derived: 30 / (3 x 5) = 2
        (None, 12, None, 4),  # micro derived, acc 1: 12 / 4 = 3
        (5, None, 2, 3),  # global derived: 5 x 3 x 2 = 30
    ],
)
def test_derived_sizes_are_ints_of_the_formula(micro, glob, acc, dp):
    sizes = resolve_batch_sizes(
        _batch(train_micro_batch_size=micro, global_batch_size=glob, num_accumulation_steps=acc),
        dp,
    )
    acc_ = acc if acc is not None else (glob // (micro * dp) if micro and glob else 1)
    micro_ = micro if micro is not None else glob // (dp * acc_)
    assert tuple(sizes) == (micro_, micro_ * dp * acc_, acc_)
    assert all(type(v) is int for v in sizes)  # an int, not 3.0: it sizes tensors and loops


@pytest.mark.parametrize("key", ["train_micro_batch_size", "global_batch_size"])
@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_a_batch_size_that_is_not_a_positive_int_is_named(key, bad):
    other = "global_batch_size" if key == "train_micro_batch_size" else "train_micro_batch_size"
    cfg = _batch(**{key: bad, other: 4, "num_accumulation_steps": None})
    with pytest.raises(ValueError) as info:
        resolve_batch_sizes(cfg, 1)
    assert str(info.value) == f"train.{key} must be a positive integer or None, got {bad!r}"


@pytest.mark.parametrize("dp", [0, -1, True])
def test_the_data_parallel_size_must_be_a_positive_int(dp):
    with pytest.raises(ValueError, match="data parallel size must be a positive integer"):
        resolve_batch_sizes(_batch(train_micro_batch_size=4), dp)


def _iters(**kwargs):
    return OmegaConf.create(kwargs)


def test_absent_keys_mean_zero():
    # no train_epoch: iterations only; no warmup_ratio: no warmup
    assert tuple(resolve_train_iters(_iters(train_iter=10))) == (10, 0)
    # no train_iter: the epochs alone set it (ceil(7 x 1 / 2) = 4)
    t = _iters(train_epoch=1, warmup_ratio=0.5, global_batch_size=2)
    assert tuple(resolve_train_iters(t, samples_per_epoch=7)) == (4, 2)
    # neither: nothing to train
    with pytest.raises(ValueError, match="train_iter or train.train_epoch"):
        resolve_train_iters(_iters(warmup_ratio=0.5))


@pytest.mark.parametrize(
    "train_iter, epoch, samples, gbs, ratio",
    [
        (5, 1, 100, 8, 0.3),  # one epoch counts: ceil(100 / 8) = 13 > 5
        (1, 3, 1, 2, 0.0),  # one sample per epoch: ceil(3 / 2) = 2
        (1, 0, None, None, 0.5),  # a single iteration is a valid run; warmup ceil(0.5) = 1
        (9, 2, 3, 4, 0.25),  # train_iter wins: ceil(6 / 4) = 2 < 9
    ],
)
def test_train_iters_equal_the_formula(train_iter, epoch, samples, gbs, ratio):
    t = _iters(train_iter=train_iter, train_epoch=epoch, warmup_ratio=ratio, global_batch_size=gbs)
    total = train_iter if epoch == 0 else max(train_iter, math.ceil(samples * epoch / gbs))
    assert tuple(resolve_train_iters(t, samples_per_epoch=samples)) == (
        total,
        math.ceil(total * ratio),
    )


@pytest.mark.parametrize("key", ["train_iter", "train_epoch"])
@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_iterations_and_epochs_must_be_non_negative_ints(key, bad):
    t = _iters(train_iter=3, train_epoch=0, global_batch_size=2)
    t[key] = bad
    with pytest.raises(ValueError) as info:
        resolve_train_iters(t, samples_per_epoch=4)
    assert str(info.value) == f"train.{key} must be a non-negative integer, got {bad!r}"


def test_an_epoch_needs_at_least_one_sample():
    t = _iters(train_iter=0, train_epoch=1, global_batch_size=2)
    with pytest.raises(ValueError, match="samples_per_epoch=0"):
        resolve_train_iters(t, samples_per_epoch=0)
