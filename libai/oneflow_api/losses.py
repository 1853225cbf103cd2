"""Cross entropy for LiBai project code: OneFlow's mean over the *global* batch.

In OneFlow a project's ``flow._C.cross_entropy(logits, target, ignore_index=0)`` on a batch
split over data-parallel ranks is the mean over every rank's counted targets. Here each rank
holds its share as a plain tensor and the runtime averages the ranks' losses (and
gradients) over the data x context-parallel ranks, so a rank's mean over its own targets
would weigh a token by how many its rank counted. :func:`cross_entropy` returns instead
``local sum * ranks / global count`` (the count summed over those ranks, no gradient), whose
average over the ranks is OneFlow's global mean: the same loss and gradients as one process.
On one process (or without a mesh) it is ``F.cross_entropy``.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn

from libai import dist

__all__ = ["CrossEntropyLoss", "cross_entropy"]


def cross_entropy(
    input: torch.Tensor,  # noqa: A002 (torch's name)
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``F.cross_entropy`` whose ``"mean"`` is over the global batch (module doc)."""
    util = dist.current_dist_util()
    group, ranks = (util.grad_group, util.grad_size) if util is not None else (None, 1)
    if reduction != "mean" or ranks == 1 or size_average is not None or reduce is not None:
        return F.cross_entropy(
            input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing
        )
    per_target = F.cross_entropy(
        input,
        target,
        weight,
        ignore_index=ignore_index,
        reduction="none",
        label_smoothing=label_smoothing,
    )
    counted = (target != ignore_index).to(per_target.dtype)
    if weight is not None:  # torch's weighted mean divides by the targets' weights
        counted = counted * weight[target.clamp(min=0)].to(per_target.dtype)
    count = counted.sum().detach()
    torch_dist.all_reduce(count, group=group)  # every rank's counted targets
    return per_target.sum() * ranks / count


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """``nn.CrossEntropyLoss`` computing :func:`cross_entropy` (the global mean)."""

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )
