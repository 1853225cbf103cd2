"""Training MFU of a Llama-3.2-1B-shaped model: libai against transformers, eager and
compiled, in one command (issue 14's table).

Both models hold the same weights: one seeded transformers model is built once per process
(on the GPU when there is one, for a fast init), saved once to a temporary directory, and each
row loads only its side from there (transformers: ``from_pretrained`` in fp32 with
``attn_implementation="sdpa"``; libai: ``load_huggingface``). Both train on the same random
batches with bf16 autocast, fp32 master weights and AdamW (fused on CUDA), global-norm
clipping at 1.0. A step is forward, backward, clipping, the optimizer step and zeroing the
gradients; the loss is read back only at the end of each timed block, as a training loop
logging every N steps would. libai's step is the trainer's (``ModelRunner.forward_backward``
+ ``optimizer_step``); transformers' the usual loop on ``LlamaForCausalLM``.

Rows (``--rows``, comma list): "libai eager", "libai compiled" (``compile_layers``: each
block compiled), "libai compiled-model" (the whole model compiled, ``model.compile()``),
"transformers eager", "transformers compiled" (each decoder layer compiled). A failing row
prints its traceback and the run goes on with the next.

MFU = tokens/s x (6 N + 12 L H S) / peak FLOP/s (torchtitan's count: N parameters without
the embedding, L layers, H hidden, S sequence), against ``--peak-tflops`` (default 989: H100
SXM bf16 dense) and, on CUDA, against the measured peak of an 8192^3 bf16 matmul. Peak memory
is ``torch.cuda.max_memory_allocated`` (on CPU: not reported).

    python benchmarks/bench_mfu.py --device cuda                     # the 1B table (a GPU)
    python benchmarks/bench_mfu.py --device cuda --loss-chunk-size 2048 --recompute selective
    python benchmarks/bench_mfu.py --device cuda --profile "libai compiled" --json mfu.json
    python benchmarks/bench_mfu.py --tiny                             # a CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transformers  # noqa: E402

from libai import dist  # noqa: E402
from libai.models import LlamaForCausalLM  # noqa: E402
from libai.models.utils import load_huggingface  # noqa: E402
from libai.runtime.blocks import compile_layers, enable_activation_checkpointing  # noqa: E402
from libai.runtime.parallel import ModelRunner  # noqa: E402

#: Llama-3.2-1B: hidden 2048, 16 layers, 32 heads / 8 kv heads, ffn 8192, vocab 128256, tied
SHAPES = {
    "1b": dict(
        hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256, seq=2048, batch=4
    ),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=1000, seq=64, batch=2),
}
ROWS = (
    "libai eager",
    "transformers eager",
    "libai compiled",
    "transformers compiled",
    "libai compiled-model",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the shape's)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the shape's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument(
        "--loss-chunk-size",
        type=int,
        default=None,
        help="libai: the chunked LM loss (tokens per chunk)",
    )
    p.add_argument("--recompute", choices=["none", "full", "selective"], default="none")
    p.add_argument("--rows", default=",".join(ROWS[:4]), help="comma list of: " + ", ".join(ROWS))
    p.add_argument("--profile", default=None, metavar="ROW", help="torch.profiler over 3 steps")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"--rows: unknown {unknown}; choose from {list(ROWS)}")
    if args.profile is not None and args.profile not in args.rows:
        p.error(f"--profile: one of the rows run, {args.rows}")
    return args


def hf_config(shape: dict):
    return transformers.LlamaConfig(
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        intermediate_size=shape["ffn"],
        vocab_size=shape["vocab"],
        max_position_embeddings=shape["seq"],
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )


def flops_per_token(model: torch.nn.Module, shape: dict) -> tuple[float, int]:
    """torchtitan's 6 N + 12 L H S (N without the embedding table); returns (flops, N)."""
    n = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name)
    return 6 * n + 12 * shape["layers"] * shape["hidden"] * shape["seq"], n


def save_random_model(shape: dict, device: str, directory: str) -> tuple[float, int]:
    """Build the seeded random transformers model once (on the GPU if possible: a fast
    init), save it to ``directory`` and return ``flops_per_token`` of it."""
    config = hf_config(shape)
    hf = None
    if device == "cuda":
        try:
            torch.manual_seed(0)
            with torch.device("cuda"):
                hf = transformers.LlamaForCausalLM(config)
        except Exception as e:  # fall back to the CPU init
            print(f"init on cuda failed ({e!r}); building on the CPU", flush=True)
            hf = None
            gc.collect()
            torch.cuda.empty_cache()
    if hf is None:
        torch.manual_seed(0)
        hf = transformers.LlamaForCausalLM(config)
    fpt = flops_per_token(hf, shape)
    hf.to("cpu").save_pretrained(directory)
    del hf
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return fpt


def _llama_options() -> set[str]:
    from libai.models import LlamaModel

    return set(inspect.signature(inspect.unwrap(LlamaModel.__init__)).parameters)


def optimizer_for(model, device):
    fused = {"fused": True} if device == "cuda" else {}
    return torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, **fused)


def measured_peak_tflops(device: str) -> float | None:
    """bf16 TFLOP/s of an 8192^3 matmul (3 warm-ups, mean of 10 timed); None on CPU."""
    if device != "cuda":
        return None
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        c = a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / 10
    del a, b, c
    torch.cuda.empty_cache()
    return 2 * n**3 / seconds / 1e12


def time_steps(step, batches, warmup: int, steps: int, device: str) -> tuple[list[float], float]:
    """Per-step seconds (the device is synchronized after each step) and the last loss."""
    for i in range(warmup):
        step(batches[i % len(batches)])
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for i in range(steps):
        start = time.perf_counter()
        loss = step(batches[i % len(batches)])
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times, float(loss)


def busy_fraction(events, device_type, wall_us: float) -> float:
    """The fraction of ``wall_us`` during which at least one ``device_type`` event (kernels,
    copies; user annotations left out) ran: the union of their intervals over the wall."""
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == device_type and not getattr(e, "is_user_annotation", False)
    )
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if s >= end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy / wall_us


def profile_steps(step, batches, device: str, steps: int = 3) -> None:
    """torch.profiler over ``steps`` steps: the top-15 table and the GPU's busy fraction."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    sort_by = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort_by, row_limit=15), flush=True)
    print(f"profiled {steps} steps: {wall * 1e3 / steps:.1f} ms/step (with profiler overhead)")
    if device == "cuda":
        frac = busy_fraction(prof.events(), DeviceType.CUDA, wall * 1e6)
        print(f"GPU busy (union of kernel/copy time / wall): {frac:.1%}", flush=True)


def make_step(row: str, tmp: str, device: str, args):
    """Load the row's side from ``tmp`` and return (step, model, optimizer)."""
    side, mode = row.split()
    if side == "libai":
        extra = {}
        if args.loss_chunk_size and "loss_chunk_size" in _llama_options():
            extra["loss_chunk_size"] = args.loss_chunk_size
        model = load_huggingface(tmp, LlamaForCausalLM, **extra).to(device)
        model.train()
        if args.recompute != "none":
            enable_activation_checkpointing(model, args.recompute)
        if mode == "compiled":
            compile_layers(model)
        elif mode == "compiled-model":
            model.compile()  # torch.compile of the whole model, in place (same module)
        runner = ModelRunner(model, amp_dtype=torch.bfloat16)
        opt = optimizer_for(model, device)

        def step(ids, runner=runner, opt=opt):
            loss = runner.forward_backward({"input_ids": ids, "labels": ids})
            runner.optimizer_step(opt, max_grad_norm=1.0)
            return loss

        return step, model, opt
    if mode == "compiled-model":
        raise ValueError("compiled-model is a libai row")
    model = transformers.LlamaForCausalLM.from_pretrained(
        tmp, attn_implementation="sdpa", dtype=torch.float32
    ).to(device)
    model.train()
    if args.recompute != "none":
        model.gradient_checkpointing_enable()
    if mode == "compiled":
        for layer in model.model.layers:
            layer.compile()
    opt = optimizer_for(model, device)

    def step(ids, model=model, opt=opt):
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step, model, opt


def run_row(row: str, tmp: str, batches, shape: dict, fpt: float, measured, args) -> dict:
    device = args.device
    step, model, opt = make_step(row, tmp, device, args)
    times, loss = time_steps(step, batches, args.warmup, args.steps, device)
    median = statistics.median(times)
    tokens = shape["batch"] * shape["seq"] / median
    result = dict(
        tokens_per_s=tokens,
        step_ms=median * 1e3,
        loss=loss,
        peak_gib=torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
        mfu=tokens * fpt / (args.peak_tflops * 1e12) if device == "cuda" else None,
        mfu_measured=tokens * fpt / (measured * 1e12) if measured else None,
    )
    print(f"  {row}: {_line(result)}", flush=True)
    if args.profile == row:
        try:
            profile_steps(step, batches, device)
        except Exception:  # the profile is extra: report and go on
            print(f"profile of {row!r} failed:", flush=True)
            traceback.print_exc()
            sys.stderr.flush()
    del step, model, opt
    return result


def _pct(x) -> str:
    return f"{x:.1%}" if x is not None else "n/a"


def _line(r: dict) -> str:
    peak = f"{r['peak_gib']:.1f} GiB" if r["peak_gib"] is not None else "n/a"
    return (
        f"{r['tokens_per_s']:,.0f} tokens/s ({r['step_ms']:.1f} ms/step), MFU {_pct(r['mfu'])}, "
        f"MFU (measured peak) {_pct(r['mfu_measured'])}, peak memory {peak}, "
        f"last loss {r['loss']:.4f}"
    )


def free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    try:
        torch._dynamo.reset()  # compiled rows do not share caches with the next row
    except Exception:
        pass


def main(argv=None) -> int:
    args = parse_args(argv)
    shape = dict(SHAPES["tiny" if args.tiny else "1b"])
    if args.seq:
        shape["seq"] = args.seq
    if args.batch:
        shape["batch"] = args.batch
    device = args.device
    dist.setup_dist_util({"device_type": device})
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        measured = measured_peak_tflops(device)
    except Exception:  # the nominal peak still gives an MFU
        traceback.print_exc()
        measured = None
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]), generator=g).to(device)
        for _ in range(4)
    ]
    report = dict(
        shape=shape,
        device=torch.cuda.get_device_name() if device == "cuda" else "CPU",
        torch=torch.__version__,
        transformers=transformers.__version__,
        peak_tflops=args.peak_tflops,
        measured_peak_tflops=measured,
        loss_chunk_size=args.loss_chunk_size,
        recompute=args.recompute,
        rows={},
    )
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        fpt, n = save_random_model(shape, device, tmp)
        report.update(flops_per_token=fpt, params_without_embedding=n)
        print(
            f"Llama {'tiny' if args.tiny else '3.2-1B'} shapes {shape}; bf16 autocast, AdamW; "
            f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"{report['device']}"
            + (f"; loss chunk {args.loss_chunk_size}" if args.loss_chunk_size else "")
            + (f"; recompute {args.recompute}" if args.recompute != "none" else "")
            + f"\nFLOPs/token = 6N + 12·L·H·S (N without embedding) = 6×{n:,} + "
            f"12×{shape['layers']}×{shape['hidden']}×{shape['seq']} = {fpt:.4g}"
            + f"\npeak: {args.peak_tflops:g} TFLOP/s (nominal); measured bf16 8192^3 matmul: "
            + (f"{measured:.1f} TFLOP/s" if measured else "n/a (CPU)")
            + f"\nrandom model built and saved in {time.perf_counter() - start:.1f} s",
            flush=True,
        )
        for row in args.rows:
            start = time.perf_counter()
            try:
                report["rows"][row] = run_row(row, tmp, batches, shape, fpt, measured, args)
            except Exception as e:  # a failing row must not lose the others
                print(f"  {row}: FAILED ({e!r})", flush=True)
                traceback.print_exc()
                sys.stderr.flush()
                report["rows"][row] = dict(error=repr(e))
            report["rows"][row]["row_seconds"] = time.perf_counter() - start
            free_memory(device)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2))
    print("\n| row | tokens/s | MFU | MFU (measured peak) | peak memory (GiB) | last loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for row, r in report["rows"].items():
        if "error" in r:
            print(f"| {row} | failed | - | - | - | - |")
            continue
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "n/a"
        mfu = _pct(r["mfu"]) if r["mfu"] is not None else "n/a (CPU)"
        print(
            f"| {row} | {r['tokens_per_s']:,.0f} | {mfu} | {_pct(r['mfu_measured'])} | {peak} "
            f"| {r['loss']:.4f} |"
        )
    if args.json:
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
