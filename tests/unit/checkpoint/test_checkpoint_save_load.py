"""``Checkpointer.save`` / ``load`` in one process: what lands on disk, what comes back, and
the one-line errors of failed saves (a full disk is simulated at the failing call).

References: hand-written file listings and keys, the weights and optimizer state of the
model that was saved, the exact paths a full-disk message must name.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from libai import dist
from libai.checkpoint import checkpointer as ckpt_mod
from libai.checkpoint.checkpointer import Checkpointer, CheckpointError, PeriodicCheckpointer
from libai.checkpoint.manifest import MANIFEST, file_checksums, manifest_text
from libai.checkpoint.safe_load import read_dcp_metadata, torch_load_data

LOGGER = ckpt_mod.__name__


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})


def toy(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def stepped_adam(model, lr=0.1):
    adam = torch.optim.AdamW(model.parameters(), lr=lr)
    model(torch.ones(1, 3)).square().sum().backward()
    adam.step()
    return adam


def keys_of(path):
    return set(read_dcp_metadata(str(path)).state_dict_metadata)


class Counter:
    def __init__(self, n=0):
        self.n = n

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


class Code:
    """Not data: it would need code to rebuild."""


class CodeState(Counter):
    def state_dict(self):
        return {"n": Code()}


def no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


# ---- what a save writes -------------------------------------------------------------------------
def test_the_files_of_a_save_and_its_rank_file(tmp_path):
    model = toy()
    c = Checkpointer(model, str(tmp_path / "out" / "sub"), optimizer=stepped_adam(model))
    os.makedirs(tmp_path / "out" / "sub" / "ck.tmp")
    (tmp_path / "out" / "sub" / "ck.tmp" / "__5_0.distcp").write_bytes(b"stale")  # killed save
    c.save("ck", iteration=3)
    path = tmp_path / "out" / "sub" / "ck"
    assert sorted(os.listdir(path)) == [
        ".metadata",
        "__0_0.distcp",
        "manifest.json",
        "meta.json",
        "rank_0.pt",
    ]
    state = torch_load_data(path / "rank_0.pt")
    assert set(state) == {
        "format",
        "rank",
        "run_id",
        "layout",
        "extra",
        "checkpointables",
        "sharded",
        "optimizer_empty",
        "tied_weights",
        "lora_base",
        "rng",
    }
    assert state["rank"] == 0 and state["tied_weights"] == {} and state["extra"] == {"iteration": 3}
    assert state["lora_base"] is None  # not a LoRA run: the whole model is saved


@pytest.mark.parametrize("name", ["", "a/b", "x.tmp", "x.old"])
def test_invalid_checkpoint_names(tmp_path, name):
    with pytest.raises(ValueError, match="invalid checkpoint name"):
        Checkpointer(toy(), str(tmp_path)).save(name)


def test_an_optimizer_saved_before_its_first_step_has_no_state_entries(tmp_path):
    model = toy()
    adam = torch.optim.AdamW(model.parameters(), lr=0.1)
    Checkpointer(model, str(tmp_path), optimizer=adam).save("ck")
    keys = keys_of(tmp_path / "ck")
    assert not [k for k in keys if k.startswith("optimizer.state.")]
    assert "optimizer.param_groups.weight" in keys


def test_a_zero_wrapper_saves_its_inner_optimizers_state(tmp_path):
    model = toy()
    inner = stepped_adam(model)
    outer = torch.optim.SGD(model.parameters(), lr=1.0)
    outer.libai_checkpoint_optimizer = inner
    Checkpointer(model, str(tmp_path), optimizer=outer).save("ck")
    assert {"optimizer.state.weight.exp_avg", "optimizer.state.bias.exp_avg_sq"} <= keys_of(
        tmp_path / "ck"
    )


@pytest.mark.parametrize("where", ["extra", "checkpointable"])
def test_state_that_is_not_data_is_refused_naming_the_checkpoint(tmp_path, where):
    final = str(tmp_path / "ck")
    if where == "extra":
        c = Checkpointer(toy(), str(tmp_path))
        with pytest.raises(CheckpointError, match=f"cannot save checkpoint {final}: the extra"):
            c.save("ck", note=Code())
    else:
        c = Checkpointer(toy(), str(tmp_path), counter=CodeState())
        with pytest.raises(CheckpointError, match=f"{final}: checkpointable 'counter'"):
            c.save("ck")
    assert os.listdir(tmp_path) == []  # the partial save is gone


# ---- failed saves -----------------------------------------------------------------------------------
def test_a_save_dir_that_cannot_be_created(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    c = Checkpointer(toy(), str(tmp_path / "file" / "out"))
    with pytest.raises(CheckpointError, match="creating .*ck.tmp failed"):
        c.save("ck")
    monkeypatch.setattr(ckpt_mod, "is_disk_full", lambda exc, directory: True)
    tmp = os.path.join(str(tmp_path / "file" / "out"), "ck.tmp")
    with pytest.raises(CheckpointError) as info:
        c.save("ck")
    assert str(info.value) == (
        f"No space left on device while writing {tmp}; no earlier checkpoint exists."
    )


def failing_write(monkeypatch, suffix):
    real = ckpt_mod._write_text_atomic

    def write(path, text):
        if path.endswith(suffix):
            no_space()
        real(path, text)

    monkeypatch.setattr(ckpt_mod, "_write_text_atomic", write)


@pytest.mark.parametrize("file", ["meta.json", "manifest.json"])
def test_a_full_disk_names_the_file_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, file):
    c = Checkpointer(toy(), str(tmp_path))
    c.save("first")
    failing_write(monkeypatch, file)
    with pytest.raises(CheckpointError) as info:
        c.save("second")
    tmp = tmp_path / "second.tmp"
    assert str(info.value) == (
        f"No space left on device while writing {tmp / file}; the last complete checkpoint "
        f"{tmp_path / 'first'} is intact."
    )
    assert (tmp_path / "last_checkpoint").read_text() == "first\n"
    assert not (tmp_path / "second").exists()
    if file == "meta.json":  # failed before the commit: the partial save is removed
        assert not tmp.exists()


def test_a_failed_checksum_is_one_line_and_removes_the_partial_save(tmp_path, monkeypatch):
    def broken(directory, names):
        raise OSError("read error")

    monkeypatch.setattr(ckpt_mod, "file_checksums", broken)
    with pytest.raises(CheckpointError) as info:
        Checkpointer(toy(), str(tmp_path)).save("ck")
    assert (
        str(info.value) == f"checksumming checkpoint {tmp_path / 'ck'} failed: OSError: read error"
    )
    assert os.listdir(tmp_path) == []


def fake_dcp_save(monkeypatch, shards=(), remove=False, error=None):
    def save(entries, storage_writer):
        tmp = str(storage_writer.path)
        for shard in shards:
            open(os.path.join(tmp, shard), "wb").close()
        if remove:
            shutil.rmtree(tmp)
        raise error or OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(
        ckpt_mod, "dcp", SimpleNamespace(save=save, FileSystemWriter=dcp.FileSystemWriter)
    )


@pytest.mark.parametrize(
    "shards, remove, writing",
    [
        (("__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_2.distcp"), False, "__0_1.distcp"),
        ((), False, ""),
        ((), True, ""),
    ],
)
def test_a_full_disk_in_dcp_names_this_ranks_newest_shard(
    tmp_path, monkeypatch, shards, remove, writing
):
    fake_dcp_save(monkeypatch, shards, remove)
    with pytest.raises(CheckpointError) as info:
        Checkpointer(toy(), str(tmp_path)).save("ck")
    tmp = os.path.join(str(tmp_path), "ck.tmp")
    written = os.path.join(tmp, writing) if writing else tmp
    assert str(info.value).startswith(f"No space left on device while writing {written};")


def test_a_full_disk_writing_the_rank_file_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt_mod, "write_bytes_durable", no_space)
    with pytest.raises(CheckpointError) as info:
        Checkpointer(toy(), str(tmp_path)).save("ck")
    rank_file = tmp_path / "ck.tmp" / "rank_0.pt"
    assert str(info.value).startswith(f"No space left on device while writing {rank_file};")


def test_another_failure_in_dcp_says_the_previous_checkpoint_is_untouched(tmp_path, monkeypatch):
    fake_dcp_save(monkeypatch, error=RuntimeError("boom"))
    with pytest.raises(CheckpointError) as info:
        Checkpointer(toy(), str(tmp_path)).save("ck")
    assert str(info.value) == (
        f"saving checkpoint {tmp_path / 'ck'} (the previous checkpoint and last_checkpoint "
        "are untouched) failed: RuntimeError: boom"
    )


def test_save_failure_without_a_full_disk_is_unchanged(tmp_path, monkeypatch):
    c = Checkpointer(toy(), str(tmp_path))
    error = ValueError("x")
    monkeypatch.setattr(ckpt_mod, "is_disk_full", lambda exc, directory: False)
    assert c._save_failure(error, str(tmp_path / "a.tmp"), "w") is error
    monkeypatch.undo()
    full = c._save_failure(OSError(errno.ENOSPC, "full"), str(tmp_path / "a.tmp"), "/w/x")
    assert str(full) == "No space left on device while writing /w/x; no earlier checkpoint exists."


# ---- files that cannot be removed ---------------------------------------------------------------------
@pytest.fixture
def pinned(monkeypatch):
    """``pinned.add(name)``: unlinking a file named ``name`` fails (as on a read-only mount)."""
    names = set()
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)) in names:
            raise PermissionError(errno.EACCES, "pinned", path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    return names


def test_an_old_copy_that_cannot_be_removed_does_not_fail_the_save(tmp_path, pinned):
    c = Checkpointer(toy(), str(tmp_path))
    c.save("ck")
    pinned.add("rank_0.pt")
    c.save("ck")  # replaces this run's ck: the old copy's removal fails, the save does not
    assert (tmp_path / "ck" / "meta.json").is_file()


def test_a_failed_save_whose_partial_files_cannot_be_removed(tmp_path, pinned, monkeypatch):
    fake_dcp_save(monkeypatch, shards=("__0_0.distcp",), error=RuntimeError("boom"))
    pinned.add("__0_0.distcp")
    with pytest.raises(CheckpointError, match="RuntimeError: boom"):  # not the PermissionError
        Checkpointer(toy(), str(tmp_path)).save("ck")


def test_retention_that_cannot_delete_goes_on(tmp_path, pinned):
    c = Checkpointer(toy(), str(tmp_path))
    periodic = PeriodicCheckpointer(c, period=1, max_to_keep=1)
    pinned.add("rank_0.pt")
    periodic.step(0)
    periodic.step(1)
    assert (tmp_path / "model_0000001").is_dir()


# ---- _clear_tmp and _commit --------------------------------------------------------------------------
def leftover(path, *names):
    os.makedirs(path)
    for name in names:
        (path / name).write_bytes(b"x")


def test_clear_tmp_removes_only_this_runs_old_copy(tmp_path, pinned):
    c = Checkpointer(toy(), str(tmp_path))
    c.save("ck")  # this run's
    leftover(tmp_path / "ck.old", "rank_0.pt", ".metadata")
    pinned.add(".metadata")
    c._clear_tmp(str(tmp_path / "ck.tmp"))  # the failed removal is ignored
    assert not (tmp_path / "ck.old" / "rank_0.pt").exists()
    pinned.discard(".metadata")
    shutil.rmtree(tmp_path / "ck.old")
    for old_files, same_run in [(("rank_0.pt",), False), (("rank_0.pt", "notes.txt"), True)]:
        leftover(tmp_path / "ck.old", *old_files)
        other = Checkpointer(toy(), str(tmp_path))
        if same_run:
            other.run_id = c.run_id
        other._clear_tmp(str(tmp_path / "ck.tmp"))
        assert (tmp_path / "ck.old" / "rank_0.pt").exists()  # another run's, or not ours
        shutil.rmtree(tmp_path / "ck.old")


def test_clear_tmp_warns_once_about_other_unfinished_saves(tmp_path, caplog):
    c = Checkpointer(toy(), str(tmp_path))
    c.save("done")
    leftover(tmp_path / "other.tmp", "rank_0.pt")
    leftover(tmp_path / "ck.tmp", "rank_0.pt")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c._clear_tmp(str(tmp_path / "ck.tmp"))
        c._clear_tmp(str(tmp_path / "ck.tmp"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{tmp_path / 'other.tmp'} is an unfinished save")
    assert not (tmp_path / "ck.tmp").exists() and (tmp_path / "other.tmp").exists()


def test_commit_removes_a_stray_old_copy_and_syncs_the_directory(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(ckpt_mod, "fsync_dir", synced.append)
    c = Checkpointer(toy(), str(tmp_path))
    c.save("ck")
    leftover(tmp_path / "ck.old", "notes.txt")  # not only checkpoint files: _clear_tmp keeps it
    c.save("ck")
    assert sorted(os.listdir(tmp_path)) == ["ck", "last_checkpoint"]
    assert synced == [str(tmp_path)] * 4


# ---- load ---------------------------------------------------------------------------------------
def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_load_prefers_the_checkpoint_over_its_old_copy(tmp_path):
    model = toy(2)
    Checkpointer(model, str(tmp_path)).save("ck")
    Checkpointer(toy(1), str(tmp_path)).save("earlier")
    shutil.copytree(tmp_path / "earlier", tmp_path / "ck.old")  # as if a replace was killed
    fresh = toy(3)
    Checkpointer(fresh, str(tmp_path)).load(str(tmp_path / "ck"), [])
    assert same(weights(fresh), weights(model))


def test_load_restores_the_rng_only_when_asked(tmp_path):
    c = Checkpointer(toy(), str(tmp_path))
    torch.manual_seed(11)
    c.save("ck")
    expected = torch.rand(3)
    torch.manual_seed(12)
    other = torch.rand(3)
    torch.manual_seed(12)
    c.load(str(tmp_path / "ck"), [])
    assert torch.equal(torch.rand(3), other)  # weights only: the RNG went on
    torch.manual_seed(12)
    c.load(str(tmp_path / "ck"), ["rng"])
    assert torch.equal(torch.rand(3), expected)


def test_load_of_unknown_checkpointables(tmp_path):
    c = Checkpointer(toy(), str(tmp_path))
    c.save("ck")
    with pytest.raises(KeyError, match="unknown checkpointables \\['nope'\\]"):
        c.load(str(tmp_path / "ck"), ["nope"])


def test_loading_weights_keeps_this_runs_id_and_a_resume_takes_the_saved_one(tmp_path):
    saver = Checkpointer(toy(), str(tmp_path))
    saver.save("ck")
    loader = Checkpointer(toy(), str(tmp_path))
    own = loader.run_id
    loader.load(str(tmp_path / "ck"), [])
    assert loader.run_id == own
    loader.load(str(tmp_path / "ck"))
    assert loader.run_id == saver.run_id


def test_every_named_checkpointable_is_loaded_after_a_missing_or_sharded_one(tmp_path):
    model = toy()
    adam = stepped_adam(model, lr=0.25)
    Checkpointer(model, str(tmp_path), second=adam, counter=Counter(5)).save("ck")
    model2 = toy(1)
    sgd, adam2, counter = torch.optim.SGD(model2.parameters(), lr=1.0), None, Counter(0)
    adam2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    c = Checkpointer(
        model2, str(tmp_path), first=sgd, second=adam2, extra=Counter(7), counter=counter
    )
    c.load(str(tmp_path / "ck"))  # first and extra are not in the checkpoint: the rest loads
    assert adam2.param_groups[0]["lr"] == 0.25 and counter.n == 5
    assert torch.equal(adam2.state[model2.weight]["exp_avg"], adam.state[model.weight]["exp_avg"])


def test_an_unverified_checkpoint_is_named_in_a_warning(tmp_path, caplog):
    c = Checkpointer(toy(), str(tmp_path))
    c.save("ck")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c.load(str(tmp_path / "ck"), [])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    os.remove(tmp_path / "ck" / "manifest.json")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c.load(str(tmp_path / "ck"), [])
    assert [r for r in caplog.records if "has no manifest.json" in r.getMessage()]


def rewrite_rank_file(path, change):
    state = torch_load_data(path / "rank_0.pt")
    change(state)
    torch.save(state, path / "rank_0.pt")
    os.remove(path / "manifest.json")


def test_a_rank_file_without_a_layout_is_a_reading_error(tmp_path):
    c = Checkpointer(toy(), str(tmp_path))
    c.save("ck")
    rewrite_rank_file(tmp_path / "ck", lambda state: state.pop("layout"))
    with pytest.raises(CheckpointError, match=f"reading checkpoint {tmp_path / 'ck'} failed"):
        c.load(str(tmp_path / "ck"))


def test_an_older_rank_file_without_optimizer_empty_loads_the_state(tmp_path):
    model = toy()
    adam = stepped_adam(model)
    Checkpointer(model, str(tmp_path), optimizer=adam).save("ck")
    rewrite_rank_file(tmp_path / "ck", lambda state: state.__setitem__("optimizer_empty", {}))
    model2 = toy(1)
    adam2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    Checkpointer(model2, str(tmp_path), optimizer=adam2).load(str(tmp_path / "ck"))
    assert torch.equal(adam2.state[model2.weight]["exp_avg"], adam.state[model.weight]["exp_avg"])


def test_hyper_parameters_of_an_unstepped_optimizer_per_group(tmp_path):
    model = toy()
    groups = [{"params": [model.weight], "lr": 0.3}, {"params": [model.bias], "lr": 0.7}]
    Checkpointer(model, str(tmp_path), optimizer=torch.optim.SGD(groups, lr=1.0)).save("ck")
    model2 = toy(1)
    sgd2 = torch.optim.SGD(
        [{"params": [model2.weight], "lr": 9.0}, {"params": [model2.bias], "lr": 9.0}], lr=1.0
    )
    sgd2.param_groups[1]["custom"] = "kept"  # a key the checkpoint does not have
    Checkpointer(model2, str(tmp_path), optimizer=sgd2).load(str(tmp_path / "ck"))
    assert [g["lr"] for g in sgd2.param_groups] == [0.3, 0.7]
    assert sgd2.param_groups[1]["custom"] == "kept" and not sgd2.state


# ---- retention --------------------------------------------------------------------------------------
def run_checkpoint(save_dir, name, run_id):
    os.makedirs(save_dir / name)
    (save_dir / name / ".metadata").touch()
    (save_dir / name / "meta.json").write_text(f'{{"run_id": "{run_id}"}}')


def test_delete_old_deletes_only_this_runs_older_checkpoints(tmp_path):
    c = Checkpointer(toy(), str(tmp_path))
    run_checkpoint(tmp_path, "model_0000000", "other")
    run_checkpoint(tmp_path, "model_0000001", c.run_id)  # the one last_checkpoint names
    run_checkpoint(tmp_path, "model_0000003", c.run_id)
    run_checkpoint(tmp_path, "model_0000004", c.run_id)
    (tmp_path / "last_checkpoint").write_text("model_0000001\n")
    periodic = PeriodicCheckpointer(c, period=1, max_to_keep=1)
    periodic._recent = ["model_0000000", "model_0000001", "model_0000002", "model_0000003"]
    periodic._recent.append("model_0000004")
    periodic._delete_old()
    assert sorted(os.listdir(tmp_path)) == [
        "last_checkpoint",
        "model_0000000",
        "model_0000001",
        "model_0000004",
    ]


def test_this_runs_periodic_checkpoints(tmp_path):
    c = Checkpointer(toy(), str(tmp_path))
    run_checkpoint(tmp_path, "model_0000001", c.run_id)
    run_checkpoint(tmp_path, "model_0000002", "other")
    run_checkpoint(tmp_path, "model_final", c.run_id)
    run_checkpoint(tmp_path, "model_000003", c.run_id)
    assert PeriodicCheckpointer(c, period=1)._this_runs() == ["model_0000001"]


# ---- one rank of two (the other rank's collectives faked) ---------------------------------------
class LastStage(nn.Module):
    """The last pipeline stage: the tied copy of an embedding that lives on stage 0."""

    def __init__(self):
        super().__init__()
        self.head = nn.Parameter(torch.ones(2, 3))
        self.norm = nn.Parameter(torch.ones(3))
        self.checkpoint_tied_weights = {"head": "embed"}


def test_the_last_stage_does_not_save_the_tied_copy(tmp_path):
    Checkpointer(LastStage(), str(tmp_path)).save("ck")
    assert {k for k in keys_of(tmp_path / "ck") if k.startswith("model.")} == {"model.norm"}


class PeerAgrees:
    """``torch.distributed`` for the checkpointer on a rank of 2 whose peer never fails."""

    def is_initialized(self):
        return True

    def get_world_size(self):
        return 2

    def all_gather_object(self, out, obj):
        out[0], out[1] = None, obj


@pytest.fixture
def rank_of_two(monkeypatch):
    def play(rank):
        monkeypatch.setattr(ckpt_mod, "torch_dist", PeerAgrees())
        monkeypatch.setattr(dist, "get_rank", lambda: rank)
        monkeypatch.setattr(dist, "get_world_size", lambda: 2)

    return play


def change_harmlessly(path, file):
    """Change one byte of ``file`` so that it still reads (only its checksum tells)."""
    if file == "n.txt":
        (path / file).write_text("abc")
        names = sorted(n for n in os.listdir(path) if n != MANIFEST)
        (path / MANIFEST).write_text(manifest_text(file_checksums(str(path), names)))
        (path / file).write_text("abd")
        return
    data = (path / file).read_bytes()
    if file == ".metadata":  # a hex digit of the save id
        old = read_dcp_metadata(str(path)).storage_meta.save_id.encode()
    elif file == "meta.json":  # a hex digit of the run id
        old = torch_load_data(path / "rank_0.pt")["run_id"].encode()
    else:  # a byte in the middle of the tensor data
        i = len(data) // 2
        (path / file).write_bytes(data[:i] + bytes([data[i] ^ 1]) + data[i + 1 :])
        return
    assert data.count(old) == 1
    (path / file).write_bytes(data.replace(old, bytes([old[0] ^ 1]) + old[1:]))


def saved_on_one(tmp_path, change=None):
    model = toy(1)
    Checkpointer(model, str(tmp_path)).save("ck", iteration=3)
    path = tmp_path / "ck"
    if change is not None:
        change(path)
    return path, weights(model)


@pytest.mark.parametrize(
    "rank, file, checked",
    [(0, "n.txt", False), (0, "meta.json", True), (1, ".metadata", False)],
)
def test_each_rank_checksums_its_share(tmp_path, rank_of_two, rank, file, checked):
    """Files by name: .metadata, __0_0.distcp, meta.json, n.txt (a file the manifest lists
    that loading never reads), rank_0.pt; rank r of 2 checks every second one from the r-th."""
    path, _ = saved_on_one(tmp_path, lambda path: change_harmlessly(path, file))
    rank_of_two(rank)
    c = Checkpointer(toy(2), str(tmp_path))
    if checked:
        with pytest.raises(CheckpointError, match=file):
            c.load(str(path))
    else:
        assert c.load(str(path)) == {"iteration": 3}  # another layout: rank 0's state


def test_a_rank_on_the_saved_layout_reads_its_own_rank_file(tmp_path, rank_of_two):
    def two_ranks(path):  # as if saved by 2 ranks: rank 1's file with its own extra
        for rank, iteration in [(0, 3), (1, 99)]:
            state = torch_load_data(path / "rank_0.pt")
            state["layout"]["world_size"] = 2
            state["rank"], state["extra"] = rank, {"iteration": iteration}
            torch.save(state, path / f"rank_{rank}.pt")
        os.remove(path / "manifest.json")

    path, saved = saved_on_one(tmp_path, two_ranks)
    rank_of_two(1)
    model = toy(2)
    assert Checkpointer(model, str(tmp_path)).load(str(path)) == {"iteration": 99}
    assert same(weights(model), saved)
