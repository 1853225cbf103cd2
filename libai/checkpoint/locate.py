"""Finding a checkpoint and reading what it holds without loading it: the checkpoint a path
names (a checkpoint directory or a training output directory's ``last_checkpoint``), the
tensors' shapes, the vocabulary size it was trained with. Used by the tools that load a
training checkpoint into one process (ONNX export, align)."""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from libai.checkpoint.checkpointer import read_checkpoint_metadata
from libai.checkpoint.files import read_last_checkpoint


def resolve_checkpoint(path: str | os.PathLike) -> str:
    """A checkpoint directory (with DCP ``.metadata``), or the newest one named by
    ``last_checkpoint`` in a training output directory."""
    path = Path(path)
    if (path / ".metadata").is_file():
        return str(path)
    newest = read_last_checkpoint(str(path))
    if newest is not None and (Path(newest) / ".metadata").is_file():
        return newest
    raise FileNotFoundError(
        f"{path} is neither a libai checkpoint (no .metadata) nor a training output directory "
        "with a last_checkpoint"
    )


def checkpoint_shapes(checkpoint: str) -> dict[str, tuple[int, ...]]:
    """The global shape of every tensor a checkpoint holds, from its metadata (no tensor is
    read)."""
    meta = read_checkpoint_metadata(checkpoint).state_dict_metadata
    return {k: tuple(v.size) for k, v in meta.items() if hasattr(v, "size")}


def checkpoint_vocab_size(model: nn.Module, checkpoint: str, vocab_size: int) -> int | None:
    """The vocabulary size the checkpoint was trained with, where it differs from the config's
    (the trainer sets ``model.cfg.vocab_size`` from the tokenizer, padded for the training's
    tensor-parallel size, after saving ``config.yaml``); None if the shapes agree."""
    shapes = checkpoint_shapes(checkpoint)
    for name, param in model.state_dict().items():
        for key, shape in shapes.items():
            if not (key == name or key.endswith("." + name)) or len(shape) != param.dim():
                continue
            for want, got in zip(shape, param.shape, strict=True):
                if want != got and got == vocab_size:
                    return want
    return None
