"""``libai.checkpoint.files`` / ``manifest`` / ``locate`` / ``messages``: one function at a time.

The references are hand-written: the exceptions a chain holds, the one-line text of an error,
the name a kept-aside checkpoint gets, the manifest's exact text, the grouped key lines of
a partial load, the vocabulary size a checkpoint was trained with.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
import xxhash
from locales import ascii_locale
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex

from libai import dist
from libai.checkpoint import files, locate, manifest, messages
from libai.checkpoint.checkpointer import Checkpointer
from libai.checkpoint.files import CheckpointError


# ---- describing failures --------------------------------------------------------------------
def chained(outer, cause=None, context=None):
    outer.__cause__, outer.__context__ = cause, context
    return outer


def test_exception_chain_visits_causes_contexts_and_rank_failures_once():
    shared = KeyError("shared")
    a = chained(ValueError("a"), cause=shared, context=shared)  # raise a from shared, in except
    assert list(files.exception_chain(a)) == [a, shared]
    b, c = OSError("b"), TypeError("c")
    d = chained(RuntimeError("d"), cause=b, context=c)
    assert {id(e) for e in files.exception_chain(d)} == {id(d), id(b), id(c)}
    e = chained(RuntimeError("e"), cause=b)  # no context: None is skipped, not the end
    assert list(files.exception_chain(e)) == [e, b]
    r0, r1 = ValueError("rank 0"), OSError("rank 1")
    dcp_exc = CheckpointException("boom", {0: (r0, None), 1: r1})
    assert {id(x) for x in files.exception_chain(dcp_exc)} == {id(dcp_exc), id(r0), id(r1)}


def test_one_line():
    assert files.one_line(ValueError("\n  first line  \nsecond")) == "ValueError: first line"
    assert files.one_line(ValueError()) == "ValueError"
    assert files.one_line(KeyError("   \n")) == "KeyError: '   \\n'"
    inner = OSError("disk gone\ntraceback ...")
    assert files.one_line(CheckpointException("x", {0: (inner, None)})) == "OSError: disk gone"
    empty = CheckpointException("x", {})
    assert files.one_line(empty) == "CheckpointException: CheckpointException ranks:dict_keys([])"


def fake_disk(monkeypatch, free=None, error=False):
    def disk_usage(directory):
        if error:
            raise FileNotFoundError(directory)
        return SimpleNamespace(total=1 << 40, used=0, free=free)

    monkeypatch.setattr(files, "shutil", SimpleNamespace(disk_usage=disk_usage))


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        RuntimeError("[enforce fail at inline_container.cc] No space left on device"),
        chained(RuntimeError("save failed"), cause=OSError(errno.ENOSPC, "full")),
    ],
)
def test_a_full_disk_is_recognised_from_the_error(exc, monkeypatch):
    fake_disk(monkeypatch, free=1 << 30)
    assert files.is_disk_full(exc, "/ckpt")


@pytest.mark.parametrize(
    "free, full", [((1 << 20) - 1, True), (1 << 20, False), (3 << 19, False), (1 << 30, False)]
)
def test_a_short_write_is_a_full_disk_below_one_mib_free(free, full, monkeypatch):
    fake_disk(monkeypatch, free=free)
    assert files.is_disk_full(RuntimeError("PytorchStreamWriter failed writing file"), "/c") is full


def test_an_unknown_file_system_is_not_full(monkeypatch):
    fake_disk(monkeypatch, error=True)
    assert files.is_disk_full(RuntimeError("write failed"), "/nowhere") is False


def test_fallback_hint_names_the_newest_metadata(tmp_path):
    for name, metadata_time, dir_time in [("a", 300, 100), ("b", 200, 400), ("me", 500, 500)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / ".metadata").touch()
        os.utime(tmp_path / name / ".metadata", (metadata_time, metadata_time))
        os.utime(tmp_path / name, (dir_time, dir_time))
    (tmp_path / "c.old").mkdir()
    (tmp_path / "c.old" / ".metadata").touch()
    hint = files.fallback_hint(str(tmp_path / "me"))
    assert hint == f"; fall back to {tmp_path / 'a'}, the newest other one"


# ---- the directory ----------------------------------------------------------------------------
def test_read_last_checkpoint(tmp_path):
    assert files.read_last_checkpoint(str(tmp_path)) is None
    (tmp_path / "last_checkpoint").write_text("  \n")
    assert files.read_last_checkpoint(str(tmp_path)) is None
    (tmp_path / "last_checkpoint").write_text("model_0000009\n")
    assert files.read_last_checkpoint(str(tmp_path)) == str(tmp_path / "model_0000009")


def test_is_our_leftover(tmp_path):
    assert files.is_our_leftover(str(tmp_path / "missing.tmp")) is False
    (tmp_path / "x.tmp").mkdir()
    (tmp_path / "x.tmp" / "__0_0.distcp").touch()
    (tmp_path / "x.tmp" / "rank_1.pt").touch()
    assert files.is_our_leftover(str(tmp_path / "x.tmp")) is True
    (tmp_path / "x.tmp" / "notes.txt").touch()
    assert files.is_our_leftover(str(tmp_path / "x.tmp")) is False


@pytest.mark.parametrize(
    "meta, run_id",
    [
        ({"run_id": "r-\u00e9t\u00e9"}, "r-\u00e9t\u00e9"),
        ({"run_id": 5}, None),
        ({"other": "x"}, None),
        (["run_id"], None),
        (None, None),
    ],
)
def test_run_id_of(tmp_path, meta, run_id):
    if meta is not None:
        (tmp_path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    assert files.run_id_of(str(tmp_path)) == run_id


def test_aside_path_counts_up_from_2(tmp_path):
    ckpt = tmp_path / "model_0000099"
    ckpt.mkdir()
    base = f"{ckpt}.earlier-run"
    assert files.aside_path(str(ckpt)) == base
    os.mkdir(base)
    assert files.aside_path(str(ckpt)) == f"{base}-2"
    os.mkdir(f"{base}-2")
    assert files.aside_path(str(ckpt)) == f"{base}-3"
    (ckpt / "meta.json").write_text(json.dumps({"run_id": "abc"}))
    assert files.aside_path(str(ckpt)) == f"{ckpt}.run-abc"


@pytest.mark.skipif(sys.flags.utf8_mode, reason="UTF-8 mode: every locale reads UTF-8")
def test_text_files_are_utf8_in_any_locale(tmp_path):
    name = "mod\u00e8le_final"
    with ascii_locale():
        files.write_text_atomic(str(tmp_path / "last_checkpoint"), name + "\n")
        (tmp_path / "meta.json").write_bytes(
            json.dumps({"run_id": name}, ensure_ascii=False).encode()
        )
        assert files.run_id_of(str(tmp_path)) == name
        body = {"format": "libai-manifest-1", "algorithm": "xxh3_64"}
        body["files"] = {name: {"size": 1, "xxh3_64": "0a"}}
        (tmp_path / "manifest.json").write_bytes(json.dumps(body, ensure_ascii=False).encode())
        assert list(manifest.read_manifest(str(tmp_path))) == [name]
        os.remove(tmp_path / "manifest.json")
    assert (tmp_path / "last_checkpoint").read_bytes() == (name + "\n").encode("utf-8")
    assert sorted(os.listdir(tmp_path)) == ["last_checkpoint", "meta.json"]  # no temporary left


def test_fsync_dir_syncs_the_directory_it_names(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    files.fsync_dir(str(tmp_path))
    monkeypatch.chdir(tmp_path / "..")
    files.fsync_dir("")
    files.fsync_dir(str(tmp_path / "missing"))  # nothing to sync, no error
    assert synced == [str(tmp_path), str(tmp_path.parent)]


# ---- validation before loading ------------------------------------------------------------------
@pytest.fixture
def checkpoint(tmp_path):
    dist.setup_dist_util({})
    torch.manual_seed(0)
    Checkpointer(nn.Linear(2, 2), str(tmp_path)).save("ckpt")
    path = tmp_path / "ckpt"
    # the manifest's files, sorted: .metadata, __0_0.distcp, meta.json, rank_0.pt
    assert sorted(manifest.read_manifest(str(path))) == [
        ".metadata",
        "__0_0.distcp",
        "meta.json",
        "rank_0.pt",
    ]
    return path


def change_harmlessly(path, file):
    """Change one byte of ``file`` so that it still reads (only its checksum tells)."""
    data = (path / file).read_bytes()
    if file == ".metadata":  # a hex digit of the save id
        old = files.read_dcp_metadata(str(path)).storage_meta.save_id.encode()
    elif file == "meta.json":
        old = files.run_id_of(str(path)).encode()
    else:  # a byte in the middle of the tensor data
        i = len(data) // 2
        (path / file).write_bytes(data[:i] + bytes([data[i] ^ 1]) + data[i + 1 :])
        return
    new = bytes([old[0] ^ 1]) + old[1:]
    assert data.count(old) == 1
    (path / file).write_bytes(data.replace(old, new))


@pytest.mark.parametrize("file", [".metadata", "__0_0.distcp", "meta.json", "rank_0.pt"])
def test_one_process_checks_every_files_checksum(checkpoint, file):
    change_harmlessly(checkpoint, file)
    with pytest.raises(CheckpointError, match=file):
        files.check_checkpoint(str(checkpoint))


@pytest.mark.parametrize(
    "file, mine",
    [(".metadata", False), ("meta.json", False), ("__0_0.distcp", True), ("rank_0.pt", True)],
)
def test_rank_1_of_2_checks_every_second_file(checkpoint, file, mine):
    change_harmlessly(checkpoint, file)
    if mine:
        with pytest.raises(CheckpointError, match=file):
            files.check_checkpoint(str(checkpoint), rank=1, world_size=2)
    else:
        rank0, verified = files.check_checkpoint(str(checkpoint), rank=1, world_size=2)
        assert verified is True and rank0["layout"]["world_size"] == 1


@pytest.mark.parametrize("state", [{"format": "libai-dcp-0", "layout": {}}, ["format"]])
def test_a_rank_file_of_another_format_is_refused(checkpoint, state):
    torch.save(state, checkpoint / "rank_0.pt")
    os.remove(checkpoint / "manifest.json")
    with pytest.raises(CheckpointError, match="rank_0.pt is not a libai checkpoint file"):
        files.check_checkpoint(str(checkpoint))


def test_verified_says_whether_a_manifest_was_checked(checkpoint):
    assert files.check_checkpoint(str(checkpoint))[1] is True
    os.remove(checkpoint / "manifest.json")
    assert files.check_checkpoint(str(checkpoint))[1] is False


def rewrite_storage(path, change):
    metadata = files.read_dcp_metadata(str(path))
    metadata.storage_data = change(metadata.storage_data)
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    os.remove(path / "manifest.json")  # an older checkpoint: the metadata is all there is


def test_a_truncated_shard_is_found_from_the_metadata_alone(checkpoint):
    """weight at [0, 1577), bias at [1577, 3154) of __0_0.distcp; listed bias first."""
    rewrite_storage(checkpoint, lambda storage: dict(reversed(list(storage.items()))))
    shard = checkpoint / "__0_0.distcp"
    ends = sorted(
        i.offset + i.length for i in files.read_dcp_metadata(str(checkpoint)).storage_data.values()
    )
    assert os.path.getsize(shard) == ends[-1] > ends[0] > 0
    files.check_checkpoint(str(checkpoint))
    os.truncate(shard, ends[-1] - 1)
    with pytest.raises(CheckpointError, match="truncated"):
        files.check_checkpoint(str(checkpoint))


def test_an_empty_shard_file_may_hold_empty_entries(checkpoint):
    def add_empty(storage):
        index = MetadataIndex("model.empty", torch.Size([0]), 0)
        return {**storage, index: _StorageInfo("__9_0.distcp", 0, 0)}

    rewrite_storage(checkpoint, add_empty)
    (checkpoint / "__9_0.distcp").touch()
    files.check_checkpoint(str(checkpoint))
    os.remove(checkpoint / "__9_0.distcp")
    with pytest.raises(CheckpointError, match="__9_0.distcp"):
        files.check_checkpoint(str(checkpoint))


# ---- manifest ----------------------------------------------------------------------------------
def test_manifest_text_is_indented_json_sorted_by_name():
    text = manifest.manifest_text(
        {"b": {"size": 2, "xxh3_64": "0f"}, "a": {"size": 1, "xxh3_64": "e"}}
    )
    assert text == (
        '{\n "format": "libai-manifest-1",\n "algorithm": "xxh3_64",\n "files": {\n'
        '  "a": {\n   "size": 1,\n   "xxh3_64": "e"\n  },\n'
        '  "b": {\n   "size": 2,\n   "xxh3_64": "0f"\n  }\n }\n}\n'
    )


def test_file_checksum_is_xxh3_of_the_bytes_without_warnings(tmp_path):
    data = bytes(range(256)) * 1000
    (tmp_path / "f").write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert manifest.file_checksum(str(tmp_path / "f")) == xxhash.xxh3_64(data).hexdigest()


@pytest.mark.parametrize(
    "body",
    [
        {"format": "libai-manifest-0", "algorithm": "xxh3_64", "files": {}},
        {"format": "libai-manifest-1", "algorithm": "md5", "files": {}},
        {"format": "libai-manifest-1", "algorithm": "xxh3_64", "files": {"a": {"size": 1}}},
    ],
)
def test_a_manifest_of_another_format_is_refused(tmp_path, body):
    (tmp_path / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(manifest.ManifestError, match="manifest.json"):
        manifest.read_manifest(str(tmp_path))


# ---- locate -------------------------------------------------------------------------------------
def test_resolve_checkpoint(tmp_path):
    (tmp_path / "model_0000003").mkdir()
    (tmp_path / "model_0000003" / ".metadata").touch()
    assert locate.resolve_checkpoint(tmp_path / "model_0000003") == str(tmp_path / "model_0000003")
    (tmp_path / "last_checkpoint").write_text("model_0000003\n")
    assert locate.resolve_checkpoint(tmp_path) == str(tmp_path / "model_0000003")
    (tmp_path / "last_checkpoint").write_text("model_0000005\n")  # not there (any more)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        locate.resolve_checkpoint(tmp_path)


def test_checkpoint_shapes_and_the_trained_vocab_size(tmp_path):
    state = {
        "model.other": torch.zeros(7, 4),  # no parameter of the model has this name
        "model.a.weight": torch.zeros(3, 12),  # a dim equal to the vocab size, unchanged
        "model.emb.weight": torch.zeros(10, 4),  # trained with 10, the config now says 12
        "model.count": 5,
    }
    dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    shapes = locate.checkpoint_shapes(str(tmp_path))
    assert shapes == {"model.other": (7, 4), "model.a.weight": (3, 12), "model.emb.weight": (10, 4)}
    assert list(shapes)[0] == "model.other"
    model = nn.Module()
    model.a = nn.Linear(12, 3, bias=False)
    model.emb = nn.Embedding(12, 4)
    assert locate.checkpoint_vocab_size(model, str(tmp_path), 12) == 10
    same = nn.Module()
    same.a = nn.Linear(12, 3, bias=False)
    assert locate.checkpoint_vocab_size(same, str(tmp_path), 12) is None


# ---- messages -----------------------------------------------------------------------------------
KEYS = ["enc.layers.3.weight", "top", "b.x", "enc.layers.3.bias", "u.v.w", "enc.norm.weight"]


def test_group_keys():
    assert messages.group_keys(KEYS) == [
        "b.x",
        "enc.layers.3.{bias, weight}",
        "enc.norm.weight",
        "top",
        "u.v.w",
    ]
    assert messages.group_keys(["y", "x"]) == ["{x, y}"]
    assert messages.group_keys([]) == []


def test_partial_load_messages():
    assert messages.get_missing_parameters_message(["a.w", "a.b", "c"]) == (
        "Some model parameters or buffers are not found in the checkpoint:\n  a.{b, w}\n  c"
    )
    assert messages.get_unexpected_parameters_message(["z", "a.w"]) == (
        "The checkpoint state_dict contains keys that are not used by the model:\n  a.w\n  z"
    )
