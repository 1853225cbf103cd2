"""Sharded checkpoints (torch.distributed.checkpoint) and their safety, by concern:
``checkpointer`` (Checkpointer: save / load / resume on any layout, PeriodicCheckpointer),
``view`` (the state a checkpoint holds: layout-free names, tied weights), ``files`` (rank
files, atomic writes, retention, CheckpointError), ``manifest`` (per-file checksums) and
``safe_load`` (reading pickles as data only: loading never runs code).

``libai.utils.checkpoint`` (LiBai's path) stays importable as an alias of ``checkpointer``.
"""

from libai.checkpoint.checkpointer import (
    Checkpointer,
    CheckpointError,
    PeriodicCheckpointer,
    read_checkpoint_metadata,
)

__all__ = ["CheckpointError", "Checkpointer", "PeriodicCheckpointer", "read_checkpoint_metadata"]
