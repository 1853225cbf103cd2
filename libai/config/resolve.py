"""Derived training sizes: batch arithmetic and epochs -> iterations (LiBai's rules).

Both functions are pure: they read ``cfg.train`` and return the resolved numbers; write them
back with e.g. ``cfg.train.update(resolve_batch_sizes(cfg.train, dp)._asdict())``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from libai.config.lazy import try_get_key

__all__ = [
    "BatchNames",
    "BatchSizes",
    "TrainIters",
    "batch_sizes",
    "resolve_batch_sizes",
    "resolve_train_iters",
]


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


class BatchNames(NamedTuple):
    """A door's names for the three batch sizes, for its error messages: ``sep`` joins a
    name to its value (``train.global_batch_size=8``, ``--global-batch-size 8``);
    ``accumulation`` is None where the door has no such setting (it is always derived)."""

    micro: str
    glob: str
    accumulation: str | None
    sep: str = "="


#: LiBai's ``train`` keys
LIBAI_BATCH_NAMES = BatchNames(
    "train.train_micro_batch_size", "train.global_batch_size", "train.num_accumulation_steps"
)


def batch_sizes(
    micro: int | None,
    glob: int | None,
    accumulation: int | None,
    data_parallel_size: int,
    names: BatchNames = LIBAI_BATCH_NAMES,
) -> BatchSizes:
    """The one batch rule of every door: ``global = micro x data-parallel ranks x
    accumulation``, filling in whichever is missing (``None``); the sizes given are
    positive integers.

    - micro and global given: ``accumulation = global / (micro x dp)``, which must divide
      exactly; a given accumulation must agree;
    - only micro given: accumulation defaults to 1, ``global = micro x dp x accumulation``;
    - only global given: accumulation defaults to 1, ``micro = global / (dp x accumulation)``
      (must divide).

    Raises ``ValueError`` naming the door's settings (``names``) on a contradiction, a split
    that does not divide, or when neither micro nor global is set.
    """
    dp, (m, g, a, sep) = int(data_parallel_size), names
    if micro is None and glob is None:
        raise ValueError(f"set {m} or {g} (or both)")
    if micro is not None and glob is not None:
        if glob % (micro * dp):
            derived = f", so {a} cannot be derived" if a and accumulation is None else ""
            raise ValueError(
                f"{g}{sep}{glob} is not divisible by {m} {micro} x {dp} data-parallel ranks "
                f"= {micro * dp}{derived}"
            )
        steps = glob // (micro * dp)
        if accumulation is not None and accumulation != steps:
            raise ValueError(
                f"{a}{sep}{accumulation} contradicts the batch sizes: {g} {glob} / ({m} "
                f"{micro} x {dp} data-parallel ranks) = {steps} micro-batches per step; leave "
                f"{a} unset (it is derived) or change {m}"
            )
        return BatchSizes(micro, glob, steps)
    accumulation = 1 if accumulation is None else accumulation
    if micro is not None:
        return BatchSizes(micro, micro * dp * accumulation, accumulation)
    if glob % (dp * accumulation):
        steps = f" x {a} {accumulation}" if a else ""
        raise ValueError(
            f"{g}{sep}{glob} is not divisible by {dp} data-parallel ranks{steps} = "
            f"{dp * accumulation}, so {m} cannot be derived"
        )
    return BatchSizes(glob // (dp * accumulation), glob, accumulation)


def resolve_batch_sizes(train_cfg: Any, data_parallel_size: int) -> BatchSizes:
    """LiBai's ``train`` batch sizes (keys ``train_micro_batch_size``, ``global_batch_size``,
    ``num_accumulation_steps``; ``None`` = derive) by :func:`batch_sizes`'s rule."""
    if isinstance(data_parallel_size, bool) or int(data_parallel_size) < 1:
        raise ValueError(f"data parallel size must be a positive integer, got {data_parallel_size}")
    sizes = [
        _optional_positive_int(key, try_get_key(train_cfg, key))
        for key in ("train_micro_batch_size", "global_batch_size", "num_accumulation_steps")
    ]
    return batch_sizes(*sizes, int(data_parallel_size))


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
