"""libai's ``LlamaForCausalLM`` against Hugging Face ``LlamaForCausalLM`` with the same weights.

Training throughput (forward + backward tokens/s) on one process (tp = dp = pp = 1). The target:
libai is not slower, i.e. tokens/s libai / HF >= 1.0.

The HF model is built from a ``LlamaConfig`` of the given shapes (random init, ``--seed``),
saved to a temporary directory, and loaded into libai with ``load_huggingface`` (the same
path users take), so both hold the same weights. Both run the same batches with unshifted
``labels = input_ids`` (each model shifts inside, transformers' loss), HF with
``attn_implementation="sdpa"`` (``--attn eager`` for the other one) and ``use_cache=False``.
The initial losses must agree (1e-4 in fp32), and every timed step's losses too (no optimizer:
the weights do not move, so each batch's loss repeats).

A step is forward + backward + ``zero_grad(set_to_none=True)`` + reading the loss as a float;
libai's is ``ModelRunner(model).forward_backward(batch)``, the trainer's own call. The two are
timed in interleaved blocks (A B, B A, ...; benchmarks/harness.py); the verdict is the median
over pairs of adjacent blocks of HF's median step time over libai's (= tokens/s libai / HF).

    python benchmarks/bench_llama_vs_hf.py                  # ~124M (hidden 768, 12 layers)
    python benchmarks/bench_llama_vs_hf.py --tiny           # seconds, a smoke test
    python benchmarks/bench_llama_vs_hf.py --device cuda --amp bf16 --batch 8 --seq 1024
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from harness import Contender, block_pair_ratios, print_step_table, run_interleaved

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transformers  # noqa: E402

from libai import dist  # noqa: E402
from libai.models.utils import load_huggingface  # noqa: E402
from libai.runtime.parallel import ModelRunner  # noqa: E402

TARGET_RATIO = 1.0  # tokens/s libai / HF
TINY = dict(
    hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=1000, seq=64, batch=2, repeats=4
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=2048, help="intermediate_size")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tie", action="store_true", help="tie the LM head to the embedding")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke test in seconds")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--amp", default="none", choices=["none", "bf16"], help="autocast dtype")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="HF attention")
    p.add_argument("--steps", type=int, default=2, help="timed steps per block")
    p.add_argument("--repeats", type=int, default=6, help="timed blocks per model")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per model")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--strict", action="store_true", help="exit 1 if the target is missed")
    args = p.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    return args


def build_hf(args) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(args.seq, 2048),
        tie_word_embeddings=args.tie,
        attention_dropout=0.0,
        use_cache=False,
        attn_implementation=args.attn,
    )
    torch.manual_seed(args.seed)
    model = transformers.LlamaForCausalLM(config)
    assert model.config._attn_implementation == args.attn, model.config._attn_implementation
    return model


def make_batches(args, device, n: int = 4) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(args.seed + 1)
    batches = []
    for _ in range(n):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
        batches.append({"input_ids": ids, "labels": ids})
    return batches


def hf_step(model, amp):
    def step(batch, optimizer):
        with amp():
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    return step


def libai_step(runner):
    def step(batch, optimizer):
        loss = runner.forward_backward(batch)
        runner.model.zero_grad(set_to_none=True)
        return loss.item()

    return step


def main(args: argparse.Namespace) -> float:
    """Build, check and time both models; print the figures; return tokens/s libai / HF."""
    if args.threads:
        torch.set_num_threads(args.threads)
    dist.setup_dist_util({"device_type": args.device})  # one process: tp = dp = pp = 1
    device = dist.get_dist_util().device
    amp_dtype = torch.bfloat16 if args.amp == "bf16" else None

    def amp():
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(args.device, dtype=amp_dtype)

    hf_model = build_hf(args)
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        libai_model = load_huggingface(tmp)
    hf_model.to(device).train()
    libai_model.train()
    batches = make_batches(args, device)
    with torch.no_grad(), amp():
        b = batches[0]
        l_hf = float(hf_model(**b).loss)
        l_libai = float(libai_model(**b)["lm_loss"])
    tol = 1e-4 if amp_dtype is None else 5e-2
    assert abs(l_libai - l_hf) < tol, f"initial losses differ: {l_libai} vs {l_hf}"

    runner = ModelRunner(libai_model, amp_dtype=amp_dtype)
    contenders = [
        Contender("libai", libai_step(runner), None),
        Contender("HF", hf_step(hf_model, amp), None),
    ]
    n_params = sum(p.numel() for p in hf_model.parameters())
    tokens = args.batch * args.seq
    print(
        f"Llama: layers={args.layers} hidden={args.hidden} heads={args.heads} "
        f"kv_heads={args.kv_heads} ffn={args.ffn} vocab={args.vocab} tied={args.tie} "
        f"seq={args.seq} batch={args.batch} ({n_params / 1e6:.1f}M params, {tokens} tokens/step)"
    )
    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    ) or platform.machine()
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {args.device} "
        f"({device_name}), {torch.get_num_threads()} threads, amp {args.amp}, HF attention "
        f"{args.attn!r}; initial loss libai {l_libai:.6f} HF {l_hf:.6f} "
        f"(|diff| {abs(l_libai - l_hf):.1e})"
    )
    print(
        f"{args.warmup} warmup steps, then {args.repeats} interleaved blocks x {args.steps} "
        "steps of forward + backward"
    )

    run_interleaved(contenders, batches, args.warmup, args.repeats, args.steps)

    libai, hf = contenders
    diffs = [abs(a - b) for a, b in zip(libai.losses, hf.losses)]
    print(f"max |loss libai - loss HF| over {len(diffs)} steps: {max(diffs):.1e}")
    assert max(diffs) < tol, "the two models diverged: not the same computation"
    wall, cpu = print_step_table(contenders, tokens)
    pairs = block_pair_ratios(hf, libai, args.steps)
    ratio = statistics.median(pairs)
    print()
    print(
        f"ratio tokens/s libai/HF: {ratio:.3f} (median of {len(pairs)} block pairs; "
        f"range {pairs[0]:.3f}-{pairs[-1]:.3f}); of median steps "
        f"{wall['HF'] / wall['libai']:.3f}; of CPU time {cpu['HF'] / cpu['libai']:.3f}"
    )
    print(f"target >= {TARGET_RATIO:.2f}: {'MET' if ratio >= TARGET_RATIO else 'MISSED'}")
    if not math.isfinite(libai.losses[-1]):
        raise SystemExit("libai loss is not finite")
    return ratio


if __name__ == "__main__":
    cli_args = parse_args()
    try:
        ratio = main(cli_args)
    finally:
        dist.destroy_dist()
    sys.exit(1 if cli_args.strict and ratio < TARGET_RATIO else 0)
