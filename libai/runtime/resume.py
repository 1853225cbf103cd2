"""Resuming a run, for every front door: which checkpoint a path names, loading it, and the
point the run continues from (the iteration after the saved one, the samples consumed)."""

from __future__ import annotations

import logging
from typing import NamedTuple

from libai.checkpoint.files import read_last_checkpoint

logger = logging.getLogger(__name__)


class ResumePoint(NamedTuple):
    start_iter: int
    consumed_train_samples: int


def resume_point(extra: dict) -> ResumePoint | None:
    """Where a run continues after loading a checkpoint whose extra state is ``extra``;
    ``None`` when it records no iteration (weights only)."""
    if "iteration" not in extra:
        return None
    point = ResumePoint(int(extra["iteration"]) + 1, int(extra.get("consumed_train_samples", 0)))
    logger.info("Resumed at iteration %d (%d samples consumed)", *point)
    return point


def checkpoint_in(path: str) -> str:
    """``path`` itself, or, for a training output directory, the checkpoint its
    ``last_checkpoint`` names (``path`` when that names none)."""
    return read_last_checkpoint(path) or path


def load_to_resume(checkpointer, path: str, *, resume: bool = True) -> ResumePoint | None:
    """Load ``path`` (a checkpoint, or a directory whose ``last_checkpoint`` names one) with
    ``checkpointer``: with ``resume`` everything it holds (optimizer, LR schedule, loss
    scaler, RNG, data position) and the point to continue from; otherwise the weights only
    (``None``). Checkpoints reshard: any layout loads any other's."""
    extra = checkpointer.load(checkpoint_in(path), None if resume else [])
    return resume_point(extra) if resume else None
