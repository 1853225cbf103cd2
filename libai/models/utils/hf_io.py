"""Reading and writing Hugging Face checkpoint directories.

:class:`CheckpointReader` opens ``model.safetensors``, sharded safetensors with
``model.safetensors.index.json``, or ``pytorch_model.bin`` (also sharded with its index), and
reads whole tensors or row/column ranges of them. Safetensors ranges come from
``safe_open(...).get_slice``, so a rank reads only the bytes of its shard; ``.bin`` files are
memory-mapped by ``torch.load(mmap=True)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import torch
from safetensors import SafetensorError, safe_open

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_WEIGHTS = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
CONFIG = "config.json"
#: the model attribute naming the files its weights were read from: ``{"kind", "path"}``
#: (the identity of a LoRA run's base, :mod:`libai.checkpoint.lora_base`)
WEIGHTS_SOURCE = "libai_weights_source"


def record_weights_source(model, kind: str, path: str) -> None:
    """Note that ``model``'s weights were read from ``path`` (``kind``: "huggingface" or
    "checkpoint")."""
    model.__dict__[WEIGHTS_SOURCE] = {"kind": kind, "path": os.path.abspath(path)}


class CheckpointError(ValueError):
    """A Hugging Face directory that cannot be loaded (missing/corrupt files or keys)."""


def read_hf_config(path: str) -> dict:
    """``config.json`` of a Hugging Face model directory."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path!r} is not a directory (expected a Hugging Face model dir)")
    file = os.path.join(path, CONFIG)
    if not os.path.isfile(file):
        raise CheckpointError(f"{path!r} has no {CONFIG}; is it a Hugging Face model directory?")
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file} is not valid JSON: {exc}") from exc


def _weight_map(path: str, index_name: str) -> dict[str, str]:
    index_file = os.path.join(path, index_name)
    try:
        with open(index_file, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError) as exc:
        raise CheckpointError(f"{index_file} is not a valid index ({exc})") from exc
    missing = sorted({f for f in weight_map.values() if not os.path.isfile(os.path.join(path, f))})
    if missing:
        raise CheckpointError(
            f"{index_file} names shard file(s) that do not exist in {path}: {missing}"
        )
    return weight_map


class CheckpointReader:
    """Lazy access to the tensors of a Hugging Face model directory."""

    def __init__(self, path: str):
        self.path = path
        self._safe: dict[str, object] = {}  # file -> safe_open handle
        self._bin: dict[str, dict[str, torch.Tensor]] = {}  # file -> mmapped state dict
        if os.path.isfile(os.path.join(path, SAFE_INDEX)):
            self.weight_map = _weight_map(path, SAFE_INDEX)
        elif os.path.isfile(os.path.join(path, SAFE_WEIGHTS)):
            self.weight_map = {k: SAFE_WEIGHTS for k in self._keys_of(SAFE_WEIGHTS)}
        elif os.path.isfile(os.path.join(path, BIN_INDEX)):
            self.weight_map = _weight_map(path, BIN_INDEX)
        elif os.path.isfile(os.path.join(path, BIN_WEIGHTS)):
            self.weight_map = {k: BIN_WEIGHTS for k in self._bin_file(BIN_WEIGHTS)}
        else:
            raise CheckpointError(
                f"no weights in {path}: expected {SAFE_WEIGHTS}, {SAFE_INDEX}, {BIN_WEIGHTS} "
                f"or {BIN_INDEX}"
            )

    # ---- files ------------------------------------------------------------------------------
    def _safe_file(self, file: str):
        if file not in self._safe:
            full = os.path.join(self.path, file)
            try:
                self._safe[file] = safe_open(full, framework="pt")
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(
                    f"cannot read {full}: corrupt safetensors file ({exc})"
                ) from exc
        return self._safe[file]

    def _keys_of(self, file: str) -> list[str]:
        return list(self._safe_file(file).keys())

    def _bin_file(self, file: str) -> dict[str, torch.Tensor]:
        if file not in self._bin:
            full = os.path.join(self.path, file)
            try:
                self._bin[file] = torch.load(full, map_location="cpu", mmap=True, weights_only=True)
            except Exception as exc:  # torch raises several types for bad pickles / zips
                raise CheckpointError(f"cannot read {full}: {type(exc).__name__}: {exc}") from exc
        return self._bin[file]

    # ---- tensors ----------------------------------------------------------------------------
    def keys(self) -> Iterable[str]:
        return self.weight_map.keys()

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def _file(self, name: str) -> str:
        if name not in self.weight_map:
            raise CheckpointError(f"tensor {name!r} is not in the checkpoint {self.path}")
        return self.weight_map[name]

    def shape(self, name: str) -> tuple[int, ...]:
        file = self._file(name)
        if file.endswith(".safetensors"):
            try:
                return tuple(self._safe_file(file).get_slice(name).get_shape())
            except SafetensorError as exc:
                raise CheckpointError(f"{name!r} missing from shard {file} ({exc})") from exc
        return tuple(self._bin_file(file)[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.read(name, 0, 0, 0).dtype if self.shape(name) else self.read(name).dtype

    def read(
        self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """The tensor ``name``, or its indices ``[start, stop)`` along ``dim`` (a copy)."""
        file = self._file(name)
        if file.endswith(".safetensors"):
            handle = self._safe_file(file)
            if dim is None:
                return handle.get_tensor(name)
            index = (slice(None),) * dim + (slice(start, stop),)
            return handle.get_slice(name)[index]
        t = self._bin_file(file)[name]
        if dim is not None:
            t = t.narrow(dim, start, (t.shape[dim] if stop is None else stop) - start)
        return t.clone()
