"""Mixed precision O2 against O1 (and fp32) on one device: peak memory, step time, losses.

One process builds libai's GPT (``GPTForPreTraining``, GPT-2 345M shapes by default: FleetX's
``pretrain_gpt_345M_single_card.yaml``) three times from the same seed and trains each on
the same random batches through the runtime (``parallelize`` + ``shard_optimizer_for`` +
``ModelRunner.forward_backward`` / ``optimizer_step``, as every door does), with AdamW
(fused on CUDA) and global-norm clipping at 1.0:

- **fp32**: no mixed precision (the baseline of the losses);
- **O1**: bf16 autocast, fp32 parameters, gradients and optimizer;
- **O2**: bf16 autocast, bf16 parameters and gradients (norms fp32), fp32 master weights in
  the optimizer (``libai/runtime/master_weights.py``).

Reported per row: the peak of ``torch.cuda.max_memory_allocated`` over the timed steps (on
CPU: not available, the row shows the live training-state bytes instead: parameters +
gradients after backward + optimizer state incl. masters), the median step time, tokens/s,
and the loss of the first and last step. The O2 / O1 ratios are printed at the end.

    python benchmarks/bench_amp_o2.py --device cuda            # GPT-2 345M, seq 1024, batch 8
    python benchmarks/bench_amp_o2.py --tiny                   # a CPU smoke run (~10 s)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libai import dist  # noqa: E402
from libai.models import GPTForPreTraining  # noqa: E402
from libai.runtime.parallelize import parallelize, shard_optimizer_for  # noqa: E402
from libai.runtime.spec import AmpSpec, RunSpec  # noqa: E402
from libai.runtime.zero import optimizer_state_bytes  # noqa: E402

SHAPES = {
    "345m": dict(layers=24, hidden=1024, heads=16, vocab=50304, seq=1024, batch=8),
    "tiny": dict(layers=2, hidden=64, heads=4, vocab=512, seq=64, batch=4),
}
ROWS = {
    "fp32": AmpSpec(enabled=False),
    "O1": AmpSpec(enabled=True, dtype="bf16", level="O1"),
    "O2": AmpSpec(enabled=True, dtype="bf16", level="O2"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rows", default="fp32,O1,O2")
    return p.parse_args(argv)


def state_bytes(model, optimizer) -> int:
    """Parameters and their gradients, the optimizer's own parameters where they are not the
    model's (O2's fp32 masters), and the optimizer state."""
    params = list(model.parameters())
    ids = {id(p) for p in params}
    params += [p for g in optimizer.param_groups for p in g["params"] if id(p) not in ids]
    tensors = params + [p.grad for p in model.parameters() if p.grad is not None]
    return sum(t.numel() * t.element_size() for t in tensors) + optimizer_state_bytes(optimizer)


def run_row(name: str, shape: dict, device: str, steps: int, warmup: int) -> dict:
    dist.setup_dist_util({"device_type": device})
    torch.manual_seed(0)
    model = GPTForPreTraining(
        hidden_layers=shape["layers"],
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        ffn_hidden_size=4 * shape["hidden"],
        num_attention_heads=shape["heads"],
        max_seq_length=shape["seq"],
        embedding_dropout_prob=0.0,
        attention_dropout_prob=0.0,
        output_dropout_prob=0.0,
    ).to(device)
    spec = RunSpec(amp=ROWS[name], num_accumulation_steps=1)
    parts = parallelize(model, spec)
    fused = {"fused": True} if device == "cuda" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    optimizer = shard_optimizer_for(parts, optimizer)
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"] + 1), generator=g)
        batches.append(
            {
                "input_ids": tokens[:, :-1].to(device),
                "labels": tokens[:, 1:].contiguous().to(device),
            }
        )
    runner, losses, times, held = parts.runner, [], [], 0
    for step in range(warmup + steps):
        if step == warmup and device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = runner.forward_backward(batches[step % len(batches)])
        if step == warmup + steps - 1:
            held = state_bytes(runner.model, optimizer)
        runner.optimizer_step(optimizer, max_grad_norm=1.0)
        losses.append(float(loss))  # reads the device: the step is complete
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    tokens = shape["batch"] * shape["seq"]
    step_s = statistics.median(times[warmup:])
    row = {
        "row": name,
        "peak_gib": None if peak is None else peak / 2**30,
        "state_gib": held / 2**30,
        "step_ms": step_s * 1e3,
        "tokens_per_s": tokens / step_s,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    del model, parts, runner, optimizer, batches
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv=None) -> None:
    args = parse_args(argv)
    shape = SHAPES["tiny" if args.tiny else "345m"]
    print(
        f"torch {torch.__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
        + f", shape {shape}"
    )
    rows = [run_row(n, shape, args.device, args.steps, args.warmup) for n in args.rows.split(",")]
    print("| row | peak GiB | state GiB | step ms | tokens/s | first loss | last loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        print(
            f"| {r['row']} | {peak} | {r['state_gib']:.3f} | {r['step_ms']:.1f} | "
            f"{r['tokens_per_s']:,.0f} | {r['first_loss']:.4f} | {r['last_loss']:.4f} |"
        )
    by = {r["row"]: r for r in rows}
    if "O1" in by and "O2" in by:
        o1, o2 = by["O1"], by["O2"]
        if o1["peak_gib"]:
            print(f"O2 / O1 peak memory: {o2['peak_gib'] / o1['peak_gib']:.3f}")
        print(f"O2 / O1 training-state bytes: {o2['state_gib'] / o1['state_gib']:.3f}")
        print(f"O2 / O1 step time: {o2['step_ms'] / o1['step_ms']:.3f}")


if __name__ == "__main__":
    main()
