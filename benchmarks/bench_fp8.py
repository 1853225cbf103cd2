"""FP8 training (``train.amp.fp8``) against bf16 on one device: step time and the loss curve.

One Llama-3.2-1B-shaped libai model (hidden 2048, 16 layers, 32 heads / 8 kv heads, ffn 8192,
vocab 128256, tied) is built once from a seed; each row trains a copy of it through the
runtime (``parallelize`` with ``amp`` bf16 autocast and the row's ``fp8`` recipe, per-block
compile, fused AdamW, clipping at 1.0) on the same batches: ``--batches`` random batches in
turn, so the loss falls (the model memorizes them) and the curves can be compared. The losses
stay on the device until the end (no host sync in the loop); the step time is the median of
per-step times after ``--warmup`` steps (each step synchronized, which at these step times is
noise).

Printed per row: step ms, tokens/s, MFU (6N + 12·L·H·S per token over ``--peak-tflops``),
speed-up over bf16, first and last loss, and the largest relative loss gap to bf16 over the
steps after warm-up. Goals (issue 44): step time bf16 / fp8 >= 1.15, losses within 1 %.

    python benchmarks/bench_fp8.py --device cuda                   # 1B, seq 4096, 100 steps
    python benchmarks/bench_fp8.py --tiny                          # a CPU smoke run (emulated)
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libai import dist  # noqa: E402
from libai.layers.float8 import enable_float8_training  # noqa: E402
from libai.models import LlamaForCausalLM  # noqa: E402
from libai.runtime.parallelize import parallelize  # noqa: E402
from libai.runtime.spec import AmpSpec, RunSpec  # noqa: E402

SHAPES = {
    "1b": dict(
        hidden_size=2048,
        hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
    ),
    "tiny": dict(
        hidden_size=64,
        hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=512,
    ),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tiny", action="store_true", help="tiny shapes, emulated float8")
    p.add_argument("--rows", default="bf16,tensorwise,rowwise", help="bf16 and fp8 recipes")
    p.add_argument("--seq", type=int, default=None, help="default 4096 (tiny: 64)")
    p.add_argument("--batch", type=int, default=None, help="default 2 (tiny: 2)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batches", type=int, default=8, help="distinct batches, taken in turn")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument(
        "--emulate",
        action="store_true",
        help="fp8 rows: emulated float8 (scaling and casts, high-precision matmul) even on a "
        "GPU with float8 matmuls, to tell the hardware gemm's numerics from float8's",
    )
    p.add_argument("--min-size", choices=["auto", "off"], default="auto", help="layer filter")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


def flops_per_token(model, cfg: dict, seq: int) -> float:
    n = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name)
    return 6 * n + 12 * cfg["hidden_layers"] * cfg["hidden_size"] * seq


def run_row(base, recipe, batches, args, fpt) -> dict:
    model = copy.deepcopy(base)
    min_size = args.min_size == "auto"
    if recipe and args.emulate:  # converted here, so the run spec leaves fp8 off
        enable_float8_training(model, recipe, emulate=True, min_size=min_size)
    spec_fp8 = None if args.emulate else recipe
    spec = RunSpec(
        amp=AmpSpec(enabled=True, dtype="bf16", fp8=spec_fp8, fp8_min_size=min_size),
        num_accumulation_steps=1,
    )
    runner = parallelize(model, spec, compile=not args.no_compile).runner
    converted = sum(getattr(m, "float8", None) is not None for m in model.modules())
    fused = {"fused": True} if args.device == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, **fused)
    losses, times = [], []
    for step in range(args.steps):
        ids = batches[step % len(batches)]
        start = time.perf_counter()
        losses.append(runner.forward_backward({"input_ids": ids, "labels": ids}))
        runner.optimizer_step(opt, max_grad_norm=1.0)
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    losses = [float(x) for x in torch.stack(losses).float().cpu()]
    step_s = statistics.median(times[args.warmup :])
    tokens = batches[0].numel() / step_s
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    del model, runner, opt
    if args.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return dict(
        recipe=recipe or "bf16",
        converted=converted,
        step_ms=step_s * 1e3,
        tokens=tokens,
        mfu=tokens * fpt / (args.peak_tflops * 1e12) if args.device == "cuda" else None,
        peak_gib=peak,
        losses=losses,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = SHAPES["tiny" if args.tiny else "1b"]
    seq = args.seq or (64 if args.tiny else 4096)
    batch = args.batch or 2
    dist.setup_dist_util({"device_type": args.device})
    torch.manual_seed(0)
    base = LlamaForCausalLM(**cfg, max_position_embeddings=seq, tie_word_embeddings=True)
    base = base.to(args.device)
    fpt = flops_per_token(base, cfg, seq)
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, cfg["vocab_size"], (batch, seq), generator=g).to(args.device)
        for _ in range(args.batches)
    ]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (emulated)"
    print(
        f"Llama {'tiny' if args.tiny else '3.2-1B'} {cfg}, seq {seq}, batch {batch}; "
        f"{args.steps} steps over {args.batches} batches; bf16 autocast, AdamW lr {args.lr}; "
        f"compile {not args.no_compile}; emulated fp8 {args.emulate}; torch {torch.__version__}, {device_name}",
        flush=True,
    )
    rows = []
    for name in [r.strip() for r in args.rows.split(",") if r.strip()]:
        recipe = None if name == "bf16" else name
        try:
            row = run_row(base, recipe, batches, args, fpt)
        except Exception as exc:  # one failing row must not lose the others
            import traceback

            traceback.print_exc()
            print(f"row {name} failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        rows.append(row)
        print(
            f"  {row['recipe']}: {row['converted']} fp8 layers, {row['step_ms']:.1f} ms/step, "
            f"{row['tokens']:,.0f} tok/s, losses {row['losses'][0]:.4f} -> "
            f"{row['losses'][-1]:.4f}",
            flush=True,
        )
    ref = next((r for r in rows if r["recipe"] == "bf16"), None)
    print(
        "\n| row | fp8 layers | step ms | tokens/s | MFU | vs bf16 | peak GiB | first loss "
        "| last loss | max loss gap to bf16 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speed = f"{ref['step_ms'] / r['step_ms']:.3f}" if ref else "-"
        gap = "-"
        if ref and r is not ref:
            pairs = list(zip(r["losses"], ref["losses"]))[args.warmup :]
            r["max_gap"] = max(abs(a - b) / abs(b) for a, b in pairs)
            gap = f"{r['max_gap']:.2%}"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "n/a"
        print(
            f"| {r['recipe']} | {r['converted']} | {r['step_ms']:.1f} | {r['tokens']:,.0f} "
            f"| {mfu} | {speed} | {peak} | {r['losses'][0]:.4f} | {r['losses'][-1]:.4f} "
            f"| {gap} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
