"""Adapter-only checkpoints of LoRA runs, and the identity of their frozen base.

A LoRA run trains its adapters (and ``modules_to_save``) on a frozen base. When that base
was read from files -- a Hugging Face directory (:func:`libai.models.utils.load_huggingface`)
or a libai checkpoint (``train.load_weight``) -- a checkpoint holds the trained parameters
only, with the base's identity: its path and a SHA-256 of its weight files. Loading such a
checkpoint checks the model's base against that identity; a libai-checkpoint base the model
does not hold yet is loaded first, from its path. A base that came from no file (random
initialization) is saved whole, as any model is.

The hash covers the weights only: a Hugging Face directory's weight files, a libai
checkpoint's manifest (which holds a checksum of each of its files; a checkpoint without one,
saved by an older libai, is not recorded as a source, so such a base is saved whole).
"""

from __future__ import annotations

import hashlib
import os

from torch import nn

from libai.checkpoint.manifest import MANIFEST
from libai.models.lora import LORA_ATTR
from libai.models.utils.hf_io import WEIGHTS_SOURCE, CheckpointReader

HUGGINGFACE, CHECKPOINT = "huggingface", "checkpoint"

_hashes: dict[tuple, str] = {}  # (path, files with sizes and mtimes) -> SHA-256


def weights_source(model: nn.Module) -> dict | None:
    """``{"kind", "path"}`` of the files ``model``'s weights were read from, or None."""
    return model.__dict__.get(WEIGHTS_SOURCE)


def is_lora_model(model: nn.Module) -> bool:
    return model.__dict__.get(LORA_ATTR) is not None


def trained_names(model: nn.Module) -> set[str]:
    """The names of the parameters a LoRA run trains (adapters and ``modules_to_save``)."""
    return {n for n, p in model.named_parameters() if p.requires_grad}


def is_lora_name(name: str) -> bool:
    return ".lora." in f".{name}"


def _weight_files(source: dict) -> list[str]:
    if source["kind"] == HUGGINGFACE:
        return sorted(set(CheckpointReader(source["path"]).weight_map.values()))
    return [MANIFEST]  # a checkpoint recorded as a source was verified against it


def fingerprint(source: dict) -> str:
    """SHA-256 of the weight files of ``source`` (cached while the files are unchanged).
    Raises ``OSError`` / the reader's error for a path that no longer holds them."""
    path = source["path"]
    files = _weight_files(source)
    key = (path, tuple((f, *_stat(os.path.join(path, f))) for f in files))
    if key not in _hashes:
        digest = hashlib.sha256()
        for name in files:
            digest.update(name.encode() + b"\0")
            with open(os.path.join(path, name), "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


def _stat(file: str) -> tuple[int, int]:
    st = os.stat(file)
    return st.st_size, st.st_mtime_ns


def describe(identity: dict | None) -> str:
    if identity is None:
        return "weights read from no file (built or initialized in the program)"
    return (
        f"the {identity['kind']} weights at {identity['path']} (sha256 {identity['sha256'][:12]})"
    )
