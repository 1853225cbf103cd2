"""Sharded DCP checkpoints: layout changes, exact resume, atomic saves, bad checkpoints.

The torchrun part (2 ranks, two launches) saves on dp2 / tp2 / pp2 and loads on other
layouts and in a fresh process; the single-process part checks what a checkpoint is made
of on disk, loads the 2-rank checkpoints on one process, and covers crashes mid-save,
corrupt checkpoints, resuming with no checkpoint and ``max_to_keep``.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict

import pytest
import torch
import torch.distributed.checkpoint as dcp
from launch import SCRIPTS, torchrun
from torch import nn

from libai import dist
from libai.checkpoint import checkpointer as ckpt_mod
from libai.checkpoint.checkpointer import Checkpointer, CheckpointError, PeriodicCheckpointer

sys.path.insert(0, str(SCRIPTS))
import checkpoint_layouts as layouts  # noqa: E402

NAME = f"model_{layouts.SAVE_STEP - 1:07d}"
STAGE0 = (
    "GPT_model.embeddings.",
    "GPT_model.transformer.layers.0.",
    "GPT_model.transformer.layers.1.",
)
STAGE1 = (
    "GPT_model.transformer.layers.2.",
    "GPT_model.transformer.layers.3.",
    "GPT_model.transformer.layernorm_f.",
)


# ---- two ranks --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    saved = torchrun("checkpoint_layouts.py", 2, "save", str(root))
    for rank, result in enumerate(saved):
        assert result["ok"], f"save, rank {rank}: {result['error']}\n{result['trace']}"
    loaded = torchrun("checkpoint_layouts.py", 2, "load", str(root))
    for rank, result in enumerate(loaded):
        assert result["ok"], f"load, rank {rank}: {result['error']}\n{result['trace']}"
    return root, saved, loaded


EXTRA = {"iteration": layouts.SAVE_STEP - 1, "consumed_train_samples": layouts.SAVE_STEP * 8}


def test_resume_is_exact(runs):
    """Save after 2 steps, resume (same process, and a new launch): bitwise equal losses."""
    _, saved, loaded = runs
    for rank in range(2):
        for layout in ("dp2", "pp2"):
            straight = saved[rank][layout]["losses"]
            assert len(straight) == layouts.TOTAL_STEPS and all(map(math.isfinite, straight))
            resumed = loaded[rank][f"{layout}_resume"]
            assert resumed["losses"] == straight[layouts.SAVE_STEP :], (layout, rank)
            assert resumed["mismatched"] == [] and resumed["compared"], (layout, rank)
            assert resumed["extra"] == EXTRA
            assert resumed["warnings"] == []
            assert resumed["scheduler_last_epoch"] == layouts.SAVE_STEP
            assert resumed["scaler"]["skipped_steps"] == 1
        inproc = saved[rank]["dp2_inprocess"]
        assert inproc["state_equal"] and inproc["extra"] == EXTRA
        assert inproc["losses"] == saved[rank]["dp2"]["losses"][layouts.SAVE_STEP :]
        # control: the model has dropout, so restoring the RNG states is what makes it exact
        control = loaded[rank]["dp2_resume_without_rng"]["losses"]
        assert control != saved[rank]["dp2"]["losses"][layouts.SAVE_STEP :]


@pytest.mark.parametrize("source,target", [("dp2", "tp2"), ("dp2", "pp2"), ("pp2", "dp2")])
def test_load_on_other_layout(runs, source, target):
    """Parameters and AdamW moments equal the saved ones exactly after resharding."""
    _, saved, loaded = runs
    for rank in range(2):
        item = loaded[rank][f"{source}_to_{target}"]
        assert item["mismatched"] == [], (rank, item["mismatched"][:5])
        assert item["extra"] == EXTRA
        assert item["scheduler_last_epoch"] == layouts.SAVE_STEP
        assert item["scaler"]["skipped_steps"] == 1
        assert any("RNG states are not restored" in w for w in item["warnings"])
        assert all(map(math.isfinite, item["losses"]))
        kinds = {k.split(":")[0] for k in item["compared"]}
        assert kinds == {"param", "exp_avg", "exp_avg_sq"}
    params = [set(loaded[r][f"{source}_to_{target}"]["params"]) for r in range(2)]
    if target == "pp2":  # each stage loaded its own part; the last stage's tied copy was filled
        assert all(p.startswith(STAGE0) for p in params[0])
        assert layouts.COPY in params[1] and layouts.CANONICAL not in params[1]
        copy_filled = loaded[1][f"{source}_to_{target}"]["copy_filled"]
        assert copy_filled == ["param", "exp_avg", "exp_avg_sq"]
    # every parameter of the model was compared on some rank
    n_params = len(saved[0]["dp2"]["params"])
    compared = {
        k.replace(layouts.COPY, layouts.CANONICAL)
        for r in range(2)
        for k in loaded[r][f"{source}_to_{target}"]["compared"]
    }
    assert len(compared) == 3 * n_params


def test_failure_on_one_rank_stops_all(runs):
    root, _, loaded = runs
    save_dir = root / "failures"
    for rank in range(2):
        item = loaded[rank]["failures"]
        # one line on every rank: the file, and the checkpoint that is intact
        want = (
            f"No space left on device while writing {save_dir / 'model_b.tmp' / 'rank_1.pt'}; "
            f"the last complete checkpoint {save_dir / 'model_a'} is intact"
        )
        assert want in item["save_error"] and "\n" not in item["save_error"], item
        assert item["last_checkpoint"] == "model_a"
        assert not item["tmp_left"]  # the failed save's partial files are removed
        assert str(save_dir / "model_a") in item["load_error"]
        assert "rank_1.pt" in item["load_error"], item


def storage_by_file(path):
    """``{file: {key: [chunk offsets]}}`` and the metadata of a DCP checkpoint."""
    md = dcp.FileSystemReader(str(path)).read_metadata()
    files = defaultdict(lambda: defaultdict(list))
    payload = defaultdict(int)
    for index, info in md.storage_data.items():
        files[info.relative_path][index.fqn].append(tuple(index.offset or ()))
        if index.fqn.startswith("model."):
            payload[info.relative_path] += info.length
    return files, payload, md


@pytest.mark.parametrize("layout", ["dp2", "tp2", "pp2"])
def test_each_rank_writes_its_own_shards(runs, layout):
    root, saved, _ = runs
    path = root / layout / NAME
    assert (root / layout / "last_checkpoint").read_text().strip() == NAME
    assert not list((root / layout).glob("*.tmp"))
    for rank in range(2):
        assert (path / f"rank_{rank}.pt").is_file()
    files, payload, md = storage_by_file(path)
    assert sorted(files) == ["__0_0.distcp", "__1_0.distcp"]
    # every model tensor is stored exactly once: its chunks tile its global shape
    for key, meta in md.state_dict_metadata.items():
        if key.startswith("model."):
            covered = sum(math.prod(c.sizes) for c in meta.chunks)
            assert covered == math.prod(meta.size), key
    assert not [k for k in md.state_dict_metadata if "lm_head" in k]  # tied copy not stored
    emb = md.state_dict_metadata[f"model.{layouts.CANONICAL}"]
    assert tuple(emb.size) == (layouts.TINY_GPT["vocab_size"], layouts.TINY_GPT["hidden_size"])
    # no rank wrote the whole model: each wrote a real share of the model's bytes
    total = sum(payload.values())
    assert total >= 4 * saved[0]["dp2"]["local_numel"]  # dp2 replicas hold the full model
    for file, nbytes in payload.items():
        assert 0.2 * total < nbytes < 0.8 * total, (layout, file, nbytes, total)
    emb_key = f"model.{layouts.CANONICAL}"
    if layout == "tp2":  # each tp rank wrote its own vocab shard (rows 0-49, 50-98)
        assert files["__0_0.distcp"][emb_key] == [(0, 0)]
        assert files["__1_0.distcp"][emb_key] == [(50, 0)]
    if layout == "pp2":  # a rank's file holds only its stage's parameters and their state
        for rank, stage in ((0, STAGE0), (1, STAGE1)):
            keys = files[f"__{rank}_0.distcp"]
            names = {k.split(".", 1)[1] for k in keys if k.startswith("model.")}
            owned = {n for n in saved[rank]["pp2"]["params"] if n != layouts.COPY}
            assert names == owned and all(n.startswith(stage) for n in names)
            for key in keys:
                fqn = key.split(".", 2)[2] if key.startswith("optimizer.") else None
                if fqn is not None:
                    assert fqn.startswith(stage), key


@pytest.mark.parametrize("layout", ["dp2", "tp2", "pp2"])
def test_single_process_loads_multi_rank_checkpoint(runs, layout):
    root, _, _ = runs
    dist.setup_dist_util({})
    torch.manual_seed(0)  # other weights than the checkpoint's
    model = layouts.GPTForPreTraining(**layouts.GPT)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    checkpointer = Checkpointer(model, str(root / layout), optimizer=optimizer)
    extra = checkpointer.load(str(root / layout / NAME))
    assert extra == EXTRA
    loaded = layouts.full_state(model, optimizer)
    want = layouts.saved_state(str(root), layout)
    assert sorted(loaded) == sorted(want)
    for key, value in loaded.items():
        assert torch.equal(value, want[key]), key


# ---- one process: a toy model -------------------------------------------------------------
class Toy(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def toy_setup(save_dir, seed=0):
    dist.setup_dist_util({})
    model = Toy(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return (
        model,
        optimizer,
        scheduler,
        Checkpointer(model, str(save_dir), optimizer=optimizer, scheduler=scheduler),
    )


def toy_step(model, optimizer, scheduler=None, seed=0):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed))
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    if scheduler is not None:
        scheduler.step()


def values(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model, optimizer, scheduler, checkpointer = toy_setup(tmp_path)
    toy_step(model, optimizer, scheduler)
    checkpointer.save("model_a", iteration=0)
    at_a = values(model)
    toy_step(model, optimizer, scheduler, seed=1)

    # 1) the writer dies after writing part of the shards (before .metadata)
    def failing_write(self, plan, planner):
        (self.path / "__0_0.distcp").write_bytes(b"partial")
        raise OSError("disk gone")

    with monkeypatch.context() as m:
        m.setattr(dcp.FileSystemWriter, "write_data", failing_write)
        with pytest.raises(CheckpointError, match="(?s)saving checkpoint .*model_b.*disk gone"):
            checkpointer.save("model_b", iteration=1)
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "model_a")
    # the failed save removed its own partial files
    assert not (tmp_path / "model_b").exists() and not (tmp_path / "model_b.tmp").exists()

    # 2) killed after the rename, before last_checkpoint was rewritten
    write_text = ckpt_mod._write_text_atomic

    def failing_text(path, text):
        if os.path.basename(path) == "last_checkpoint":
            raise OSError("killed")
        write_text(path, text)

    with monkeypatch.context() as m:
        m.setattr(ckpt_mod, "_write_text_atomic", failing_text)
        with pytest.raises(CheckpointError, match="committing checkpoint .*model_c.*killed"):
            checkpointer.save("model_c", iteration=1)
    assert (tmp_path / "model_c").is_dir()
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_a"

    # a fresh run resumes from model_a, intact
    model2, optimizer2, scheduler2, checkpointer2 = toy_setup(tmp_path, seed=5)
    assert checkpointer2.resume_or_load(None, resume=True) == {"iteration": 0}
    assert same(values(model2), at_a)
    assert scheduler2.last_epoch == 1

    # the next save cleans the stale .tmp and moves last_checkpoint on
    checkpointer2.save("model_d", iteration=2)
    assert not list(tmp_path.glob("*.tmp"))
    assert checkpointer2.get_checkpoint_file() == str(tmp_path / "model_d")

    # 3) killed while replacing a checkpoint of the same name (e.g. model_final): the
    # previous one was moved aside to model_d.old, and loading falls back to it
    at_d = values(model2)
    toy_step(model2, optimizer2, scheduler2, seed=2)
    rename = os.rename

    def failing_rename(src, dst):
        if str(src).endswith("model_d.tmp"):
            raise OSError("killed")
        rename(src, dst)

    with monkeypatch.context() as m:
        m.setattr(ckpt_mod.os, "rename", failing_rename)
        with pytest.raises(CheckpointError, match="killed"):
            checkpointer2.save("model_d", iteration=3)
    assert not (tmp_path / "model_d").exists() and (tmp_path / "model_d.old").is_dir()
    model3, _, _, checkpointer3 = toy_setup(tmp_path, seed=6)
    assert checkpointer3.resume_or_load(None) == {"iteration": 2}
    assert same(values(model3), at_d)
    checkpointer3.save("model_d", iteration=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "last_checkpoint",
        "model_a",
        "model_c",
        "model_d",
    ]


def test_killed_process_mid_save(tmp_path):
    """A real SIGKILL while DCP writes the shards of the second checkpoint."""
    code = textwrap.dedent(
        f"""
        import os, signal, torch
        import torch.distributed.checkpoint as dcp
        from libai import dist
        from libai.checkpoint.checkpointer import Checkpointer

        dist.setup_dist_util({{}})
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ck = Checkpointer(model, {str(tmp_path)!r}, optimizer=opt)

        def step():
            model(torch.randn(5, 4)).square().mean().backward()
            opt.step()
            opt.zero_grad()

        step()
        ck.save("model_0000000", iteration=0)
        torch.save(model.state_dict(), {str(tmp_path / "expected.pt")!r})
        step()
        original = dcp.FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            original(self, plan, planner).wait()
            os.kill(os.getpid(), signal.SIGKILL)

        dcp.FileSystemWriter.write_data = write_then_die
        ck.save("model_0000001", iteration=1)
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_0000000"
    assert list((tmp_path / "model_0000001.tmp").glob("*.distcp"))  # it was writing
    assert not (tmp_path / "model_0000001").exists()
    dist.setup_dist_util({})
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    checkpointer = Checkpointer(model, str(tmp_path), optimizer=optimizer)
    assert checkpointer.resume_or_load(None) == {"iteration": 0}
    assert same(values(model), torch.load(tmp_path / "expected.pt"))
    assert len(optimizer.state) == 2
    checkpointer.save("model_0000001", iteration=1)  # the next save cleans up
    assert not list(tmp_path.glob("*.tmp"))


@pytest.fixture
def saved_toy(tmp_path):
    model, optimizer, scheduler, checkpointer = toy_setup(tmp_path / "run")
    toy_step(model, optimizer, scheduler)
    checkpointer.save("model_0000000", iteration=0)
    return tmp_path / "run" / "model_0000000"


@pytest.mark.parametrize(
    "damage,message,without_manifest",
    [
        ("no_metadata", ".metadata is missing", ".metadata is missing"),
        ("garbage_metadata", ".metadata has 12 bytes, its manifest says", ".metadata is not DCP"),
        ("truncated_shard", "__0_0.distcp has .* bytes, its manifest says", "is truncated"),
        ("missing_shard", "__0_0.distcp is missing", "is missing"),
        ("missing_rank_file", "rank_0.pt is missing", "rank_0.pt is missing"),
        ("garbage_rank_file", "rank_0.pt has 4 bytes", "rank_0.pt is not a readable torch"),
        ("no_directory", "does not exist", "does not exist"),
    ],
)
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "older_checkpoint"])
def test_corrupt_checkpoint_is_a_clear_error(
    saved_toy, tmp_path, damage, message, without_manifest, manifest
):
    """One line naming the checkpoint; checkpoints of older libai (no manifest.json) are
    still checked file by file."""
    path = saved_toy
    if not manifest:
        (path / "manifest.json").unlink()
        message = without_manifest
    if damage == "no_metadata":
        (path / ".metadata").unlink()
    elif damage == "garbage_metadata":
        (path / ".metadata").write_bytes(b"not a pickle")
    elif damage == "truncated_shard":
        shard = path / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "missing_shard":
        (path / "__0_0.distcp").unlink()
    elif damage == "missing_rank_file":
        (path / "rank_0.pt").unlink()
    elif damage == "garbage_rank_file":
        (path / "rank_0.pt").write_bytes(b"junk")
    elif damage == "no_directory":
        shutil.rmtree(path)
    model, _, _, checkpointer = toy_setup(path.parent, seed=7)
    before = values(model)
    with pytest.raises(CheckpointError, match=message) as info:
        checkpointer.resume_or_load(None, resume=True)  # never a silent fresh start
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert "weights_only" not in str(info.value)
    assert same(values(model), before)
    with pytest.raises(CheckpointError, match=message):
        checkpointer.load(str(path))


def test_checkpoint_of_another_model_is_a_clear_error(saved_toy, tmp_path):
    dist.setup_dist_util({})
    other = nn.Linear(4, 4)
    with pytest.raises(CheckpointError, match=str(saved_toy)):
        Checkpointer(other).load(str(saved_toy))


def test_resume_without_checkpoint_starts_fresh(tmp_path, caplog):
    model, _, _, checkpointer = toy_setup(tmp_path / "empty")
    before = values(model)
    log = logging.getLogger("libai.checkpoint.checkpointer")
    log.addHandler(caplog.handler)  # robust to a non-propagating "libai" logger
    try:
        with caplog.at_level(logging.INFO, logger="libai.checkpoint.checkpointer"):
            assert not checkpointer.has_checkpoint()
            assert checkpointer.get_checkpoint_file() is None
            assert checkpointer.resume_or_load(None, resume=True) == {}
    finally:
        log.removeHandler(caplog.handler)
    assert "no checkpoint found in" in caplog.text and "starting from scratch" in caplog.text
    assert str(tmp_path / "empty") in caplog.text
    assert same(values(model), before)


def test_load_weight_loads_the_model_only(saved_toy, tmp_path):
    model, optimizer, scheduler, checkpointer = toy_setup(tmp_path / "new", seed=9)
    assert checkpointer.resume_or_load(str(saved_toy), resume=False) == {}
    loaded_model, *_ = toy_setup(tmp_path / "x", seed=9)
    Checkpointer(loaded_model).load(str(saved_toy), checkpointables=[])
    assert same(values(model), values(loaded_model))
    assert not optimizer.state and scheduler.last_epoch == 0  # untouched
    # resume with no checkpoint of its own also takes the weights of `path`
    model3, optimizer3, _, checkpointer3 = toy_setup(tmp_path / "new3", seed=9)
    assert checkpointer3.resume_or_load(str(saved_toy), resume=True) == {}
    assert same(values(model3), values(model)) and not optimizer3.state


def test_periodic_checkpointer_keeps_the_newest(tmp_path):
    model, optimizer, scheduler, checkpointer = toy_setup(tmp_path)
    periodic = PeriodicCheckpointer(checkpointer, period=2, max_iter=7, max_to_keep=2)
    for it in range(7):
        toy_step(model, optimizer, scheduler, seed=it)
        periodic.step(it, consumed_train_samples=5 * (it + 1))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["last_checkpoint", "model_0000003", "model_0000005", "model_final"]
    assert checkpointer.get_checkpoint_file() == str(tmp_path / "model_final")
    # a resumed run: the checkpoints already there count as the oldest; model_final replaced
    model2, optimizer2, scheduler2, checkpointer2 = toy_setup(tmp_path, seed=1)
    extra = checkpointer2.resume_or_load(None)
    assert extra == {"iteration": 6, "consumed_train_samples": 35}
    periodic2 = PeriodicCheckpointer(checkpointer2, period=2, max_iter=10, max_to_keep=2)
    for it in range(extra["iteration"] + 1, 10):
        toy_step(model2, optimizer2, scheduler2, seed=it)
        periodic2.step(it)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["last_checkpoint", "model_0000007", "model_0000009", "model_final"]
    final = values(model2)
    model3, *_, checkpointer3 = toy_setup(tmp_path, seed=2)
    assert checkpointer3.resume_or_load(None)["iteration"] == 9
    assert same(values(model3), final)


def test_save_before_first_step_keeps_optimizer_fresh(tmp_path):
    model, *_ = toy_setup(tmp_path)
    adam = torch.optim.AdamW(model.parameters(), lr=0.1)
    checkpointer = Checkpointer(model, str(tmp_path), optimizer=adam)
    checkpointer.save("model_init")
    assert not adam.state  # saving did not initialize (step) the optimizer
    model2, *_ = toy_setup(tmp_path, seed=4)
    adam2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    Checkpointer(model2, str(tmp_path), optimizer=adam2).resume_or_load(None)
    assert not adam2.state and adam2.param_groups[0]["lr"] == 0.1
    toy_step(model, adam)
    toy_step(model2, adam2)
    assert same(values(model), values(model2))


# ---- generic tied copies and padding (one process) -------------------------------------------
class TiedToy(nn.Module):
    """A 'first stage' weight and a 'last stage' copy of it, both padded to 12 rows."""

    def __init__(self, rows=12, seed=0, declare=False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        source = torch.zeros(rows, 3)
        source[:10] = torch.randn(10, 3, generator=g)
        self.embed = nn.Parameter(source.clone())
        self.head = nn.Parameter(source.clone())
        for p in (self.embed, self.head):
            p.libai_tied_group = "tied"
            p.libai_logical_shape = (10, 3)
        if declare:
            self.checkpoint_tied_weights = {"head": "embed"}
        else:
            self.head.libai_tied_copy = True


@pytest.mark.parametrize("declare", [False, True])
def test_tied_copy_and_padding_are_layout_independent(tmp_path, declare):
    dist.setup_dist_util({})
    model = TiedToy(declare=declare)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.embed.grad = torch.ones_like(model.embed)
    model.head.grad = torch.ones_like(model.head)
    optimizer.step()
    Checkpointer(model, str(tmp_path), optimizer=optimizer).save("ckpt")
    md = dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata()
    keys = set(md.state_dict_metadata)
    assert "model.embed" in keys and not [k for k in keys if "head" in k]
    assert tuple(md.state_dict_metadata["model.embed"].size) == (10, 3)  # logical, unpadded
    # a model with other padding (16 rows): the copy is filled from the canonical entry
    other = TiedToy(rows=16, seed=1, declare=declare)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    Checkpointer(other, str(tmp_path), optimizer=other_opt).resume_or_load(None)
    for p in (other.embed, other.head):
        assert torch.equal(p.detach()[:10], model.embed.detach()[:10])
        assert torch.equal(
            other_opt.state[p]["momentum_buffer"][:10],
            optimizer.state[model.embed]["momentum_buffer"][:10],
        )


class _EvalLoop:
    """The engine's loop (TrainerBase) with an evaluation that returns the next value of
    ``metrics`` and a checkpointer that records what it is asked to save."""

    def __init__(self, metrics, mode, period=2, max_iter=6):
        from libai.runtime.hooks import BestCheckpointer, EvalHook
        from libai.runtime.trainer import TrainerBase

        values = iter(metrics)
        saved = self.saved = []

        class Recorder:
            def save(self, name, **extra):
                saved.append((name, extra["iteration"]))

        class Loop(TrainerBase):
            def run_step(self):
                pass

            def checkpoint_extra(self):  # the last completed iteration, as EagerTrainer's
                return {"iteration": min(self.iter, self.max_iter - 1)}

        self.loop = Loop()
        self.loop.register_hooks(
            [
                EvalHook(period, lambda: {"ppl": next(values)}),
                BestCheckpointer(period, Recorder(), "ppl", mode=mode),
            ]
        )
        self.loop.train(0, max_iter)


@pytest.mark.parametrize(
    "mode, metrics, saved_at",
    [
        ("min", [3.0, 1.0, 2.0], [1, 3]),  # evaluations after iterations 1, 3 and 5
        ("max", [3.0, 1.0, 2.0], [1]),
        ("max", [1.0, 3.0, 2.0], [1, 3]),
        ("min", [2.0, float("nan"), 1.0], [1, 5]),  # a nan never becomes the best
    ],
)
def test_best_checkpointer_saves_only_improvements(mode, metrics, saved_at):
    loop = _EvalLoop(metrics, mode)
    assert loop.saved == [("model_best", i) for i in saved_at]
