"""LoRA training step: libai (adapters on its layers, ``train.lora``'s transform) against
Hugging Face PEFT on transformers, the same Llama, batch, adapters and optimizer.

Each contender runs in its own fresh process (the same imports in both), so its peak
resident memory (``ru_maxrss``) is its own: model, activations, the adapters' gradients and
AdamW state. Per process: ``--warmup`` steps, then ``--steps`` timed steps (forward,
backward, AdamW on the adapters); the contenders alternate for ``--repeats`` rounds and
medians are reported. Before timing, the first step's losses are checked equal (fp32).
Goals (issue 42, CPU): speed >= 1.0x PEFT, peak memory <= 1.0x PEFT.

    python benchmarks/bench_lora.py            # Llama 4 x 512, batch 4 x 256, r 8, 7 projections
    python benchmarks/bench_lora.py --tiny     # seconds
    python benchmarks/bench_lora.py --device cuda --dtype bfloat16 --hf-dir /models/Llama-3.2-1B
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import random_llama_dir

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-dir", default=None, help="a local Llama-family model (default: random)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--contender", choices=("libai", "peft"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.hidden, args.layers, args.vocab, args.batch, args.seq = 64, 2, 500, 2, 32
        args.warmup, args.steps, args.repeats = 5, 20, 3
    return args


def make_model_dir(args, directory: str) -> str:
    return random_llama_dir(directory, args.hidden, args.layers, args.vocab, args.seq)


def batch(args):
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(args.device)
    return ids


def run_one(args) -> dict:
    """In this process: one contender's first loss, step times and peak memory."""
    import torch

    dtype = getattr(torch, args.dtype)
    ids = batch(args)
    if args.contender == "peft":
        import peft
        import transformers

        base = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=dtype)
        model = peft.get_peft_model(
            base, peft.LoraConfig(r=args.r, lora_alpha=2 * args.r, target_modules=TARGETS)
        ).to(args.device)

        def loss_of():
            return model(input_ids=ids, labels=ids).loss
    else:
        from libai import dist
        from libai.models.lora import LoRAConfig, apply_lora
        from libai.models.utils import load_huggingface

        dist.setup_dist_util({"device_type": args.device})
        model = load_huggingface(args.hf_dir).to(args.device, dtype)
        apply_lora(
            model, LoRAConfig(target_modules=tuple(TARGETS), r=args.r, lora_alpha=2 * args.r)
        )

        def loss_of():
            return model(ids, labels=ids)["lm_loss"]

    model.train()  # B starts at zero in both (PEFT's start): the first losses are the base's
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    times, first = [], None
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        loss = loss_of()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        if first is None:
            first = float(loss)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"first_loss": first, "step": statistics.median(times), "peak": peak,
            "trainable": trainable}  # fmt: skip


def spawn(args, contender: str) -> dict:
    argv = [sys.executable, __file__, "--contender", contender, "--hf-dir", args.hf_dir]
    for key in ("hidden", "layers", "vocab", "batch", "seq", "r", "warmup", "steps", "device",
                "dtype"):  # fmt: skip
        argv += [f"--{key}", str(getattr(args, key))]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{contender} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(args) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        if args.hf_dir is None:
            args.hf_dir = make_model_dir(args, directory)
        runs = {"libai": [], "peft": []}
        for r in range(args.repeats):
            for name in ("libai", "peft") if r % 2 == 0 else ("peft", "libai"):
                runs[name].append(spawn(args, name))
    first = {n: v[0]["first_loss"] for n, v in runs.items()}
    if abs(first["libai"] - first["peft"]) > 1e-4:
        raise SystemExit(f"first losses differ: {first}")
    step = {n: statistics.median(r["step"] for r in v) for n, v in runs.items()}
    peak = {n: statistics.median(r["peak"] for r in v) for n, v in runs.items()}
    tokens = args.batch * args.seq
    print(
        f"\nLoRA step (forward, backward, AdamW), {args.device} {args.dtype}, "
        f"{platform.processor() or platform.machine()}; Llama {args.layers} x {args.hidden}, "
        f"batch {args.batch} x {args.seq}, r {args.r} on {len(TARGETS)} projections, "
        f"{runs['libai'][0]['trainable']:,} trainable; medians of {args.repeats} processes"
    )
    print("\n| contender | step (ms) | tokens/s | peak memory (MiB) |")
    print("|---|---:|---:|---:|")
    for name in runs:
        print(
            f"| {name} | {step[name] * 1e3:.1f} | {tokens / step[name]:,.0f} | "
            f"{peak[name] / 2**20:,.0f} |"
        )
    speed, memory = step["peft"] / step["libai"], peak["libai"] / peak["peft"]
    print(f"speed libai / peft: {speed:.2f}x (goal >= 1.0x: {'MET' if speed >= 1 else 'MISSED'})")
    print(f"peak memory libai / peft: {memory:.2f}x (goal <= 1.0x: "
          f"{'MET' if memory <= 1 else 'MISSED'})")  # fmt: skip
    return {"speed": speed, "memory": memory}


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.contender:
        print(json.dumps(run_one(arguments)))
    else:
        main(arguments)
