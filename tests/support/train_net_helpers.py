"""Running tools/train_net.py (1 process) or tools/train.sh (torchrun) from the end-to-end
tests, and reading back the metrics.json it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
) -> subprocess.CompletedProcess:
    """``train_net.py --config-file config *extra_args *opts`` on ``nproc`` processes, in
    ``env`` (default :func:`train_env`) with a per-session PORT; with ``check`` a non-zero exit
    fails with the tail of the output."""
    config = str(config)
    if nproc == 1:
        cmd = [sys.executable, str(TRAIN_NET), "--config-file", config, *extra_args, *opts]
    else:
        cmd = ["bash", str(TRAIN_SH), str(TRAIN_NET), config, str(nproc), *extra_args, *opts]
    env = {**(train_env() if env is None else env), "PORT": str(free_port())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check:
        assert proc.returncode == 0, (
            f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def read_metrics(out_dir) -> dict[int, dict]:
    """metrics.json by iteration, the records of one iteration merged (later keys win)."""
    by_iter = {}
    for line in Path(out_dir, "metrics.json").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_iter[record["iteration"]] = {**by_iter.get(record["iteration"], {}), **record}
    return by_iter
