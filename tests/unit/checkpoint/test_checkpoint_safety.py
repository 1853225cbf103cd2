"""Checkpoints are data: loading one never runs code, through any entry point; a damaged file
is named with the checkpoint to fall back to; retention deletes only the run's own
checkpoints; a full disk, a corrupt file and a finished run are one clear line each.

A planted payload is a pickled ``open(marker, "w")``: each test first shows that the planted
file *does* create the marker when read the unsafe way, then that every libai entry point
refuses it in one line and the marker never appears.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed.checkpoint as dcp
from engine_helpers import TINY_GPT_YAML, run_command
from train_net_helpers import ROOT, TINY, run_train_net

from libai import dist
from libai.checkpoint import view as checkpoint_view
from libai.checkpoint.checkpointer import Checkpointer, CheckpointError, PeriodicCheckpointer
from libai.checkpoint.manifest import MANIFEST, file_checksums, manifest_text
from libai.checkpoint.safe_load import read_dcp_metadata, torch_load_data

CONFIG = ROOT / "configs" / "gpt2_pretrain.py"
RUN = [
    *TINY,
    "train.train_iter=4",
    "train.checkpointer.period=2",
    "train.evaluation.eval_period=2",
]


class Payload:
    """Unpickling this runs ``open(marker, "w")``: it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def refresh_manifest(checkpoint) -> None:
    """What an attacker can do too: re-checksum the planted files."""
    names = sorted(n for n in os.listdir(checkpoint) if n != MANIFEST)
    (checkpoint / MANIFEST).write_text(manifest_text(file_checksums(str(checkpoint), names)))


def plant(checkpoint, place: str, marker) -> None:
    """Put a payload into ``place`` (rank_file / metadata) of a saved checkpoint."""
    if place == "rank_file":
        state = torch_load_data(checkpoint / "rank_0.pt")
        state["extra"]["note"] = Payload(marker)
        torch.save(state, checkpoint / "rank_0.pt")
    elif place == "metadata":
        metadata = read_dcp_metadata(checkpoint)
        metadata.planner_data = Payload(marker)
        with open(checkpoint / ".metadata", "wb") as f:
            pickle.dump(metadata, f)
    refresh_manifest(checkpoint)


def read_unsafely(checkpoint, place: str) -> None:
    """How the planted file would be read without libai's allow-lists."""
    if place == "rank_file":
        torch.load(checkpoint / "rank_0.pt", weights_only=False)
    elif place == "metadata":
        with open(checkpoint / ".metadata", "rb") as f:
            pickle.load(f)
    else:  # the shards' non-tensor entries, through DCP's own planner
        entries = {k: None for k in read_dcp_metadata(checkpoint).state_dict_metadata}
        entries = {k: v for k, v in entries.items() if ".param_groups." in k}
        dcp.load(entries, storage_reader=dcp.FileSystemReader(str(checkpoint)))


def assert_live(checkpoint, place, marker) -> None:
    """The payload is real: read the unsafe way, it creates the marker."""
    read_unsafely(checkpoint, place)
    assert marker.exists(), place
    marker.unlink()


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


# ---- a toy model, in this process -------------------------------------------------------------
class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def toy(save_dir, seed=0):
    dist.setup_dist_util({})
    torch.manual_seed(seed)
    model = Toy()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.randn(3, 4)).square().mean().backward()
    optimizer.step()
    scheduler.step()
    return model, Checkpointer(model, str(save_dir), optimizer=optimizer, scheduler=scheduler)


def save_shard_payload(save_dir, marker):
    """A checkpoint whose shards hold a payload where a param group's bytes belong."""
    model, checkpointer = toy(save_dir)
    real = checkpoint_view._group_bytes
    checkpoint_view._group_bytes = lambda group: Payload(marker)
    try:
        checkpointer.save("model_0000000", iteration=0)
    finally:
        checkpoint_view._group_bytes = real
    return save_dir / "model_0000000"


@pytest.mark.parametrize("place", ["rank_file", "metadata", "shards"])
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "no_manifest"])
def test_a_planted_payload_never_runs(tmp_path, place, manifest):
    marker = tmp_path / "PWNED"
    if place == "shards":
        path = save_shard_payload(tmp_path / "run", marker)
    else:
        _, checkpointer = toy(tmp_path / "run")
        checkpointer.save("model_0000000", iteration=0)
        path = tmp_path / "run" / "model_0000000"
        plant(path, place, marker)
    if not manifest:
        (path / MANIFEST).unlink()
    assert_live(path, place, marker)
    model, checkpointer = toy(tmp_path / "run", seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for load in (lambda: checkpointer.resume_or_load(None), lambda: checkpointer.load(str(path))):
        with pytest.raises(CheckpointError) as info:
            load()
        message = str(info.value)
        assert message.startswith(f"refusing to load checkpoint {path}: "), message
        assert re.search(r"asks to run (io|builtins)\.open when read", message), message
        assert "\n" not in message
        assert "weights_only" not in message
        assert not marker.exists()
    if place != "shards":  # refused before any tensor was read
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class Odd:
    """A value only code can rebuild (pickled as a class reference)."""


def test_saving_state_that_only_code_could_rebuild_is_refused(tmp_path):
    class Holder:
        def state_dict(self):
            return {"thing": Odd()}

        def load_state_dict(self, state):
            pass

    model, _ = toy(tmp_path)
    checkpointer = Checkpointer(model, str(tmp_path), holder=Holder())
    with pytest.raises(CheckpointError, match="checkpointable 'holder' holds a .*Odd"):
        checkpointer.save("model_0000000")
    assert not (tmp_path / "model_0000000").exists()
    assert not (tmp_path / "model_0000000.tmp").exists()
    with pytest.raises(CheckpointError, match="the extra data holds a .*Odd"):
        Checkpointer(model, str(tmp_path)).save("model_0000000", note=Odd())


def test_an_older_checkpoint_still_loads(tmp_path):
    """Checkpoints of earlier libai versions: numpy's RNG array, param groups as plain
    pickles, no manifest (a warning says its files are not verified)."""
    model, checkpointer = toy(tmp_path)
    real = checkpoint_view._group_bytes
    checkpoint_view._group_bytes = pickle.dumps  # what older versions stored
    try:
        checkpointer.save("model_0000000", iteration=0)
    finally:
        checkpoint_view._group_bytes = real
    path = tmp_path / "model_0000000"
    (path / MANIFEST).unlink()
    state = torch_load_data(path / "rank_0.pt")
    import numpy as np

    np.random.seed(3)
    state["rng"]["numpy"] = np.random.get_state()
    torch.save(state, path / "rank_0.pt")
    want = np.random.rand()
    loaded, checkpointer2 = toy(tmp_path, seed=1)
    assert checkpointer2.load(str(path)) == {"iteration": 0}
    assert np.random.rand() == want
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    lr = checkpointer2.checkpointables["optimizer"].param_groups[0]["lr"]
    assert lr == checkpointer.checkpointables["optimizer"].param_groups[0]["lr"]


@pytest.mark.parametrize("file", ["__0_0.distcp", "rank_0.pt", ".metadata"])
def test_a_flipped_byte_names_the_file_and_the_fallback(tmp_path, file):
    model, checkpointer = toy(tmp_path)
    checkpointer.save("model_0000000", iteration=0)
    checkpointer.save("model_0000001", iteration=1)
    path = tmp_path / "model_0000001"
    data = bytearray((path / file).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / file).write_bytes(bytes(data))
    _, checkpointer2 = toy(tmp_path, seed=1)
    with pytest.raises(CheckpointError) as info:
        checkpointer2.resume_or_load(None)
    assert str(info.value) == (
        f"checkpoint {path} is corrupt: {file} does not match its checksum (xxh3-64 "
        f"{file_checksums(str(path), [file])[file]['xxh3_64']}, the manifest says "
        f"{json.loads((path / MANIFEST).read_text())['files'][file]['xxh3_64']}); fall back "
        f"to {tmp_path / 'model_0000000'}, the newest other one."
    )


# ---- retention: only this run's checkpoints ---------------------------------------------------
def test_a_fresh_run_keeps_an_earlier_runs_checkpoints(tmp_path, caplog):
    model, first = toy(tmp_path)
    periodic = PeriodicCheckpointer(first, period=1, max_iter=4, max_to_keep=2)
    for it in range(4):
        periodic.step(it)
    earlier = sorted(p.name for p in tmp_path.iterdir())
    assert earlier == ["last_checkpoint", "model_0000002", "model_0000003", "model_final"]
    final_bytes = (tmp_path / "model_final" / "__0_0.distcp").read_bytes()

    # a second, fresh run into the same directory (no resume): warned, nothing of run 1 lost
    _, second = toy(tmp_path, seed=1)
    caplog.set_level("WARNING", logger="libai.checkpoint.checkpointer")
    logger = __import__("logging").getLogger("libai.checkpoint.checkpointer")
    logger.addHandler(caplog.handler)
    try:
        assert second.resume_or_load(None, resume=False) == {}
    finally:
        logger.removeHandler(caplog.handler)
    assert "already holds checkpoints of an earlier run: model_0000002, model_0000003, " in (
        caplog.text
    )
    assert "To continue that run instead, resume it (tools/train_net.py --resume)" in caplog.text
    periodic = PeriodicCheckpointer(second, period=1, max_iter=3, max_to_keep=2)
    for it in range(3):
        periodic.step(it)
    names = sorted(p.name for p in tmp_path.iterdir())
    aside = f"model_final.run-{first.run_id}"
    # run 2 deleted its own model_0000000 only; run 1's model_0000003 is kept, its
    # model_0000002 and model_final (names run 2 saved again) were moved aside, not replaced
    assert names == [
        "last_checkpoint",
        "model_0000001",
        "model_0000002",
        f"model_0000002.run-{first.run_id}",
        "model_0000003",
        "model_final",
        aside,
    ], names
    assert (tmp_path / aside / "__0_0.distcp").read_bytes() == final_bytes
    # the kept checkpoint of run 1 still loads, verified
    _, third = toy(tmp_path, seed=2)
    assert third.load(str(tmp_path / aside)) == {"iteration": 3}


# ---- entry points: a trained tiny GPT --------------------------------------------------------
@pytest.fixture(scope="module")
def trained(sample_env, tmp_path_factory):
    """A finished 4-iteration run (checkpoints model_0000001, model_0000003, model_final,
    model_best) and planted copies of its final checkpoint."""
    root = tmp_path_factory.mktemp("safety")
    out = root / "run"
    run_train_net(CONFIG, [*RUN, f"train.output_dir={out}"], env=sample_env)
    planted = {}
    for place in ("rank_file", "metadata"):
        path = root / place / "model_final"
        shutil.copytree(out / "model_final", path)
        plant(path, place, root / "PWNED")
        planted[place] = path
    return root, out, planted


def test_every_entry_point_refuses_a_payload(trained, sample_env, accelerate_files, monkeypatch):
    root, out, planted = trained
    # the in-process doors resolve the config's sample-data paths here, not in ~/.cache
    monkeypatch.setenv("LIBAI_SAMPLE_DATA_DIR", sample_env["LIBAI_SAMPLE_DATA_DIR"])
    marker = root / "PWNED"
    for place, path in planted.items():
        assert_live(path, place, marker)

    def refused(proc, place, code=1):
        assert proc.returncode == code, proc.stderr[-3000:]
        line = one_error_line(proc.stderr)
        assert f"refusing to load checkpoint {planted[place]}" in line, line
        assert f"{'.metadata' if place == 'metadata' else 'rank_0.pt'} asks to run" in line
        assert not marker.exists()

    opts = [*RUN, f"train.output_dir={root / 'fresh'}"]
    # LiBai: train.load_weight, then --resume from an output dir whose last checkpoint is it
    proc = run_train_net(
        CONFIG, [*opts, f"train.load_weight={planted['metadata']}"], env=sample_env, check=False
    )
    refused(proc, "metadata")
    shutil.copy(out / "config.yaml", root / "rank_file" / "config.yaml")
    (root / "rank_file" / "last_checkpoint").write_text("model_final\n")
    resume = [*RUN, f"train.output_dir={root / 'rank_file'}"]
    proc = run_train_net(CONFIG, resume, env=sample_env, check=False, extra_args=("--resume",))
    refused(proc, "rank_file")
    # tools/convert_checkpoint.py and tools/export_onnx.py (reads the metadata first)
    for tool, code in (("convert_checkpoint.py", 1), ("export_onnx.py", 2)):
        cmd = [sys.executable, str(ROOT / "tools" / tool)]
        if tool == "convert_checkpoint.py":
            cmd += ["to-hf", "--checkpoint", str(planted["metadata"]), "--output", str(root / "h")]
        else:
            cmd += ["--model-path", str(planted["metadata"]), "--output", str(root / "m.onnx")]
        cmd += ["--config-file", str(out / "config.yaml")]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=sample_env, cwd=ROOT)
        refused(proc, "metadata", code)
    assert not (root / "h").exists() and not (root / "m.onnx").exists()
    # FleetX: Engine.load through tools/eval.py
    yaml = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
    overrides = [
        *TINY_GPT_YAML,
        f"Engine.save_load.output_dir={root / 'fleetx'}",
        f"Engine.save_load.ckpt_dir={planted['rank_file']}",
    ]
    proc = run_command(
        [sys.executable, str(ROOT / "tools" / "eval.py"), "-c", str(yaml)],
        overrides,
        env=sample_env,
        check=False,
    )
    refused(proc, "rank_file")
    # inference pipelines in libai mode (in this process)
    from libai.inference import TextGenerationPipeline

    with pytest.raises(CheckpointError, match="refusing to load checkpoint .*rank_0.pt asks"):
        TextGenerationPipeline(
            str(out / "config.yaml"), model_path=str(planted["rank_file"]), mode="libai"
        )
    # Rapidformer: libai-accelerate --load (in this process)
    from accelerate_helpers import task_argv

    from libai.accelerate import cli

    argv = task_argv(accelerate_files, "causal_lm", root / "acc", steps=2)
    with pytest.raises(CheckpointError, match="refusing to load checkpoint .*metadata asks"):
        cli.main([*argv, "--load", str(planted["metadata"])])
    assert not marker.exists()


def test_a_corrupt_shard_stops_resume_in_one_line(trained, sample_env):
    root, out, _ = trained
    run = root / "corrupt"
    shutil.copytree(out, run)
    (run / "last_checkpoint").write_text("model_final\n")
    shard = run / "model_final" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    opts = [*RUN, f"train.output_dir={run}"]
    proc = run_train_net(CONFIG, opts, env=sample_env, check=False, extra_args=("--resume",))
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert f"checkpoint {run / 'model_final'} is corrupt: __0_0.distcp does not match" in line
    assert "fall back to" in line and "Starting training" not in proc.stdout + proc.stderr


def test_resuming_a_finished_run_has_nothing_to_train(trained, sample_env):
    """Exit 0 and say so; the run's checkpoints and metrics are untouched. (The last
    checkpoint is model_best, saved after the final evaluation: it resumes at the end too.)"""
    root, out, _ = trained
    run = root / "finished"
    shutil.copytree(out, run)
    assert (run / "last_checkpoint").read_text().strip() == "model_best"
    (run / "metrics.json").write_text('{"iteration": 3, "lr": 0.1}\n')  # nothing to plot
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "model_" in str(p)}
    metrics = (run / "metrics.json").read_bytes()
    opts = [*RUN, f"train.output_dir={run}"]
    proc = run_train_net(CONFIG, opts, env=sample_env, extra_args=("--resume",))
    text = proc.stdout + proc.stderr
    assert "Nothing left to train" in text and "Starting training" not in text
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "model_" in str(p)}
    assert after == before and (run / "metrics.json").read_bytes() == metrics


# ---- a full disk --------------------------------------------------------------------------------
def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d"
    return (
        subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True).returncode == 0
    )


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -rm` to mount a small tmpfs")
def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path):
    """On a real 1.5 MiB file system (a tmpfs in a private mount namespace): the first
    checkpoint fits, the second does not."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "save.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch
            from libai import dist
            from libai.checkpoint.checkpointer import Checkpointer
            from libai.dist.cli import run_cli

            def main():
                dist.setup_dist_util({{}})
                model = torch.nn.Linear(300, 300)  # 360 kB of weights, 720 kB of AdamW state
                optimizer = torch.optim.AdamW(model.parameters())
                model(torch.randn(2, 300)).sum().backward()
                optimizer.step()
                checkpointer = Checkpointer(model, {str(disk)!r}, optimizer=optimizer)
                checkpointer.save("model_a", iteration=0)
                torch.save(model.state_dict(), {str(tmp_path / "a.pt")!r})
                checkpointer.save("model_b", iteration=1)
                return 0

            run_cli(main)
            """
        )
    )
    inner = f"mount -t tmpfs -o size=1536k tmpfs {disk} && {sys.executable} {script}; "
    inner += f"rc=$?; ls -a {disk} > {tmp_path / 'listing'}; cp -r {disk}/model_a "
    inner += f"{tmp_path}/model_a; cat {disk}/last_checkpoint > {tmp_path / 'last'}; exit $rc"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", inner], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    assert line.startswith("error: CheckpointError: No space left on device while writing "), line
    assert f"{disk}/model_b.tmp/" in line
    assert line.endswith(f"; the last complete checkpoint {disk / 'model_a'} is intact.")
    # the partial save was removed (its space freed); model_a is complete and loads verified
    assert (tmp_path / "listing").read_text().split() == [".", "..", "last_checkpoint", "model_a"]
    assert (tmp_path / "last").read_text().strip() == "model_a"
    dist.setup_dist_util({})
    model = torch.nn.Linear(300, 300)
    Checkpointer(model).load(str(tmp_path / "model_a"), checkpointables=[])
    want = torch.load(tmp_path / "a.pt")
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())


def test_run_cli_prints_a_checkpoint_error_in_one_line(tmp_path):
    code = "from libai.dist.cli import run_cli\nfrom libai.checkpoint.checkpointer import "
    code += "CheckpointError\ndef main():\n    raise CheckpointError('checkpoint x is corrupt.')\n"
    code += "run_cli(main)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: CheckpointError: checkpoint x is corrupt."
