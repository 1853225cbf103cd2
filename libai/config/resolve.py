"""Derived training sizes: batch arithmetic and epochs -> iterations (LiBai's rules).

Both functions are pure: they read ``cfg.train`` and return the resolved numbers; write them
back with e.g. ``cfg.train.update(resolve_batch_sizes(cfg.train, dp)._asdict())``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from libai.config.lazy import try_get_key

__all__ = ["BatchSizes", "TrainIters", "resolve_batch_sizes", "resolve_train_iters"]


class BatchSizes(NamedTuple):
    """``global_batch_size = train_micro_batch_size × data parallel × num_accumulation_steps``."""

    train_micro_batch_size: int
    global_batch_size: int
    num_accumulation_steps: int


class TrainIters(NamedTuple):
    train_iter: int
    warmup_iter: int


def _optional_positive_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"train.{name} must be a positive integer or None, got {value!r}")
    return value


def resolve_batch_sizes(train_cfg: Any, data_parallel_size: int) -> BatchSizes:
    """Fill in whichever of micro batch, global batch and accumulation steps is missing.

    ``train_cfg`` is ``cfg.train`` (keys ``train_micro_batch_size``, ``global_batch_size``,
    ``num_accumulation_steps``; ``None`` = derive). Rules, with ``dp = data_parallel_size``:

    - micro and global given: ``acc = global / (micro × dp)``, which must divide exactly; if
      ``acc`` is given too, the three must agree;
    - only micro given: ``acc`` defaults to 1, ``global = micro × dp × acc``;
    - only global given: ``acc`` defaults to 1, ``micro = global / (dp × acc)`` (must divide).

    Raises ``ValueError`` naming the keys on a contradiction, a non-divisible split, or when
    neither micro nor global batch size is set.
    """
    if isinstance(data_parallel_size, bool) or int(data_parallel_size) < 1:
        raise ValueError(f"data parallel size must be a positive integer, got {data_parallel_size}")
    dp = int(data_parallel_size)
    micro = _optional_positive_int(
        "train_micro_batch_size", try_get_key(train_cfg, "train_micro_batch_size")
    )
    glob = _optional_positive_int("global_batch_size", try_get_key(train_cfg, "global_batch_size"))
    acc = _optional_positive_int(
        "num_accumulation_steps", try_get_key(train_cfg, "num_accumulation_steps")
    )

    if micro is None and glob is None:
        raise ValueError("set train.train_micro_batch_size or train.global_batch_size (or both)")
    if micro is not None and glob is not None:
        if acc is None:
            if glob % (micro * dp) != 0:
                raise ValueError(
                    f"train.global_batch_size={glob} is not divisible by "
                    f"train_micro_batch_size {micro} x data parallel {dp} = {micro * dp}, so "
                    "train.num_accumulation_steps cannot be derived"
                )
            acc = glob // (micro * dp)
        elif glob != micro * dp * acc:
            raise ValueError(
                f"train.global_batch_size={glob} != train_micro_batch_size {micro} x "
                f"data parallel {dp} x num_accumulation_steps {acc} = {micro * dp * acc}"
            )
        return BatchSizes(micro, glob, acc)
    acc = 1 if acc is None else acc
    if micro is not None:
        return BatchSizes(micro, micro * dp * acc, acc)
    if glob % (dp * acc) != 0:
        raise ValueError(
            f"train.global_batch_size={glob} is not divisible by data parallel {dp} x "
            f"num_accumulation_steps {acc} = {dp * acc}, so train.train_micro_batch_size "
            "cannot be derived"
        )
    return BatchSizes(glob // (dp * acc), glob, acc)


def resolve_train_iters(
    train_cfg: Any, samples_per_epoch: int | None = None, global_batch_size: int | None = None
) -> TrainIters:
    """Total and warmup iterations from ``train_iter``, ``train_epoch`` and ``warmup_ratio``.

    As LiBai: ``train_iter = max(train.train_iter, ceil(samples_per_epoch × train_epoch /
    global_batch_size))`` and ``warmup_iter = ceil(train_iter × warmup_ratio)``.

    Args:
        train_cfg: ``cfg.train``.
        samples_per_epoch: length of the training set; needed only when ``train_epoch > 0``.
        global_batch_size: samples per optimizer step; defaults to ``train.global_batch_size``
            (resolve it first with :func:`resolve_batch_sizes`).
    """
    train_iter = try_get_key(train_cfg, "train_iter", default=0) or 0
    train_epoch = try_get_key(train_cfg, "train_epoch", default=0) or 0
    warmup_ratio = try_get_key(train_cfg, "warmup_ratio", default=0) or 0
    for name, value in (("train_iter", train_iter), ("train_epoch", train_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"train.{name} must be a non-negative integer, got {value!r}")
    if not 0 <= warmup_ratio < 1:
        raise ValueError(f"train.warmup_ratio must be in [0, 1), got {warmup_ratio!r}")
    if train_epoch > 0:
        if samples_per_epoch is None or samples_per_epoch < 1:
            raise ValueError(
                f"train.train_epoch={train_epoch} needs the training set size, got "
                f"samples_per_epoch={samples_per_epoch!r}"
            )
        if global_batch_size is None:
            global_batch_size = try_get_key(train_cfg, "global_batch_size")
        if not global_batch_size:
            raise ValueError("train.train_epoch > 0 needs train.global_batch_size resolved first")
        train_iter = max(train_iter, math.ceil(samples_per_epoch * train_epoch / global_batch_size))
    if train_iter < 1:
        raise ValueError("set train.train_iter or train.train_epoch to a positive value")
    return TrainIters(train_iter, math.ceil(train_iter * warmup_ratio))
