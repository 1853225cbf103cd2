"""``libai.checkpoint.safe_load``: the allow-lists and the one-line errors, case by case.

The references are hand-written: the globals a DCP ``.metadata`` may name, the message a
failed weights-only load becomes, what ``torch.load`` would do without our arguments.
"""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo

from libai.checkpoint import safe_load
from libai.checkpoint.safe_load import (
    CorruptDataError,
    DataOnlyFileSystemReader,
    UnsafeDataError,
    torch_load_data,
)

DCP = dcp_metadata.__name__


# ---- _allowed_metadata_global ---------------------------------------------------------------
@pytest.mark.parametrize(
    "module, name, expected",
    [
        (DCP, "Metadata", dcp_metadata.Metadata),
        (DCP, "TensorStorageMetadata", dcp_metadata.TensorStorageMetadata),
        (DCP, "Enum", None),  # a class imported there, not its own
        (DCP, "no_such_name", None),
        (_StorageInfo.__module__, "_StorageInfo", _StorageInfo),
        ("torch", "Size", torch.Size),
        ("torch", "float16", torch.float16),
        ("torch", "strided", torch.strided),
        ("torch", "contiguous_format", torch.contiguous_format),
        ("torch", "load", None),
        ("torch", "no_such_name", None),
        ("pathlib", "Path", pathlib.Path),
        ("pathlib", "PosixPath", pathlib.PosixPath),
        ("pathlib", "WindowsPath", pathlib.WindowsPath),
        ("pathlib", "PurePosixPath", pathlib.PurePosixPath),
        ("pathlib", "PureWindowsPath", None),
        ("os", "PosixPath", None),  # a path class's name in another module
        ("collections", "OrderedDict", collections.OrderedDict),
        ("collections", "Counter", None),
        ("builtins", "OrderedDict", None),
    ],
)
def test_the_metadata_allow_list(module, name, expected):
    assert safe_load._allowed_metadata_global(module, name) is expected


# ---- _wo_failure ----------------------------------------------------------------------------
def test_a_forbidden_global_is_named_with_what_loads():
    err = safe_load._wo_failure(
        pickle.UnpicklingError(
            "Weights only load failed.\nUnsupported global: GLOBAL os.system was not an "
            "allowed global by default."
        )
    )
    assert isinstance(err, UnsafeDataError) and err.global_name == "os.system"
    assert str(err) == (
        "asks to run os.system when read (checkpoints are data: only tensors, numbers, "
        "strings and containers of them load)"
    )


def test_a_global_of_a_blocked_module_is_named_too():
    """torch words it differently for os / posix / nt / sys (the ``os.system`` payload)."""
    err = safe_load._wo_failure(
        pickle.UnpicklingError(
            "Weights only load failed.\nTrying to load unsupported GLOBAL posix.system whose "
            "module posix is blocked."
        )
    )
    assert isinstance(err, UnsafeDataError) and err.global_name == "posix.system"


def test_a_damaged_archive_keeps_only_torchs_detail():
    text = (
        "\n"
        "Weights only load failed. This file can still be loaded.\n"
        "Re-running `torch.load` with `weights_only` set to `False` will likely succeed.\n"
        "   \n"
        "WeightsUnpickler error: Unsupported operand 149\n"
        "Check the documentation of torch.load to learn more."
    )
    err = safe_load._wo_failure(pickle.UnpicklingError(text))
    assert type(err) is CorruptDataError
    assert str(err) == "is not a readable torch archive (Unsupported operand 149)"


@pytest.mark.parametrize("text", ["", "Weights only load failed\nuse weights_only=False"])
def test_without_a_detail_the_exception_type_is_named(text):
    err = safe_load._wo_failure(EOFError(text))
    assert type(err) is CorruptDataError
    assert str(err) == "is not a readable torch archive (EOFError)"


# ---- torch_load_data ------------------------------------------------------------------------
class Payload:
    def __reduce__(self):
        return (os.getpid, ())


def test_data_only_even_when_the_environment_asks_for_full_pickles(monkeypatch):
    buffer = io.BytesIO()
    torch.save({"x": Payload()}, buffer)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    buffer.seek(0)
    with pytest.raises(UnsafeDataError, match="getpid"):
        torch_load_data(buffer)


def test_a_file_that_cannot_be_read_is_not_called_corrupt(tmp_path):
    with pytest.raises(FileNotFoundError):
        torch_load_data(tmp_path / "missing.pt")


def test_tensors_saved_on_a_gpu_load_on_the_cpu():
    """An archive whose storage says ``cuda:0`` (what a GPU run writes) loads on the CPU."""
    tensor = torch.arange(4.0)
    ptr = tensor.untyped_storage().data_ptr()

    def tagger(storage):
        return "cuda:0" if storage.data_ptr() == ptr else None

    registry = torch.serialization._package_registry
    before = list(registry)
    torch.serialization.register_package(0, tagger, lambda obj, location: None)
    try:
        buffer = io.BytesIO()
        torch.save({"t": tensor}, buffer)
    finally:
        registry[:] = before
    assert b"cuda:0" in buffer.getvalue()
    buffer.seek(0)
    loaded = torch_load_data(buffer)["t"]
    assert loaded.device.type == "cpu" and torch.equal(loaded, tensor)


# ---- DataOnlyFileSystemReader.read_metadata ---------------------------------------------------
def saved(tmp_path, storage_meta="keep"):
    path = tmp_path / "ckpt"
    dcp.save({"a": torch.arange(3.0)}, checkpoint_id=str(path), no_dist=True)
    metadata = pickle.loads((path / ".metadata").read_bytes())  # our own file
    if storage_meta != "keep":
        metadata.storage_meta = storage_meta
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    return path, metadata


def test_read_metadata_keeps_the_saved_storage_meta_and_sets_the_load_id(tmp_path):
    path, written = saved(tmp_path)
    reader = DataOnlyFileSystemReader(str(path))
    metadata = reader.read_metadata()
    assert reader.load_id is not None
    assert metadata.storage_meta.load_id == reader.load_id
    assert metadata.storage_meta.save_id == written.storage_meta.save_id is not None
    assert metadata.storage_meta.checkpoint_id == written.storage_meta.checkpoint_id


def test_read_metadata_without_storage_meta(tmp_path):
    path, _ = saved(tmp_path, storage_meta=None)
    reader = DataOnlyFileSystemReader(str(path))
    metadata = reader.read_metadata()
    assert isinstance(metadata.storage_meta, dcp_metadata.StorageMeta)
    assert metadata.storage_meta.load_id == reader.load_id
    assert metadata.storage_meta.save_id is None  # a fresh one
