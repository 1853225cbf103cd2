"""Warmup learning-rate schedulers (LiBai's names) and their builder."""

from libai.scheduler.build import build_lr_scheduler
from libai.scheduler.lr_scheduler import (
    WarmupCosineAnnealingLR,
    WarmupCosineLR,
    WarmupExponentialLR,
    WarmupLinearLR,
    WarmupMultiStepLR,
    WarmupPolynomialLR,
    WarmupStepLR,
)

__all__ = [
    "WarmupCosineAnnealingLR",
    "WarmupCosineLR",
    "WarmupExponentialLR",
    "WarmupLinearLR",
    "WarmupMultiStepLR",
    "WarmupPolynomialLR",
    "WarmupStepLR",
    "build_lr_scheduler",
]
