"""Running tools/train_net.py on one or more processes from the end-to-end tests, and
reading back the metrics.json it writes.

The processes are forked from the test session's preloaded server (:mod:`forked_ranks`:
each is a process of its own with torchrun's environment, without the seconds every fresh
interpreter spends importing torch); ``launcher="train.sh"`` runs the command users run,
``tools/train.sh`` (torchrun), and ``python tools/train_net.py`` for one process. The
launcher's own behaviour is tested in ``tests/doors/libai/test_launch_and_paths.py`` and by
the README's command (``test_configs_gpt2.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_ranks
from launch import free_port

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the checkout
TRAIN_NET = ROOT / "tools" / "train_net.py"
TRAIN_SH = ROOT / "tools" / "train.sh"
#: configs/gpt2_pretrain.py shrunk to a tiny GPT that trains in a second
TINY = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=32",
    "model.cfg.num_attention_heads=2",
    "model.cfg.ffn_hidden_size=64",
    "model.cfg.max_seq_length=32",
    "dataloader.train.dataset.0.max_seq_length=32",
    "train.train_micro_batch_size=4",
    "train.test_micro_batch_size=4",
    "train.log_period=1",
    "train.evaluation.eval_iter=2",
]


def train_env(**extra: str) -> dict:
    """os.environ plus ``extra``, one OpenMP thread, and this interpreter's bin/ first on PATH
    (train.sh calls torchrun)."""
    env = {**os.environ, **extra, "OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env


def run_train_net(
    config,
    opts,
    *,
    nproc: int = 1,
    env: dict | None = None,
    check: bool = True,
    timeout: int = 300,
    extra_args=(),
    launcher: str = "fork",
    cwd=ROOT,
) -> subprocess.CompletedProcess:
    """``train_net.py --config-file config *extra_args *opts`` on ``nproc`` processes, in
    ``env`` (default :func:`train_env`) with a per-session PORT; with ``check`` a non-zero exit
    fails with the tail of the output. ``launcher``: ``"fork"`` (forked ranks, where the
    environment allows; the ranks' merged log is both ``stdout`` and ``stderr``) or
    ``"train.sh"`` (the users' launcher). ``cwd``: the working directory (a LiBai checkout's
    root for its projects)."""
    config = str(config)
    env = {**(train_env() if env is None else env), "PORT": str(free_port())}
    argv = [str(TRAIN_NET), "--config-file", config, *extra_args, *opts]
    forked = launcher == "fork"
    proc = run_forked(argv, nproc=nproc, env=env, timeout=timeout, cwd=cwd) if forked else None
    if proc is None:
        proc = _launch(argv, nproc, env, timeout, cwd)
    if check:
        assert proc.returncode == 0, (
            f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def run_project_script(script, config, opts, *, nproc=1, cwd, launcher="fork"):
    """A LiBai project's own entry script (``projects/<name>/train_net.py``) from the LiBai
    checkout ``cwd``: forked ranks through ``libai/oneflow_api/run.py``, or (``launcher=
    "train.sh"``, or where forking is not allowed) the users' command, ``tools/train.sh
    SCRIPT CONFIG NPROC``. Returns the finished process (not checked)."""
    run_py = ROOT / "libai" / "oneflow_api" / "run.py"
    argv = [str(run_py), str(script), "--config-file", str(config), *opts]
    proc = run_forked(argv, nproc=nproc, cwd=cwd) if launcher == "fork" else None
    if proc is None:
        proc = subprocess.run(
            ["bash", str(TRAIN_SH), str(script), str(config), str(nproc), *opts],
            cwd=cwd,
            env=train_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
    return proc


def run_forked(argv, *, nproc=1, env=None, timeout=300, cwd=ROOT):
    """``argv`` (a script and its arguments) on ``nproc`` ranks forked from the session's
    preloaded server, in ``cwd`` (the repository root by default), meeting on
    ``env["PORT"]`` (default: a free port); ``None`` when the environment does not allow
    forking (then launch it yourself). The ranks' merged log is both ``stdout`` and
    ``stderr``."""
    env = dict(train_env() if env is None else env)
    if not forked_ranks.usable(env):
        return None
    env.setdefault("PORT", str(free_port()))
    proc = forked_ranks.run(argv, nproc, env, timeout, int(env["PORT"]), cwd=str(cwd))
    log = proc.stdout + proc.stderr  # the ranks' stdout and stderr, then how the job ended
    return subprocess.CompletedProcess(proc.args, proc.returncode, log, log)


def _launch(
    argv: list, nproc: int, env: dict, timeout: int, cwd=ROOT
) -> subprocess.CompletedProcess:
    """``python tools/train_net.py ...`` (one process) or ``tools/train.sh`` (torchrun)."""
    config, rest = argv[2], argv[3:]
    if nproc == 1:
        cmd = [sys.executable, str(TRAIN_NET), "--config-file", config, *rest]
    else:
        cmd = ["bash", str(TRAIN_SH), str(TRAIN_NET), config, str(nproc), *rest]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def read_metrics(out_dir) -> dict[int, dict]:
    """metrics.json by iteration, the records of one iteration merged (later keys win)."""
    by_iter = {}
    for line in Path(out_dir, "metrics.json").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_iter[record["iteration"]] = {**by_iter.get(record["iteration"], {}), **record}
    return by_iter
