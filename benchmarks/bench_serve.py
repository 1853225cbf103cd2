"""Serving throughput and latency: libai's engine (continuous batching over a paged KV
cache) against (a) libai's own static batching and (b) transformers' continuous batching,
on the same model, the same fixed set of mixed-length requests, greedy, one process.

Requests: ``--requests`` prompts of seeded random lengths in ``[--min-prompt, --max-prompt]``
asking for seeded random ``[--min-new, --max-new]`` tokens each (eos ignored, so every
contender produces exactly the same tokens), all submitted at t = 0.

Contenders:

- ``libai-cb``: :class:`libai.serving.LLMEngine` (``--max-num-seqs`` running, chunked
  prefill within ``--max-num-batched-tokens``), stepped directly (no HTTP);
- ``libai-static``: :func:`libai.inference.generation.generate` on batches of
  ``--max-num-seqs`` requests in arrival order (left-padded; a batch runs until its
  longest request is done, the next waits for it);
- ``hf-cb``: transformers' ``ContinuousBatchingManager`` (same page size, batch-token
  budget and request cap), timestamps recorded by transformers.

Reported per contender: output tokens/s over the whole run, time to first token (TTFT:
from submission) p50/p99, inter-token latency (ITL) p50/p99. Each contender runs
``--repeats`` times, interleaved; medians are reported. Goals (issue 41, CPU): libai-cb
>= 1.5x libai-static and >= 1.0x hf-cb in output tokens/s. The tokens of all three are
checked equal before timing.

    python benchmarks/bench_serve.py             # Llama 4 x 512, 48 requests
    python benchmarks/bench_serve.py --tiny      # seconds, a smoke test
    python benchmarks/bench_serve.py --same-kv-memory 32   # cb: 32 sequences, static's KV memory
    python benchmarks/bench_serve.py --lora-adapters 4 --skip-hf   # + 4 adapters, one per request
    python benchmarks/bench_serve.py --device cuda --dtype bfloat16 --hf-dir /path/Qwen2-0.5B
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from harness import random_llama_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOALS = {"libai-static": 1.5, "hf-cb": 1.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-dir", default=None, help="a local Hugging Face model (default: random)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=192)
    p.add_argument("--min-new", type=int, default=16)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=16, help="static batch size, cb cap")
    p.add_argument(
        "--same-kv-memory",
        type=int,
        default=None,
        metavar="SEQS",
        help="libai-cb gets the static batch's KV slots (max-num-seqs x longest request) as "
        "its paged cache and may run SEQS sequences in them (preempting when full)",
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument(
        "--lora-adapters",
        type=int,
        default=0,
        metavar="N",
        help="also serve N random PEFT adapters (r --lora-r, every projection) beside the base, "
        "request i through adapter i %% N (libai-cb-lora), checked against transformers + PEFT",
    )
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    if args.tiny:
        args.hidden, args.layers, args.vocab, args.requests = 64, 2, 500, 12
        args.max_prompt, args.max_new, args.max_num_seqs, args.repeats = 40, 24, 4, 1
    return args


def build(args, directory: str):
    """The transformers model (saved to ``directory`` unless --hf-dir) and ours on its
    weights."""
    import transformers

    from libai import dist
    from libai.inference.generation.stepper import use_decode_layout
    from libai.models.utils import load_huggingface

    dtype = getattr(torch, args.dtype)
    if args.hf_dir is None:
        positions = args.max_prompt + args.max_new + 16
        args.hf_dir = random_llama_dir(directory, args.hidden, args.layers, args.vocab, positions)
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=dtype)
    hf = hf.to(args.device).eval()
    dist.setup_dist_util({"device_type": args.device})
    ours = load_huggingface(args.hf_dir).to(args.device, dtype).eval()
    use_decode_layout(ours)  # as TextGenerationPipeline and libai-serve load it (both ours)
    return hf, ours


def with_adapters(args, adapters: dict[str, str]):
    """Another copy of ours, serving ``adapters`` beside its base (``--lora-modules``)."""
    from libai.inference.generation.stepper import use_decode_layout
    from libai.models.lora_adapters import load_peft_adapters
    from libai.models.utils import load_huggingface

    model = load_huggingface(args.hf_dir).eval()
    load_peft_adapters(model, adapters)
    model = model.to(args.device, getattr(torch, args.dtype))
    use_decode_layout(model)
    return model


def make_requests(args) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(0)
    vocab = args.vocab - 1
    out = []
    for _ in range(args.requests):
        n = int(torch.randint(args.min_prompt, args.max_prompt + 1, (1,), generator=g))
        new = int(torch.randint(args.min_new, args.max_new + 1, (1,), generator=g))
        out.append((torch.randint(1, vocab, (n,), generator=g).tolist(), new))
    return out


class Run:
    """Per-request token times (seconds from t = 0) and tokens of one contender's run."""

    def __init__(self, count: int):
        self.times = [[] for _ in range(count)]
        self.tokens = [[] for _ in range(count)]
        self.wall = 0.0
        #: forward passes of the model (libai's contenders)
        self.forwards = 0

    def metrics(self) -> dict:
        ttft = [t[0] for t in self.times]
        itl = [b - a for t in self.times for a, b in zip(t, t[1:])]
        total = sum(len(t) for t in self.tokens)
        return {
            "tok/s": total / self.wall,
            "ttft_p50": _pct(ttft, 50),
            "ttft_p99": _pct(ttft, 99),
            "itl_p50": _pct(itl, 50),
            "itl_p99": _pct(itl, 99),
        }


def _pct(values, q) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def make_adapters(args, directory: str) -> dict[str, str]:
    """``--lora-adapters`` random PEFT adapters (A and B random: PEFT starts B at zero) on
    the base, saved under ``directory``."""
    import peft
    import transformers

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    out = {}
    for n in range(args.lora_adapters):
        base = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir)
        config = peft.LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules=targets)
        model = peft.get_peft_model(base, config)
        g = torch.Generator().manual_seed(100 + n)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        out[f"adapter{n}"] = str(Path(directory) / f"adapter{n}")
        model.save_pretrained(out[f"adapter{n}"])
    return out


def check_adapters(run: Run, requests, adapters: dict[str, str], args) -> None:
    """Request ``i`` (for each adapter's first request) equals transformers + PEFT's greedy
    tokens with that adapter."""
    import peft
    import transformers

    for i, path in enumerate(adapters.values()):
        base = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32)
        model = peft.PeftModel.from_pretrained(base, path).eval()
        prompt, new = requests[i]
        ids = torch.tensor([prompt])
        want = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
            min_new_tokens=new, pad_token_id=0, eos_token_id=None,
        )[0, len(prompt) :].tolist()  # fmt: skip
        if run.tokens[i] != want:
            raise SystemExit(f"libai-cb-lora differs from transformers + PEFT on request {i}")


def run_libai_cb(model, requests, args, adapters: int = 0) -> Run:
    from libai.layers.paged_kv_cache import PagedKVCache
    from libai.serving import EngineConfig, LLMEngine, ModelExecutor, SamplingParams

    longest = args.max_prompt + args.max_new + 1
    seqs, blocks = args.max_num_seqs, None
    if args.same_kv_memory:  # the static batch's cache: every row at the longest length
        seqs = args.same_kv_memory
        blocks = args.max_num_seqs * -(-longest // args.block_size)
    config = EngineConfig(
        max_model_len=longest,
        max_num_seqs=seqs,
        max_num_batched_tokens=max(args.max_num_batched_tokens, seqs),
        block_size=args.block_size,
        num_blocks=blocks,
    )
    cache = PagedKVCache(config.blocks(), config.block_size)
    engine = LLMEngine(ModelExecutor(model, cache, args.device), config=config)
    run = Run(len(requests))
    start = time.perf_counter()
    index = {}
    for i, (prompt, new) in enumerate(requests):
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        (seq,) = engine.add_request(prompt, params, adapter=i % adapters if adapters else -1)
        index[seq.seq_id] = i
    while engine.has_work():
        outputs = engine.step()
        run.forwards += 1
        _sync(args.device)
        now = time.perf_counter() - start
        for out in outputs:
            i = index[out.seq.seq_id]
            run.times[i].append(now)
            run.tokens[i].append(out.token_id)
    run.wall = time.perf_counter() - start
    return run


def run_libai_static(model, requests, args) -> Run:
    from libai.inference.generation import ModelStepper, generate

    stepper = ModelStepper(model)
    run = Run(len(requests))
    start = time.perf_counter()
    for first in range(0, len(requests), args.max_num_seqs):
        batch = requests[first : first + args.max_num_seqs]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (prompt, _) in enumerate(batch):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        steps = []

        def streamer(tokens, steps=steps):
            _sync(args.device)
            steps.append(time.perf_counter() - start)

        out = generate(
            stepper,
            ids.to(args.device),
            mask.to(args.device),
            max_new_tokens=max(n for _, n in batch),
            pad_token_id=0,
            eos_token_id=None,
            streamer=streamer,
        )
        run.forwards += len(steps)
        for row, (_, new) in enumerate(batch):
            i = first + row
            run.tokens[i] = out[row, width : width + new].tolist()
            run.times[i] = steps[:new]
    run.wall = time.perf_counter() - start
    return run


def run_hf_cb(hf, requests, args) -> Run:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gc = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0, max_new_tokens=8)
    blocks = args.max_num_seqs * -(-(args.max_prompt + args.max_new) // args.block_size)
    cb = ContinuousBatchingConfig(  # the same pages, token budget and cap as libai-cb
        page_size=args.block_size,
        num_blocks=blocks,
        max_batch_tokens=max(args.max_num_batched_tokens, args.same_kv_memory or 0),
        max_requests_per_batch=args.same_kv_memory or args.max_num_seqs,
    )
    manager = hf.init_continuous_batching(generation_config=gc, continuous_batching_config=cb)
    manager.start()
    run = Run(len(requests))
    try:
        start_clock = time.perf_counter()
        ids = [
            manager.add_request(prompt, max_new_tokens=new, record_timestamps=True)
            for prompt, new in requests
        ]
        index = {rid: i for i, rid in enumerate(ids)}
        done = 0
        while done < len(requests):
            out = manager.get_result(timeout=10)
            if out is None:
                continue
            i = index[out.request_id]
            run.tokens[i] = list(out.generated_tokens)
            run.times[i] = [t - start_clock for t in out.timestamps]
            done += 1
        run.wall = max(t[-1] for t in run.times)
    finally:
        manager.stop(block=True)
    return run


def print_step_bound(forwards: dict, total: int, args) -> None:
    """How far fewer forward passes alone can take continuous batching: at most
    ``max-num-seqs`` tokens come out of one decode pass, so no schedule needs fewer than
    ``total / max-num-seqs`` passes; where a pass costs the same in both (a memory-bound
    decode step reads every weight once, whatever its batch), the speedup over static
    batching is at most its passes over that floor."""
    floor = -(-total // (args.same_kv_memory or args.max_num_seqs))
    static, cb = forwards["libai-static"], forwards["libai-cb"]
    print(
        f"forward passes: libai-static {static}, libai-cb {cb} (no schedule of these requests "
        f"needs fewer than {floor}); at equal cost per pass, continuous batching can be at "
        f"most {static / floor:.2f}x static batching (this run's passes: {static / cb:.2f}x)"
    )


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(args) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        hf, ours = build(args, directory)
        requests = make_requests(args)
        contenders = {
            "libai-cb": lambda: run_libai_cb(ours, requests, args),
            "libai-static": lambda: run_libai_static(ours, requests, args),
        }
        if not args.skip_hf:
            contenders["hf-cb"] = lambda: run_hf_cb(hf, requests, args)
        adapters = make_adapters(args, directory) if args.lora_adapters else {}
        if adapters:
            served = with_adapters(args, adapters)
            contenders["libai-cb-lora"] = lambda: run_libai_cb(
                served, requests, args, len(adapters)
            )
        with torch.no_grad():
            warm = {name: fn() for name, fn in contenders.items()}  # warm-up, and the check
            if adapters:
                check_adapters(warm.pop("libai-cb-lora"), requests, adapters, args)
            for name, run in warm.items():
                for i, tokens in enumerate(run.tokens):
                    if tokens != warm["libai-cb"].tokens[i]:
                        raise SystemExit(f"{name} differs from libai-cb on request {i}")
            forwards = {name: warm[name].forwards for name in ("libai-cb", "libai-static")}
            results = {name: [] for name in contenders}
            for r in range(args.repeats):
                order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
                for name in order:
                    results[name].append(contenders[name]().metrics())
    medians = {
        name: {k: statistics.median(m[k] for m in runs) for k in runs[0]}
        for name, runs in results.items()
    }
    total = sum(new for _, new in requests)
    print(
        f"\nserving {args.requests} requests (prompts {args.min_prompt}-{args.max_prompt}, "
        f"new {args.min_new}-{args.max_new}, {total} output tokens), {args.device} "
        f"{args.dtype}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, max-num-seqs {args.max_num_seqs}, batch tokens "
        f"{args.max_num_batched_tokens}; medians of {args.repeats}"
    )
    if args.same_kv_memory:
        print(
            f"libai-cb: up to {args.same_kv_memory} sequences in the static batch's KV slots "
            f"({args.max_num_seqs} x {args.max_prompt + args.max_new + 1})"
        )
    print(
        "\n| contender | output tok/s | TTFT p50 (s) | TTFT p99 (s) | ITL p50 (ms) | ITL p99 (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, m in medians.items():
        print(
            f"| {name} | {m['tok/s']:.1f} | {m['ttft_p50']:.2f} | {m['ttft_p99']:.2f} | "
            f"{m['itl_p50'] * 1e3:.1f} | {m['itl_p99'] * 1e3:.1f} |"
        )
    if "libai-cb-lora" in medians:
        ratio = medians["libai-cb-lora"]["tok/s"] / medians["libai-cb"]["tok/s"]
        print(
            f"libai-cb-lora ({args.lora_adapters} adapters of r {args.lora_r}, one per request, "
            f"mixed in every batch) / libai-cb: {ratio:.2f}x output tok/s"
        )
    print_step_bound(forwards, total, args)
    ours_speed = medians["libai-cb"]["tok/s"]
    for name, goal in GOALS.items():
        if name in medians:
            ratio = ours_speed / medians[name]["tok/s"]
            verdict = "MET" if ratio >= goal else "MISSED"
            print(f"libai-cb / {name}: {ratio:.2f}x output tok/s (goal >= {goal}x: {verdict})")
    return medians


if __name__ == "__main__":
    main(parse_args())
