"""End to end: tools/train_net.py and tools/train.sh on the sample data, outputs, resume, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from door_memory import check_zero_holdings
from launch import torchrun
from process_tree import kill_tree, process_tree, wait_gone
from train_net_helpers import ROOT, TINY, TRAIN_NET, TRAIN_SH, read_metrics, run_train_net

from libai.config import LazyConfig

CONFIG = str(ROOT / "configs" / "gpt2_pretrain.py")


def train_net(env, out_dir, *overrides, nproc=1, check=True, timeout=300, extra_args=()):
    opts = [*TINY, f"train.output_dir={out_dir}", *overrides]
    return run_train_net(
        CONFIG, opts, nproc=nproc, env=env, check=check, timeout=timeout, extra_args=extra_args
    )


def test_training_writes_every_output_and_perplexity_falls(sample_env, tmp_path):
    out = tmp_path / "run"
    train_net(
        sample_env,
        out,
        "train.train_iter=40",
        "train.evaluation.eval_period=20",
        "train.checkpointer.period=20",
        "optim.lr=5e-3",
    )
    cfg = LazyConfig.load(str(out / "config.yaml"))  # the saved config loads back
    assert cfg.train.train_iter == 40 and cfg.model.cfg.hidden_layers == 2
    metrics = read_metrics(out)
    for i in range(40):
        assert {"iteration", "total_loss", "lr", "time"} <= set(metrics[i]) or i == 0
    ppl = [metrics[i]["ppl"] for i in sorted(metrics) if "ppl" in metrics[i]]
    # an untrained model sits near the vocabulary size (uniform guess); training cuts it down
    vocab = cfg.model.cfg.vocab_size
    assert len(ppl) == 2 and ppl[0] < 0.6 * vocab and ppl[-1] < ppl[0], (ppl, vocab)
    assert metrics[39]["total_loss"] < metrics[0]["total_loss"] - 0.3
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "loss_curve.png").stat().st_size > 1000
    # the newest save names the newest state: the final one, or the best one saved after it
    assert (out / "last_checkpoint").read_text().strip() in ("model_final", "model_best")
    for name in ("model_0000019", "model_0000039", "model_final", "model_best"):
        assert (out / name / ".metadata").exists(), name
    assert (out / "log.txt").exists()


#: 12 iterations, a checkpoint every 3 (model_0000002, 5, 8, then model_final), no evaluation
KILL_RUN = ("train.train_iter=12", "train.checkpointer.period=3", "train.evaluation.enabled=False")


def kill_at_first_checkpoint(cmd, out_dir, env) -> tuple[list, int]:
    """Start ``cmd`` (a training run writing to ``out_dir``), and once ``last_checkpoint`` names
    a periodic checkpoint, freeze and SIGKILL its whole process tree (the launcher and every
    worker). Returns the processes killed and the iteration of the checkpoint saved last, after
    checking that every one of those processes is gone and that the run stopped before its end
    and wrote nothing after the kill."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    last = out_dir / "last_checkpoint"
    deadline = time.time() + 240
    killed = []
    try:
        while time.time() < deadline and proc.poll() is None:
            # the first periodic save comes at iteration 2, ~10 iterations before the end
            if last.exists() and last.read_text().strip().startswith("model_0"):
                killed = kill_tree(proc.pid)
                # read while the tree is frozen, before its SIGKILLs land
                saved, logged = last.read_text().strip(), max(read_metrics(out_dir))
                break
            time.sleep(0.002)
    finally:
        if not killed:  # the run ended first, or a step above failed: leave nothing running
            kill_tree(proc.pid)
        proc.wait(timeout=60)
    assert killed, f"the run ended (exit {proc.returncode}) before any periodic checkpoint"
    alive = wait_gone(killed)
    assert not alive, f"still running after SIGKILL: {alive}"
    time.sleep(1)  # nothing left alive writes on
    # it stopped before its end: no final save, no record of the last iteration
    assert last.read_text().strip() == saved and not (out_dir / "model_final").exists()
    assert max(read_metrics(out_dir)) == logged < 11, logged
    return killed, int(saved[len("model_") :])


def assert_resumed_bitwise(straight, resumed, first: int, last: int) -> None:
    a, b = read_metrics(straight), read_metrics(resumed)
    for i in range(first, last + 1):
        assert a[i]["total_loss"] == b[i]["total_loss"], (i, a[i], b[i])
        assert a[i]["lr"] == b[i]["lr"], (i, a[i], b[i])


def test_kill_tree_kills_descendants_in_sessions_of_their_own():
    """What torchrun does to its workers (start_new_session), in miniature: killing the
    launcher's process group would leave the grandchildren running; kill_tree leaves none."""
    script = "setsid sleep 300 & bash -c 'setsid sleep 300 & wait' & sleep 300 & wait"
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.time() + 30
    while len(process_tree(proc.pid)) < 5 and time.time() < deadline:
        time.sleep(0.01)
    tree = process_tree(proc.pid)
    # two of them run in sessions of their own, out of reach of os.killpg(proc.pid, ...)
    assert len(tree) == 5 and sum(os.getsid(p.pid) != proc.pid for p in tree) == 2, tree
    killed = kill_tree(proc.pid)
    proc.wait(timeout=30)
    assert {p.pid for p in killed} == {p.pid for p in tree}
    assert not wait_gone(killed, timeout=10)


def test_resume_after_a_kill_continues_bitwise(sample_env, tmp_path):
    straight = tmp_path / "straight"
    train_net(sample_env, straight, *KILL_RUN)
    # the same run, killed once its first periodic checkpoint exists, then resumed
    killed = tmp_path / "killed"
    cmd = [sys.executable, str(TRAIN_NET), "--config-file", CONFIG]
    cmd += [*TINY, f"train.output_dir={killed}", *KILL_RUN]
    procs, saved = kill_at_first_checkpoint(cmd, killed, sample_env)
    assert "train_net.py" in procs[0].cmdline, procs
    result = train_net(sample_env, killed, *KILL_RUN, extra_args=("--resume",))
    assert f"Resumed at iteration {saved + 1}" in result.stdout + result.stderr
    assert_resumed_bitwise(straight, killed, saved + 1, 11)


def test_two_process_run_killed_mid_run_resumes_bitwise(sample_env, tmp_path):
    """tools/train.sh on 2 processes, SIGKILLed (launcher and both workers) after a periodic
    checkpoint: every process is gone, the run stopped before its end, and ``--resume`` on 2
    processes continues with the losses of an uninterrupted 2-process run, to the last bit."""
    straight = tmp_path / "straight"
    train_net(sample_env, straight, *KILL_RUN, nproc=2)
    killed = tmp_path / "killed"
    cmd = ["bash", str(TRAIN_SH), str(TRAIN_NET), CONFIG, "2"]
    cmd += [*TINY, f"train.output_dir={killed}", *KILL_RUN]
    procs, saved = kill_at_first_checkpoint(cmd, killed, sample_env)
    # the launcher (bash exec'd torchrun) and its two workers, in sessions of their own
    workers = [p for p in procs[1:] if "train_net.py" in p.cmdline]
    assert "torch.distributed.run" in procs[0].cmdline and len(workers) == 2, procs
    result = train_net(sample_env, killed, *KILL_RUN, nproc=2, extra_args=("--resume",))
    assert f"Resumed at iteration {saved + 1}" in result.stdout + result.stderr
    assert_resumed_bitwise(straight, killed, saved + 1, 11)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_resume_under_mixed_precision_continues_bitwise(sample_env, tmp_path, dtype):
    """train.amp in each dtype it offers: resuming from an iteration-2 checkpoint gives the
    uninterrupted run's losses bit for bit (fp16: the loss scaler's state comes back too,
    so it starts from a scale that its first steps have already lowered)."""
    common = (
        "train.train_iter=6",
        "train.checkpointer.period=3",
        "train.evaluation.enabled=False",
        "train.amp.enabled=True",
        f"train.amp.dtype={dtype}",
        # fp16: a scale that overflows on the first two steps only (halved twice), so a
        # resume that lost the scaler's state would skip its first step again
        "train.amp.init_scale=3e6",
    )
    out = tmp_path / "run"
    train_net(sample_env, out, *common)
    straight = read_metrics(out)
    if dtype == "fp16":
        assert [straight[i]["found_inf"] for i in range(6)] == [1, 1, 0, 0, 0, 0], straight
    (out / "last_checkpoint").write_text("model_0000002\n")
    (out / "metrics.json").unlink()
    proc = train_net(sample_env, out, *common, extra_args=("--resume",))
    assert "Resumed at iteration 3" in proc.stdout + proc.stderr
    resumed = read_metrics(out)
    assert sorted(resumed) == [3, 4, 5]
    for i in (3, 4, 5):
        assert resumed[i]["total_loss"] == straight[i]["total_loss"], (i, resumed, straight)


def test_resume_without_checkpoint_starts_fresh_and_says_so(sample_env, tmp_path):
    proc = train_net(
        sample_env,
        tmp_path / "fresh",
        "train.train_iter=2",
        "train.evaluation.enabled=False",
        extra_args=("--resume",),
    )
    assert "no checkpoint found" in (proc.stdout + proc.stderr).lower()


def test_corrupt_checkpoint_is_a_clear_error(sample_env, tmp_path):
    out = tmp_path / "corrupt"
    train_net(sample_env, out, "train.train_iter=2", "train.evaluation.enabled=False")
    (out / "model_final" / ".metadata").write_bytes(b"garbage")
    proc = train_net(
        sample_env,
        out,
        "train.train_iter=4",
        "train.evaluation.enabled=False",
        check=False,
        extra_args=("--resume",),
    )
    assert proc.returncode != 0
    assert "model_final" in proc.stderr and "Starting training" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "overrides, nproc, message",
    [
        (["train.dist.tensor_paralel_size=2"], 1, "tensor_parallel_size"),
        (["train.global_batch_size=6"], 1, "global_batch_size"),
        (
            ["dataloader.train.dataset.0.data_prefix=/nonexistent/corpus_text_document"],
            1,
            "/nonexistent/corpus_text_document",
        ),
        (
            ["tokenization.tokenizer.vocab_file=/nonexistent/vocab.json"],
            1,
            "/nonexistent/vocab.json",
        ),
        (["train.dist.tensor_parallel_size=4"], 2, "tensor_parallel_size"),
        (["train.dist.context_parallel_size=2"], 1, "context_parallel_size (2) = 2"),
    ],
)
def test_bad_input_fails_early_with_a_clear_message(
    sample_env, tmp_path, overrides, nproc, message
):
    proc = train_net(
        sample_env,
        tmp_path / "bad",
        "train.train_iter=2",
        *overrides,
        nproc=nproc,
        check=False,
        timeout=120,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-3000:]
    assert "Starting training" not in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def one_process_metrics(sample_env, tmp_path_factory):
    """metrics.json of a one-process run with these overrides, each run once per module
    (the layouts below share their references)."""
    runs = {}

    def metrics(*overrides):
        if overrides not in runs:
            out = tmp_path_factory.mktemp("one")
            train_net(sample_env, out, *overrides)
            runs[overrides] = read_metrics(out)
        return runs[overrides]

    return metrics


@pytest.mark.parametrize(
    "layout",
    [
        ["train.dist.tensor_parallel_size=2"],
        ["train.dist.pipeline_parallel_size=2", "train.num_accumulation_steps=2"],
        ["train.dist.tensor_parallel_size=2", "train.dist.sequence_parallel=true"],
        ["train.dist.context_parallel_size=2"],
    ],
    ids=["tp2", "pp2", "tp2-sequence-parallel", "cp2"],
)
def test_two_processes_train_evaluate_and_checkpoint(
    sample_env, tmp_path, layout, one_process_metrics
):
    """tp2 / pp2 / tp2 + sequence parallel / cp2 (each sequence over both ranks) through
    tools/train.sh: the losses of every iteration and the perplexity equal one process on
    the same global batches."""
    out = tmp_path / "run"
    common = ("train.train_iter=4", "train.evaluation.eval_period=4")
    train_net(sample_env, out, *common, *layout, nproc=2)
    # one process: the same accumulation; pp evaluates in batches of the training batch
    alone = [o for o in layout if o.startswith("train.num_accumulation_steps")]
    if alone:
        alone.append("train.test_micro_batch_size=8")
    got, want = read_metrics(out), one_process_metrics(*common, *alone)
    for i in range(4):
        assert got[i]["total_loss"] == pytest.approx(want[i]["total_loss"], abs=1e-5), i
    assert got[3]["ppl"] == pytest.approx(want[3]["ppl"], rel=1e-5)
    assert all(Path(out, "model_final", f"__{r}_0.distcp").exists() for r in range(2))


def test_context_and_pipeline_parallel_on_four_processes(sample_env, tmp_path, one_process_metrics):
    """cp2 x pp2 through tools/train_net.py: each pipeline stage runs its ranks' shares of
    the sequences; the losses of every iteration and the perplexity equal one process on the
    same global batches (the same accumulation; evaluation in batches of the training one)."""
    out = tmp_path / "run"
    common = ("train.train_iter=4", "train.evaluation.eval_period=4")
    same = ("train.num_accumulation_steps=2",)
    layout = ("train.dist.context_parallel_size=2", "train.dist.pipeline_parallel_size=2")
    train_net(sample_env, out, *common, *same, *layout, nproc=4)
    got = read_metrics(out)
    want = one_process_metrics(*common, *same, "train.test_micro_batch_size=8")
    for i in range(4):
        assert got[i]["total_loss"] == pytest.approx(want[i]["total_loss"], abs=1e-5), i
    assert got[3]["ppl"] == pytest.approx(want[3]["ppl"], rel=1e-5)


def test_data_parallel_and_zero_stages_equal_one_process(sample_env, tmp_path, monkeypatch):
    """train.dist.data_parallel_size=2, alone and with train.zero_optimization.stage 1/2/3,
    through tools/train_net.py's own main on 2 ranks: the losses of every iteration and the
    perplexity equal one process on the same global batches, and each stage changes what a
    rank holds (door_memory: optimizer state from stage 1, gradients from stage 2,
    parameters at stage 3, measured from the tensors)."""
    common = ["train.train_iter=6", "train.evaluation.eval_period=6", "train.checkpointer.period=2"]
    # one process, the same global batch of 8 (and evaluation batch) in one micro-batch
    one = tmp_path / "one"
    train_net(
        sample_env,
        one,
        *common,
        "train.train_micro_batch_size=8",
        "train.test_micro_batch_size=8",
    )
    dp2 = ["train.dist.data_parallel_size=2"]
    runs = {"dp2": dp2}
    for stage in (1, 2, 3):
        zero = ["train.zero_optimization.enabled=True", f"train.zero_optimization.stage={stage}"]
        runs[f"zero{stage}"] = [*dp2, *zero]
    runs = {name: [*common, *o, f"train.output_dir={tmp_path / name}"] for name, o in runs.items()}
    monkeypatch.setenv("LIBAI_SAMPLE_DATA_DIR", sample_env["LIBAI_SAMPLE_DATA_DIR"])
    results = torchrun("train_net_layouts.py", 2, json.dumps(runs))
    for rank, r in enumerate(results):
        assert r["ok"], f"rank {rank}: {r['error']}\n{r['trace']}"
    want = read_metrics(one)
    for name in runs:
        got = read_metrics(tmp_path / name)
        for i in range(6):  # measured: 1e-6 apart (losses near 6.9) after 6 AdamW steps
            assert got[i]["total_loss"] == pytest.approx(want[i]["total_loss"], abs=1e-5), (
                name,
                i,
            )
        assert got[5]["ppl"] == pytest.approx(want[5]["ppl"], rel=1e-5), name  # measured 1.2e-7
    plain = [r["dp2"] for r in results]
    for stage in (1, 2, 3):
        check_zero_holdings(plain, stage, [r[f"zero{stage}"] for r in results])
    # the iteration-1 checkpoint of the ZeRO-2 run holds each rank's part of the optimizer
    # state; resuming from it (iterations 2..5 again) reproduces the uninterrupted losses
    out = tmp_path / "zero2"
    uninterrupted = read_metrics(out)
    (out / "last_checkpoint").write_text("model_0000001\n")
    (out / "metrics.json").unlink()
    proc = train_net(sample_env, out, *runs["zero2"], nproc=2, extra_args=("--resume",))
    assert "Resumed at iteration 2" in proc.stdout + proc.stderr
    resumed = read_metrics(out)
    for i in range(2, 6):
        assert resumed[i]["total_loss"] == uninterrupted[i]["total_loss"], (i, resumed[i])


@pytest.mark.parametrize(
    "overrides, nproc, message",
    [
        (["train.zero_optimization.stage=4"], 1, "train.zero_optimization.stage=4 is invalid"),
        (
            ["train.zero_optimization.stage=3", "train.zero_optimization.hsdp_replicate_size=3"],
            2,
            "train.zero_optimization.hsdp_replicate_size=3 must divide data_parallel_size=2",
        ),
    ],
)
def test_zero_optimization_that_cannot_apply_raises(
    sample_env, tmp_path, overrides, nproc, message
):
    proc = train_net(
        sample_env,
        tmp_path / "bad",
        "train.train_iter=2",
        "train.zero_optimization.enabled=True",
        *overrides,
        nproc=nproc,
        check=False,
        timeout=120,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-3000:]
    assert "Starting training" not in proc.stdout + proc.stderr


def test_eval_only_loads_weights_and_reports_perplexity(sample_env, tmp_path):
    out = tmp_path / "trained"
    train_net(sample_env, out, "train.train_iter=3", "train.evaluation.enabled=False")
    proc = train_net(
        sample_env,
        tmp_path / "eval",
        f"train.load_weight={out / 'model_final'}",
        extra_args=("--eval-only",),
    )
    log = proc.stdout + proc.stderr
    assert "ppl" in log and "Starting training" not in log
