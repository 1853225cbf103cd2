"""Read checkpoint files as data: nothing in a checkpoint runs code when it is loaded.

A libai checkpoint holds tensors, numbers, strings and containers of them. Python's pickle
can hold much more (any callable, called on load), so every pickled file is read through an
allow-list instead:

- ``rank_N.pt`` and the non-tensor entries of the DCP shards: ``torch.load(weights_only=True)``
  (:func:`torch_load_data`). The numpy array of an RNG state that older libai checkpoints
  stored is allowed as well (an array constructor, nothing else).
- DCP's ``.metadata``: an unpickler that allows only DCP's own metadata classes, torch's
  ``Size`` / dtypes / layouts and ``pathlib`` paths (:func:`read_dcp_metadata`).

A file that asks for anything else raises :class:`UnsafeDataError` naming what it asked for;
a damaged file raises :class:`CorruptDataError`. Neither message suggests loading the file
with ``weights_only=False``.
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import re
from typing import IO, Any

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo

__all__ = [
    "CorruptDataError",
    "DataOnlyFileSystemReader",
    "DataOnlyLoadPlanner",
    "UnsafeDataError",
    "loads_plain_data",
    "read_dcp_metadata",
    "torch_load_data",
]


class UnsafeDataError(ValueError):
    """A file asks to call something that is not data when it is unpickled; ``global_name``
    is what it asked for."""

    def __init__(self, global_name: str, allowed: str):
        super().__init__(f"asks to run {global_name} when read ({allowed})")
        self.global_name, self.allowed = global_name, allowed

    def __reduce__(self):  # DCP sends a rank's exception to the others pickled
        return (type(self), (self.global_name, self.allowed))


class CorruptDataError(ValueError):
    """A file that is not a readable archive or pickle (damaged, truncated, another format)."""


# numpy's RNG state array (MT19937 keys) as older libai checkpoints pickled it: an array
# constructor and the dtype, nothing that can call anything else
_np_core = getattr(np, "_core", None) or np.core  # numpy >= 2 / numpy 1.x
_np_reconstruct = _np_core.multiarray._reconstruct
_NUMPY_ARRAY_GLOBALS = [
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    _np_reconstruct,
    (_np_reconstruct, "numpy.core.multiarray._reconstruct"),  # as numpy 1.x names it
    (_np_reconstruct, "numpy._core.multiarray._reconstruct"),  # as numpy 2 names it
]

# torch names the global in two messages: one not allowed, and one of a blocked module
# (os, posix, nt, sys: the classic ``os.system`` payload)
_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|Trying to load unsupported GLOBAL) ([\w.]+)")


def _wo_failure(exc: BaseException) -> ValueError:
    """A one-line error for a failed weights-only load (torch's text advises
    ``weights_only=False``; ours never does)."""
    text = str(exc)
    found = _GLOBAL.search(text)
    if found:
        return UnsafeDataError(
            found.group(1),
            "checkpoints are data: only tensors, numbers, strings and containers of them load",
        )
    detail = next(
        (
            line.strip()
            for line in text.splitlines()
            if line.strip() and "weights_only" not in line and "Weights only" not in line
        ),
        type(exc).__name__,
    )
    detail = detail.removeprefix("WeightsUnpickler error: ")
    return CorruptDataError(f"is not a readable torch archive ({detail})")


def torch_load_data(file: str | os.PathLike | IO[bytes]) -> Any:
    """``torch.load(file, weights_only=True)`` on the CPU; raises :class:`UnsafeDataError` or
    :class:`CorruptDataError` (one line, without the caller's file name) instead of torch's
    errors."""
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _wo_failure(exc) from None
    except OSError as exc:
        if exc.errno is not None:
            raise  # the file cannot be opened or read: not a property of its contents
        raise _wo_failure(exc) from None
    except Exception as exc:  # damaged archives raise many types (struct.error, ...)
        raise _wo_failure(exc) from None


# ---- DCP metadata ---------------------------------------------------------------------------
def _allowed_metadata_global(module: str, name: str) -> Any | None:
    """The object pickle may look up while reading DCP metadata, else None."""
    if module == dcp_metadata.__name__:
        obj = getattr(dcp_metadata, name, None)
        if isinstance(obj, type) and obj.__module__ == module:  # its dataclasses and enums
            return obj
        return None
    if (module, name) == (_StorageInfo.__module__, "_StorageInfo"):
        return _StorageInfo
    if module == "torch":
        obj = getattr(torch, name, None)
        if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
            return obj
        return None
    if (module, name) == ("torch.serialization", "_get_layout"):
        return torch.serialization._get_layout  # a name -> torch.layout table lookup
    if module == "pathlib" and name in ("Path", "PosixPath", "WindowsPath", "PurePosixPath"):
        return getattr(pathlib, name)
    if (module, name) == ("collections", "OrderedDict"):
        import collections

        return collections.OrderedDict
    return None


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed_metadata_global(module, name)
        if obj is None:
            raise UnsafeDataError(f"{module}.{name}", "only DCP's metadata classes load")
        return obj


def read_dcp_metadata(path: str | os.PathLike) -> dcp_metadata.Metadata:
    """The ``.metadata`` of the DCP checkpoint directory ``path``, read through an allow-list
    (DCP's own reader unpickles it without one)."""
    file = os.path.join(os.fspath(path), ".metadata")
    with open(file, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except UnsafeDataError:
            raise
        except Exception as exc:  # pickle raises many types on damaged data
            raise CorruptDataError(f"is not DCP metadata ({type(exc).__name__}: {exc})") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise CorruptDataError(f"holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class DataOnlyFileSystemReader(FileSystemReader):
    """DCP's file reader with :func:`read_dcp_metadata` for the metadata (tensor shards are
    already read weights-only by DCP)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        metadata = read_dcp_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class DataOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner for a flat state dict whose non-tensor entries are read
    with :func:`torch_load_data` (DCP's own planner uses ``weights_only=False``)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        try:
            obj = torch_load_data(value)
        except UnsafeDataError as exc:
            raise UnsafeDataError(exc.global_name, f"entry {key} of the shards") from None
        except CorruptDataError as exc:
            raise CorruptDataError(f"entry {key} of the shards {exc}") from None
        self.original_state_dict[key] = obj


# ---- plain pickles -----------------------------------------------------------------------------
class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDataError(f"{module}.{name}", "plain data only")


def loads_plain_data(data: bytes) -> Any:
    """Unpickle ``data`` that may hold only builtin values (dicts, lists, tuples, numbers,
    strings, None): what older libai checkpoints stored per optimizer param group."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except UnsafeDataError:
        raise
    except Exception as exc:
        raise CorruptDataError(f"is not a readable pickle ({type(exc).__name__})") from None
