"""Training MFU of a Llama-3.2-1B-shaped model: libai against transformers, eager and
compiled, in one command (issue 14's table).

Both models hold the same weights (the transformers model is saved and loaded into libai
with ``load_huggingface``), train on the same random batches with bf16 autocast, fp32 master
weights and AdamW (fused on CUDA), global-norm clipping at 1.0. A step is forward, backward,
clipping, the optimizer step and zeroing the gradients; the loss is read back only at the end
of each timed block, as a training loop logging every N steps would. libai's step is the
trainer's (``ModelRunner.forward_backward`` + ``optimizer_step``); transformers' the usual
loop on ``LlamaForCausalLM`` with ``attn_implementation="sdpa"``.

MFU = tokens/s x (6 N + 12 L H S) / peak FLOP/s (torchtitan's count: N parameters without
the embedding, L layers, H hidden, S sequence), with ``--peak-tflops`` (default 989: H100
SXM bf16 dense). Peak memory is ``torch.cuda.max_memory_allocated`` (on CPU: not reported).

    python benchmarks/bench_mfu.py --device cuda                     # the 1B table (a GPU)
    python benchmarks/bench_mfu.py --device cuda --loss-chunk-size 2048 --recompute selective
    python benchmarks/bench_mfu.py --tiny                             # a CPU smoke run
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import tempfile
import time
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke run)")
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
    p.add_argument(
        "--rows", default="libai eager,transformers eager,libai compiled,transformers compiled"
    )
    return p.parse_args(argv)


def flops_per_token(model: torch.nn.Module, shape: dict) -> float:
    """torchtitan's 6 N + 12 L H S (N without the embedding table)."""
    n = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name)
    return 6 * n + 12 * shape["layers"] * shape["hidden"] * shape["seq"]


def build(shape: dict, device: str, args) -> tuple:
    config = transformers.LlamaConfig(
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
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        extra = {}
        if args.loss_chunk_size and "loss_chunk_size" in _llama_options():
            extra["loss_chunk_size"] = args.loss_chunk_size
        libai = load_huggingface(tmp, LlamaForCausalLM, **extra)
    return hf.to(device), libai.to(device)


def _llama_options() -> set[str]:
    from libai.models import LlamaModel

    return set(inspect.signature(inspect.unwrap(LlamaModel.__init__)).parameters)


def optimizer_for(model, device):
    fused = {"fused": True} if device == "cuda" else {}
    return torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, **fused)


def time_steps(step, batches, warmup: int, steps: int, device: str) -> tuple[list[float], float]:
    """Per-step seconds (the device is synchronized once per block) and the last loss."""
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


def main(argv=None) -> int:
    args = parse_args(argv)
    shape = SHAPES["tiny" if args.tiny else "1b"]
    device = args.device
    dist.setup_dist_util({"device_type": device})
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]), generator=g).to(device)
        for _ in range(4)
    ]
    rows = [r.strip() for r in args.rows.split(",")]
    results = {}
    for row in rows:
        hf, libai = build(shape, device, args)
        side, mode = row.split()
        if side == "libai":
            model = libai
            if args.recompute != "none":
                enable_activation_checkpointing(model, args.recompute)
            if mode == "compiled":
                compile_layers(model)
            runner = ModelRunner(model, amp_dtype=torch.bfloat16)
            opt = optimizer_for(model, device)

            def step(ids, runner=runner, opt=opt):
                loss = runner.forward_backward({"input_ids": ids, "labels": ids})
                runner.optimizer_step(opt, max_grad_norm=1.0)
                return loss
        else:
            model = hf
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

        times, loss = time_steps(step, batches, args.warmup, args.steps, device)
        tokens = shape["batch"] * shape["seq"] / statistics.median(times)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
        results[row] = dict(tokens=tokens, loss=loss, peak=peak, fpt=flops_per_token(model, shape))
        del hf, libai, model, opt
        if device == "cuda":
            torch.cuda.empty_cache()
    print(
        f"\nLlama {'tiny' if args.tiny else '3.2-1B'} shapes {shape}; bf16 autocast, AdamW; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}"
        + (f"; loss chunk {args.loss_chunk_size}" if args.loss_chunk_size else "")
        + (f"; recompute {args.recompute}" if args.recompute != "none" else "")
    )
    print("\n| row | tokens/s | MFU | peak memory (GiB) | last loss |")
    print("|---|---:|---:|---:|---:|")
    for row, r in results.items():
        mfu = r["tokens"] * r["fpt"] / (args.peak_tflops * 1e12) if device == "cuda" else None
        mfu_text = f"{mfu:.1%}" if mfu is not None else "n/a (CPU)"
        peak_text = f"{r['peak']:.1f}" if r["peak"] is not None else "n/a"
        print(f"| {row} | {r['tokens']:,.0f} | {mfu_text} | {peak_text} | {r['loss']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
