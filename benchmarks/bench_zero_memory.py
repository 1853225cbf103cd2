"""Per-rank peak memory and step time of GPT-2 under ZeRO 1/2/3, tp and sequence parallel,
beside the memory estimator's prediction (issue 15).

Each row is one ``torchrun`` launch (CPU/gloo, one OpenMP thread per rank) of this script in
``--worker`` mode on ``configs/gpt2_pretrain.py`` with small shapes (``SHAPES``) and random
tokens: ``--warmup`` AdamW steps (global-norm clipping at 1.0), then ``--steps`` timed steps.

- **step time**: mean ± std over the timed steps of the slowest rank's wall time per step;
- **peak RSS**: per rank, the peak resident set size during the timed steps (VmHWM, reset
  through ``/proc/self/clear_refs`` after the warm-up) minus the RSS before the model was
  built: what the model, its gradients, optimizer state, activations and every transient
  buffer, allocator cache and communication buffer took;
- **state**: per rank, tracked tensor bytes of parameters + gradients (at their peak, after
  the last backward) + optimizer state, measured on the live tensors;
- **predicted**: :func:`libai.runtime.memory_estimator.estimate_config` for the same config:
  its state (params + grads + optimizer) and its total (state + activations in flight).

    python benchmarks/bench_zero_memory.py                  # all rows, a few minutes on CPU
    python benchmarks/bench_zero_memory.py --rows dp2,dp2_z3 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "gpt2_pretrain.py"
SHAPES = [
    "model.cfg.hidden_layers=4",
    "model.cfg.hidden_size=256",
    "model.cfg.num_attention_heads=8",
    "model.cfg.ffn_hidden_size=1024",
    "model.cfg.max_seq_length=256",
    "model.cfg.vocab_size=8192",
    "tokenization.setup=False",
    "train.train_micro_batch_size=8",
]
_Z = "train.zero_optimization"
_TP2 = ["train.dist.tensor_parallel_size=2"]
ROWS = {
    "dp2": (2, []),
    "dp2_z1": (2, [f"{_Z}.enabled=True", f"{_Z}.stage=1"]),
    "dp2_z2": (2, [f"{_Z}.enabled=True", f"{_Z}.stage=2"]),
    "dp2_z3": (2, [f"{_Z}.enabled=True", f"{_Z}.stage=3"]),
    "dp2_tp2": (4, _TP2),
    "dp2_tp2_z3": (4, [*_TP2, f"{_Z}.enabled=True", f"{_Z}.stage=3"]),
    "dp2_tp2_sp": (4, [*_TP2, "train.dist.sequence_parallel=True"]),
    "dp2_tp2_sp_z3": (
        4,
        [*_TP2, "train.dist.sequence_parallel=True", f"{_Z}.enabled=True", f"{_Z}.stage=3"],
    ),
}
MIB = 2**20


# ---- worker (one rank) ------------------------------------------------------------------------
def _rss_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _tensor_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is not None:
            t = t.to_local() if hasattr(t, "to_local") else t
            total += t.numel() * t.element_size()
    return total


def worker(args) -> None:
    import torch

    from libai import dist
    from libai.config import LazyConfig, instantiate, resolve_batch_sizes
    from libai.optim import build_optimizer
    from libai.runtime.core import build_runner, shard_optimizer_for
    from libai.runtime.memory_estimator import estimate_config
    from libai.runtime.zero import optimizer_state_bytes

    cfg = LazyConfig.apply_overrides(LazyConfig.load(str(CONFIG)), args.opts)
    world = int(os.environ["WORLD_SIZE"])
    _, _, rows = estimate_config(cfg, world)
    util = dist.setup_dist_util(cfg.train.dist)
    cfg.train.update(resolve_batch_sizes(cfg.train, util.layout.data_parallel_size)._asdict())
    rss_before = _rss_kib("VmRSS")
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    parts = build_runner(model, cfg.train)
    runner = parts.runner
    optimizer = shard_optimizer_for(parts, build_optimizer(cfg.optim, runner.model))
    seq, micro = cfg.model.cfg.max_seq_length, cfg.train.train_micro_batch_size
    gen = torch.Generator().manual_seed(util.data_parallel_rank)
    vocab = cfg.model.cfg.vocab_size

    def step():
        ids = torch.randint(0, vocab, (micro, seq + 1), generator=gen)
        loss = runner.forward_backward({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})
        grads = _tensor_bytes({id(p): p.grad for p in model.parameters()}.values())
        runner.optimizer_step(optimizer, max_grad_norm=1.0)
        return float(loss), grads

    for _ in range(args.warmup):
        step()
    _reset_peak_rss()
    times, grads = [], 0
    for _ in range(args.steps):
        dist.synchronize()
        start = time.perf_counter()
        _, grads = step()
        dist.synchronize()
        times.append(time.perf_counter() - start)
    params = _tensor_bytes({id(p): p for p in model.parameters()}.values())
    row = rows[util.rank]
    result = {
        "rank": util.rank,
        "times": times,
        "peak_rss": (_rss_kib("VmHWM") - rss_before) * 1024,
        "state": params + grads + optimizer_state_bytes(optimizer),
        "pred_state": row.parameters + row.gradients + row.optimizer,
        "pred_total": row.total,
    }
    Path(args.out, f"rank{util.rank}.json").write_text(json.dumps(result))
    dist.destroy_dist()


# ---- launcher ---------------------------------------------------------------------------------
def run_row(name: str, args) -> list[dict]:
    nproc, opts = ROWS[name]
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            __file__,
            "--worker",
            "--out",
            out,
            "--warmup",
            str(args.warmup),
            "--steps",
            str(args.steps),
            *SHAPES,
            *opts,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        paths = [Path(out, f"rank{r}.json") for r in range(nproc)]
        if not all(p.exists() for p in paths):
            raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return [json.loads(p.read_text()) for p in paths]


def _per_rank(results, key) -> str:
    return " / ".join(f"{r[key] / MIB:.0f}" for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("opts", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_intermixed_args()
    if args.worker:
        worker(args)
        return
    print(
        "| layout | ranks | step time (s), mean ± std | peak RSS per rank (MiB) | "
        "predicted total per rank (MiB) | state per rank (MiB) | predicted state (MiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.rows.split(","):
        results = run_row(name, args)
        slowest = [max(step) for step in zip(*(r["times"] for r in results))]
        print(
            f"| {name} | {len(results)} | {statistics.mean(slowest):.3f} ± "
            f"{statistics.stdev(slowest) if len(slowest) > 1 else 0:.3f} | "
            f"{_per_rank(results, 'peak_rss')} | {_per_rank(results, 'pred_total')} | "
            f"{_per_rank(results, 'state')} | {_per_rank(results, 'pred_state')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
