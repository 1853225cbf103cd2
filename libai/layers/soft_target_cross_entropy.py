"""Cross entropy against soft targets (timm's / flowvision's ``SoftTargetCrossEntropy``),
the loss for Mixup / CutMix / label-smoothed targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SoftTargetCrossEntropy"]


class SoftTargetCrossEntropy(nn.Module):
    """``mean_b( sum_c -target[b, c] * log_softmax(logits)[b, c] )``.

    ``target`` is ``[B, C]`` class probabilities (e.g. from :class:`~libai.data.mixup.Mixup`),
    or ``[B]`` class ids, taken as one-hot (so the same loss also scores an evaluation
    batch, whose labels are not mixed).
    """

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        log_probs = F.log_softmax(logits, dim=-1)
        if target.dim() == logits.dim() - 1 and not target.is_floating_point():
            return F.nll_loss(log_probs, target)
        return torch.sum(-target * log_probs, dim=-1).mean()
