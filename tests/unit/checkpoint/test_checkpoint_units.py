"""``libai.checkpoint.checkpointer`` piece by piece, in one process.

The collectives are played on rank 1 of a world of 2 with the other rank's answers written
in the test (``OtherRank``); the files a save writes (``meta.json``, the RNG state of
``rank_N.pt``) are compared with hand-written contents; retention with the names that must
survive.
"""

from __future__ import annotations

import json
import logging
import os
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from libai import dist
from libai.checkpoint import checkpointer as ckpt_mod
from libai.checkpoint.checkpointer import Checkpointer, CheckpointError, PeriodicCheckpointer


class OtherRank:
    """``torch.distributed`` seen from rank 1 of 2: rank 0 contributes ``gathered`` to an
    all-gather and ``broadcast`` to a broadcast from rank 0."""

    def __init__(self, gathered=None, broadcast=None):
        self.gathered, self.broadcast = gathered, broadcast
        self.sent = []

    def is_initialized(self):
        return True

    def get_world_size(self):
        return 2

    def all_gather_object(self, out, obj):
        assert out == [None, None]
        self.sent.append(obj)
        out[0], out[1] = self.gathered, obj

    def broadcast_object_list(self, box, src=None):
        assert src == 0 and len(box) == 1
        self.sent.append(box[0])
        box[0] = self.broadcast


@pytest.fixture
def rank1(monkeypatch):
    def play(**kwargs):
        fake = OtherRank(**kwargs)
        monkeypatch.setattr(ckpt_mod, "torch_dist", fake)
        return fake

    return play


class NoProcessGroup:
    def is_initialized(self):
        return False

    def get_world_size(self):
        raise RuntimeError("no process group")


# ---- collectives ------------------------------------------------------------------------------
def test_world(rank1, monkeypatch):
    rank1()
    assert ckpt_mod._world() == 2
    monkeypatch.setattr(ckpt_mod, "torch_dist", NoProcessGroup())
    assert ckpt_mod._world() == 1


def test_all_gather_and_from_rank0(rank1, monkeypatch):
    fake = rank1(gathered={"rank": 0}, broadcast="rank 0's")
    assert ckpt_mod._all_gather({"rank": 1}) == [{"rank": 0}, {"rank": 1}]
    assert ckpt_mod._from_rank0("mine") == "rank 0's"
    assert fake.sent == [{"rank": 1}, "mine"]
    monkeypatch.setattr(ckpt_mod, "torch_dist", NoProcessGroup())
    assert ckpt_mod._all_gather("x") == ["x"]
    assert ckpt_mod._from_rank0("x") == "x"


def test_agree_raises_the_first_failure_on_every_rank(rank1):
    fake = rank1(gathered="reading checkpoint /c failed: OSError: gone")
    with pytest.raises(CheckpointError) as info:
        ckpt_mod._agree(None, "reading checkpoint /c")
    assert str(info.value) == "reading checkpoint /c failed: OSError: gone (on rank(s) [0])"
    assert fake.sent == [None]


def test_agree_sends_this_ranks_failure_in_one_line(rank1):
    fake = rank1(gathered=None)
    error = ValueError("bad value\nmore")
    with pytest.raises(CheckpointError) as info:
        ckpt_mod._agree(error, "saving x")
    assert fake.sent == ["saving x failed: ValueError: bad value"]
    assert str(info.value) == "saving x failed: ValueError: bad value (on rank(s) [1])"
    assert info.value.__cause__ is error
    # a CheckpointError is already the message: sent as it is, raised itself on this rank
    fake = rank1(gathered="other")
    own = CheckpointError("checkpoint /c is corrupt")
    with pytest.raises(CheckpointError) as info:
        ckpt_mod._agree(own, "reading")
    assert info.value is own and fake.sent == ["checkpoint /c is corrupt"]
    rank1(gathered=None)
    ckpt_mod._agree(None, "nothing failed")


def test_agree_on_one_process_has_no_rank_suffix(monkeypatch):
    monkeypatch.setattr(ckpt_mod, "torch_dist", NoProcessGroup())
    with pytest.raises(CheckpointError) as info:
        ckpt_mod._agree(OSError("disk"), "writing y")
    assert str(info.value) == "writing y failed: OSError: disk"


def test_layout_signature():
    layout = SimpleNamespace(
        pipeline_parallel_size=2,
        data_parallel_size=3,
        tensor_parallel_size=5,
        virtual_pipeline_size=7,
        layer_stage_ids=(0, 0, 1),
    )
    with dist.use_dist_util(SimpleNamespace(layout=layout)):
        assert ckpt_mod._layout_signature() == {
            "world_size": dist.get_world_size(),
            "pipeline_parallel_size": 2,
            "data_parallel_size": 3,
            "tensor_parallel_size": 5,
            "virtual_pipeline_size": 7,
            "layer_stage_ids": [0, 0, 1],
        }


# ---- RNG --------------------------------------------------------------------------------------
def test_rng_state_stores_numpys_keys_as_int64():
    np.random.seed(1234)
    keys = np.random.get_state()[1]
    state = ckpt_mod._rng_state()
    assert state["numpy"]["keys"].dtype == torch.int64
    assert torch.equal(state["numpy"]["keys"], torch.from_numpy(keys.astype(np.int64)))


def test_a_gpu_runs_rng_state_restores_on_a_cpu():
    if torch.cuda.is_available():
        pytest.skip("a CPU-only check")
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    state = {**ckpt_mod._rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)]}
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(6)
    ckpt_mod._set_rng_state(state)  # the CUDA states are skipped here
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


# ---- Checkpointer bookkeeping -----------------------------------------------------------------
class StateOnly:
    def state_dict(self):
        return {}


def test_checkpointables_need_state_dict_and_load_state_dict():
    with pytest.raises(TypeError, match="'sched'"):
        Checkpointer(nn.Linear(1, 1), "/x", sched=StateOnly())


def test_checkpointer_defaults(tmp_path):
    c = Checkpointer(nn.Linear(1, 1))
    assert c.save_dir == "" and c.save_to_disk is True
    assert len(c.run_id) == 12 and int(c.run_id, 16) >= 0
    assert Checkpointer(nn.Linear(1, 1), save_to_disk=0).save_to_disk is False
    assert Checkpointer(nn.Linear(1, 1), save_to_disk=1).save_to_disk is True


def fake_checkpoints(save_dir, names):
    for name in names:
        os.makedirs(os.path.join(save_dir, name))
        open(os.path.join(save_dir, name, ".metadata"), "w").close()


def test_the_warning_about_earlier_checkpoints_names_six(tmp_path, caplog):
    c = Checkpointer(nn.Linear(1, 1), str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=ckpt_mod.__name__):
        assert c.warn_about_existing_checkpoints() == []
    assert not caplog.records
    names = [f"model_{i:07d}" for i in range(8)]
    fake_checkpoints(tmp_path, names)
    with caplog.at_level(logging.WARNING, logger=ckpt_mod.__name__):
        assert c.warn_about_existing_checkpoints() == names
    (record,) = caplog.records
    assert ", ".join(names[:6]) + " and 2 more. They are kept" in record.getMessage()
    caplog.clear()
    fake_checkpoints(tmp_path, ["other"])  # now 9: the first six named, 3 more
    with caplog.at_level(logging.WARNING, logger=ckpt_mod.__name__):
        c.warn_about_existing_checkpoints()
    assert ", ".join(names[:6]) + " and 3 more. They" in caplog.records[0].getMessage()
    for count, more in [(6, ""), (7, " and 1 more")]:
        caplog.clear()
        fake_checkpoints(tmp_path / str(count), names[:count])
        with caplog.at_level(logging.WARNING, logger=ckpt_mod.__name__):
            Checkpointer(
                nn.Linear(1, 1), str(tmp_path / str(count))
            ).warn_about_existing_checkpoints()
        assert ", ".join(names[:6]) + more + ". They are kept" in caplog.records[0].getMessage()


# ---- meta.json ------------------------------------------------------------------------------------
class Scheduler:
    def __init__(self):
        self.last = 3

    def state_dict(self):
        return {"last": self.last}

    def load_state_dict(self, state):
        self.last = state["last"]


def test_meta_json_summarises_the_save(tmp_path):
    dist.setup_dist_util({})
    model = nn.Linear(2, 2)
    adam = torch.optim.AdamW(model.parameters(), lr=0.1)
    c = Checkpointer(model, str(tmp_path), optimizer=adam, scheduler=Scheduler())
    c.save("ckpt", iteration=7, scale=torch.tensor(2.0), pair=(1, 2))
    text = (tmp_path / "ckpt" / "meta.json").read_text()
    meta = json.loads(text)
    assert meta == {
        "format": "libai-dcp-1",
        "run_id": c.run_id,
        "layout": {
            "world_size": 1,
            "pipeline_parallel_size": 1,
            "data_parallel_size": 1,
            "tensor_parallel_size": 1,
            "virtual_pipeline_size": 1,
            "layer_stage_ids": [],
        },
        "extra": {"iteration": 7, "scale": "tensor(2.)", "pair": [1, 2]},
        "sharded": ["optimizer"],
        "checkpointables": ["scheduler"],
    }
    assert text.startswith('{\n  "format": "libai-dcp-1",\n  "run_id": ')  # indented by 2


# ---- PeriodicCheckpointer ---------------------------------------------------------------------------
class Recorder:
    def __init__(self, save_dir="", run_id="r"):
        self.saved = []
        self.save_dir, self.run_id = save_dir, run_id

    def save(self, name, **extra):
        self.saved.append((name, extra))

    def get_all_checkpoint_files(self):
        return []

    def get_checkpoint_file(self):
        return None


def test_periodic_saves_and_the_final_one():
    rec = Recorder()
    periodic = PeriodicCheckpointer(rec, period=3, max_iter=8)
    for it in range(8):
        periodic.step(it, loss=0.5)
    assert rec.saved == [
        ("model_0000002", {"iteration": 2, "loss": 0.5}),
        ("model_0000005", {"iteration": 5, "loss": 0.5}),
        ("model_final", {"iteration": 7, "loss": 0.5}),
    ]
    rec = Recorder()
    periodic = PeriodicCheckpointer(rec, period=4, file_prefix="ck")  # no max_iter: no final
    for it in range(5):
        periodic.step(it)
    periodic.save("ck_best", iteration=4)
    assert rec.saved == [("ck_0000003", {"iteration": 3}), ("ck_best", {"iteration": 4})]


@pytest.mark.parametrize("max_to_keep", [0, -1])
def test_max_to_keep_below_one_is_refused(max_to_keep):
    with pytest.raises(ValueError, match="max_to_keep"):
        PeriodicCheckpointer(Recorder(), period=1, max_to_keep=max_to_keep)


def test_max_to_keep_one_keeps_the_newest(tmp_path):
    dist.setup_dist_util({})
    c = Checkpointer(nn.Linear(1, 1), str(tmp_path))
    other = tmp_path / "model_0000000"
    fake_checkpoints(tmp_path, ["model_0000000"])  # an earlier run's (no meta.json)
    periodic = PeriodicCheckpointer(c, period=1, max_to_keep=1, max_iter="3")
    assert periodic.max_iter == 3 and periodic.max_to_keep == 1
    for it in range(1, 4):
        periodic.step(it)
    assert sorted(os.listdir(tmp_path)) == [
        "last_checkpoint",
        "model_0000000",
        "model_0000003",
        "model_final",
    ]
    assert other.is_dir()
