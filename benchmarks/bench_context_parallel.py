"""Per-rank activation memory and step time of GPT-2 at context parallel 1 and 2 (issue 39).

Each row is one ``torchrun`` launch of this script in ``--worker`` mode: ``cp`` processes
(gloo on CPU, NCCL with ``--device cuda``), each sequence split over all of them, the same
global batch in every row. Per rank:

- **activations**: the bytes autograd keeps for backward during one training step
  (``saved_tensors_hooks``, parameters left out), measured; on CUDA also the peak allocated
  memory of a step above what was allocated before it;
- **predicted**: :func:`libai.runtime.memory_estimator.estimate_memory`'s activations of one
  micro-batch for the same layout;
- **step time**: the median over ``--steps`` timed training steps (forward, backward, the
  gradient sync, AdamW) after ``--warmup``, of the slowest rank.

    python benchmarks/bench_context_parallel.py                 # CPU, about a minute
    python benchmarks/bench_context_parallel.py --seq 2048 --device cuda
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
MIB = 2**20


def model_kwargs(args) -> dict:
    return dict(
        hidden_layers=args.layers,
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        ffn_hidden_size=4 * args.hidden,
        num_attention_heads=args.heads,
        max_seq_length=args.seq,
    )


# ---- worker (one rank) ------------------------------------------------------------------------
def worker(args) -> None:
    import torch
    import torch.distributed as torch_dist

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from memory_probe import saved_activation_bytes

    from libai import dist
    from libai.config import LazyCall
    from libai.models import GPTForPreTraining
    from libai.runtime.memory_estimator import TrainSettings, estimate_memory
    from libai.runtime.parallel import ModelRunner

    util = dist.setup_dist_util(
        {"context_parallel_size": args.cp, "device_type": args.device, "data_parallel_size": 1}
    )
    torch.manual_seed(0)
    model = GPTForPreTraining(**model_kwargs(args))
    runner = ModelRunner(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}
    batch = {k: v.to(util.device) for k, v in batch.items()}
    cuda = util.device.type == "cuda"

    def step():
        runner.forward_backward(batch)
        runner.optimizer_step(optimizer)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    saved = saved_activation_bytes(model, step)
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    times = []
    for _ in range(args.steps):
        torch_dist.barrier()
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times)
    torch_dist.all_reduce(slowest, op=torch_dist.ReduceOp.MAX)
    settings = TrainSettings(micro_batch_size=args.batch, seq_length=args.seq)
    row = estimate_memory(LazyCall(GPTForPreTraining)(**model_kwargs(args)), util.layout, settings)
    result = {
        "rank": util.rank,
        "saved": saved,
        "peak": peak,
        "predicted": row[util.rank].activations_micro_batch,
        "step_s": statistics.median(slowest.tolist()),
    }
    Path(args.out, f"rank{util.rank}.json").write_text(json.dumps(result))
    dist.destroy_dist()


# ---- driver -----------------------------------------------------------------------------------
def launch(args, cp: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={cp}", __file__, "--worker", "--cp", str(cp), "--out", out]
        cmd += [f"--{k}={v}" for k, v in shape_options(args).items()]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if proc.returncode:
            raise SystemExit(f"cp={cp} failed:\n{proc.stderr[-4000:]}")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(cp)]


def shape_options(args) -> dict:
    keys = ("layers", "hidden", "heads", "vocab", "seq", "batch", "steps", "warmup", "device")
    return {k: getattr(args, k) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    rows = {cp: launch(args, cp) for cp in (1, 2)}
    print(
        f"GPT {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, seq {args.seq}, "
        f"batch {args.batch}, {args.device}, {args.threads} thread(s) per rank"
    )
    print("| cp | rank | activations (MiB) | predicted (MiB) | peak alloc (MiB) | step (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for cp, results in rows.items():
        for r in results:
            peak = "-" if r["peak"] is None else f"{r['peak'] / MIB:.1f}"
            print(
                f"| {cp} | {r['rank']} | {r['saved'] / MIB:.1f} | {r['predicted'] / MIB:.1f} "
                f"| {peak} | {r['step_s']:.3f} |"
            )
    one, two = rows[1][0], rows[2]
    worst = max(r["saved"] for r in two)
    print(f"cp2 / cp1 activations per rank: {worst / one['saved']:.2f}")
    print(f"cp2 / cp1 step time: {two[0]['step_s'] / one['step_s']:.2f}")


if __name__ == "__main__":
    main()
