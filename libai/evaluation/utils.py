"""Helpers shared by evaluators: cross-rank reduction and result formatting."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
import torch.distributed as torch_dist

from libai import dist

__all__ = ["all_reduce_over_data_parallel", "flatten_results_dict", "print_csv_format"]

logger = logging.getLogger(__name__)


def all_reduce_over_data_parallel(values: torch.Tensor) -> torch.Tensor:
    """Sum ``values`` (counts, loss sums) over the data-parallel and pipeline groups.

    * dp: each data-parallel rank evaluated its own share of the batches;
    * pp: only the last pipeline stage processes outputs, the other stages contribute
      zeros, so after this sum every rank holds the totals (equal results everywhere);
    * tp: not reduced -- tensor-parallel peers saw the same batch and hold the same numbers.

    A single process (or no process group) runs no collective. Returns a new tensor on the
    input's device.
    """
    values = values.detach().clone()
    if not torch_dist.is_initialized() or torch_dist.get_world_size() == 1:
        return values
    util = dist.get_dist_util()
    device = values.device
    reduced = values.to(util.device)
    for group in (util.pp_group, util.dp_group):
        if group is not None:
            torch_dist.all_reduce(reduced, group=group)
    return reduced.to(device)


def print_csv_format(results: Mapping) -> None:
    """Log the metrics in a copy-pastable ``copypaste:`` form (detectron2 / LiBai).

    Args:
        results: ``task -> {metric: score}`` or ``metric -> score``.
    """
    if not isinstance(results, Mapping):
        raise TypeError(f"results must be a mapping, got {type(results).__name__}")
    flat = {k: v for k, v in results.items() if not isinstance(v, Mapping)}
    if flat:
        logger.info("copypaste: " + ",".join(flat))
        logger.info("copypaste: " + ",".join(_fmt(v) for v in flat.values()))
    for task, res in results.items():
        if isinstance(res, Mapping):
            important = [(k, v) for k, v in res.items() if "-" not in k]
            logger.info(f"copypaste: Task: {task}")
            logger.info("copypaste: " + ",".join(k for k, _ in important))
            logger.info("copypaste: " + ",".join(_fmt(v) for _, v in important))


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)


def flatten_results_dict(results: Mapping) -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``: a nested dict of scalars made flat."""
    flat = {}
    for key, value in results.items():
        if isinstance(value, Mapping):
            for sub_key, sub_value in flatten_results_dict(value).items():
                flat[f"{key}/{sub_key}"] = sub_value
        else:
            flat[key] = value
    return flat
