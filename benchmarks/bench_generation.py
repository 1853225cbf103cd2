"""Generation tokens/s: libai's ``generate`` against transformers' ``generate``, same weights.

Greedy decoding of ``--new-tokens`` (128) tokens after a prompt of ``--prompt-len`` (16)
random tokens, one process, for random models: GPT-2 small (``GPT2Config()`` defaults,
124M), a ~100M Llama (hidden 768, ffn 2048, 10 layers, 12 heads / 4 kv heads, vocab 32000)
and ``llama1b``, Llama-3.2-1B's shapes (hidden 2048, ffn 8192, 16 layers, 32 heads / 8 kv
heads, vocab 128256, tied embeddings), at batch 1 and 8. The target: tokens/s libai / HF >= 1.2.

``--dtype bf16`` casts both models' weights to bf16 after loading (the bf16 serving path;
``--amp bf16`` is autocast over fp32 weights instead). Beside each case: the weights-over-
bandwidth bound, ``batch x bandwidth / weight bytes`` tokens/s (every decode step reads all
the weights; weight bytes: the libai model's parameters and buffers in its dtype), with the
bandwidth measured on CUDA (a 1 GiB device-to-device copy, read + write) or ``--bandwidth-gbs``.

Each HF model is built with a fixed seed, saved to a temporary directory and loaded into libai
with ``load_huggingface`` (the path users take), so both hold the same weights. libai runs
``generate(ModelStepper(model, decode_layout=True), ...)``; HF runs ``model.generate(...,
do_sample=False)`` under ``torch.no_grad()``; neither stops early (no eos). The new tokens of
the two are compared (random models can have near-ties, so a mismatch is reported, not fatal).

Fixed-shape decoding (``--paths``, default all three): besides that default "dynamic" path
(libai's growing ``KVCache``, transformers' ``DynamicCache``), "static" runs libai with
``ModelStepper(..., static_cache=True)`` and transformers with
``cache_implementation="static"``; "compiled" runs libai with ``compile=True`` (the static
cache plus a ``torch.compile``'d decode step: default mode on CPU, CUDA graphs on CUDA) and
transformers with ``cache_implementation="static"`` and a ``CompileConfig`` (mode "default"
and ``_compile_all_devices`` on CPU, its "reduce-overhead" default on CUDA). The warm-up run
includes the compilation. A second table gives every path's tokens/s and its agreement with
libai's dynamic path. ``--skip`` leaves contenders out (e.g. "HF compiled"; they print "-"),
a contender that raises is reported and left out of the rest of its case, and a failing case
is reported and the run goes on; ``--json`` writes the rows.

The contenders are timed in interleaved runs (A B C .., .. C B A, ...; benchmarks/harness.py)
after one warm-up each; the figure is the median wall time of a ``generate`` call. Peak memory is the peak
increase of memory during one ``generate`` call with the model already loaded: on CPU the peak
RSS (VmHWM, reset through /proc/self/clear_refs) of a fresh subprocess per contender
(this script with ``--memory-only``), on CUDA ``torch.cuda.max_memory_allocated``.

    python benchmarks/bench_generation.py                   # the four cases, CPU
    python benchmarks/bench_generation.py --tiny            # seconds, a smoke test
    python benchmarks/bench_generation.py --models llama --batches 8 --threads 2
    python benchmarks/bench_generation.py --device cuda --amp bf16
    python benchmarks/bench_generation.py --paths dynamic,compiled   # skip the static rows
    python benchmarks/bench_generation.py --device cuda --models llama1b --dtype bf16 --json g.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from harness import Contender, run_interleaved

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transformers  # noqa: E402

from libai import dist  # noqa: E402
from libai.inference.generation import ModelStepper, generate  # noqa: E402
from libai.models.utils import load_huggingface  # noqa: E402

TARGET_RATIO = 1.2  # tokens/s libai / HF
MODELS = ("gpt2", "llama", "llama1b")
PATHS = ("dynamic", "static", "compiled")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,llama", help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated: " + ", ".join(PATHS))
    p.add_argument("--tiny", action="store_true", help="tiny models: a smoke test in seconds")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--amp", default="none", choices=["none", "bf16"], help="autocast dtype")
    p.add_argument(
        "--dtype", default="fp32", choices=list(DTYPES), help="both models' weights (cast)"
    )
    p.add_argument(
        "--bandwidth-gbs", type=float, default=None, help="device memory bandwidth (GB/s)"
    )
    p.add_argument(
        "--skip",
        default="",
        help='comma-separated contenders to leave out ("HF compiled"; "HF compiled@8": at '
        "batch 8 only)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows here")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per contender")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per contender")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--strict", action="store_true", help="exit 1 if the target is missed")
    # internal: measure one contender's peak memory in this (fresh) process
    p.add_argument("--memory-only", choices=["libai", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.new_tokens, args.repeats = 16, 2
    args.models = [m for m in args.models.split(",") if m]
    assert all(m in MODELS for m in args.models), f"--models: choose from {MODELS}"
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.paths = [m for m in args.paths.split(",") if m]
    assert "dynamic" in args.paths and all(m in PATHS for m in args.paths), (
        f"--paths: 'dynamic' and any of {PATHS}"
    )
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    names = [f"{lib} {p}" for p in PATHS[1:] for lib in ("libai", "HF")]
    assert {s.split("@")[0] for s in args.skip} <= set(names), (
        f"--skip: any of {names}, each optionally @BATCH (the dynamic paths always run)"
    )
    return args


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


LLAMA = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=10, vocab_size=32000)
LLAMA_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=1000)
#: Llama-3.2-1B's shapes (--tiny: the tiny Llama, with tied embeddings)
LLAMA_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=2048,
)


def hf_config(name: str, tiny: bool):
    if name == "gpt2":
        tiny_shape = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000)
        return transformers.GPT2Config(**(tiny_shape if tiny else {}))
    tied = dict(tie_word_embeddings=True) if name == "llama1b" else {}
    if tiny:
        return transformers.LlamaConfig(
            num_attention_heads=4, num_key_value_heads=2, **LLAMA_TINY, **tied
        )
    if name == "llama1b":
        return transformers.LlamaConfig(**LLAMA_1B, **tied)
    return transformers.LlamaConfig(num_attention_heads=12, num_key_value_heads=4, **LLAMA)


def build_hf(name: str, args):
    torch.manual_seed(args.seed)
    config = hf_config(name, args.tiny)
    cls = transformers.GPT2LMHeadModel if name == "gpt2" else transformers.LlamaForCausalLM
    return cls(config).eval()


def make_prompt(vocab: int, batch: int, args, device):
    g = torch.Generator().manual_seed(args.seed + batch)
    ids = torch.randint(1, vocab, (batch, args.prompt_len), generator=g).to(device)
    return ids, torch.ones_like(ids)


def amp_context(args):
    if args.amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(args.device, dtype=torch.bfloat16)


def hf_generate_fn(hf, args, path: str = "dynamic"):
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    extra = {}
    if path != "dynamic":
        extra["cache_implementation"] = "static"
    if path == "compiled":
        if args.device == "cuda":  # transformers compiles static-cache decoding on CUDA itself
            extra["compile_config"] = transformers.CompileConfig()
        else:
            extra["compile_config"] = transformers.CompileConfig(mode="default")
            extra["compile_config"]._compile_all_devices = True  # its switch for CPU
    else:
        extra["disable_compile"] = True

    def run(ids, mask):
        with torch.no_grad(), amp_context(args):
            return hf.generate(
                ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False, **extra
            )

    return run


def libai_generate_fn(model, args, path: str = "dynamic"):
    amp_dtype = torch.bfloat16 if args.amp == "bf16" else None
    stepper = ModelStepper(
        model.eval(),
        amp_dtype=amp_dtype,
        decode_layout=True,
        static_cache=path == "static",
        compile=path == "compiled",
    )

    def run(ids, mask):
        return generate(
            stepper, ids, mask, max_new_tokens=args.new_tokens, eos_token_id=None, pad_token_id=0
        )

    return run


def _reset_peak_rss() -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_extra_mb(run, ids, mask, device: str) -> float:
    """Peak memory increase (MB) during one ``run(ids, mask)`` call."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run(ids, mask)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    # VmHWM, not ru_maxrss: the latter also keeps the peak of exited threads (loading)
    if not _reset_peak_rss():  # the loading peak may then hide the call's
        print("warning: cannot reset the peak RSS; peak memory may be understated")
    before = _vm_hwm_kib()
    run(ids, mask)
    return (_vm_hwm_kib() - before) / 1024


def _vm_hwm_kib() -> int:
    """Peak RSS (KiB) of this process's memory: VmHWM, or ``ru_maxrss`` without /proc."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def memory_only(args) -> None:
    """Subprocess: load one contender from ``--weights``, print its peak extra memory."""
    device = dist.get_dist_util().device
    dtype = DTYPES[args.dtype]
    if args.memory_only == "libai":
        model = load_huggingface(args.weights).to(device=device, dtype=dtype)
        run = libai_generate_fn(model, args)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.weights, dtype=dtype)
        model = model.to(device).eval()
        run = hf_generate_fn(model, args)
    with torch.no_grad():  # fault in weights loaded by mmap, or their pages count as extra
        sum(float(p.sum()) for p in model.parameters())
    vocab = transformers.AutoConfig.from_pretrained(args.weights).vocab_size
    ids, mask = make_prompt(vocab, args.batches[0], args, device)
    print(json.dumps({"peak_mb": peak_extra_mb(run, ids, mask, args.device)}))


def subprocess_peak(which: str, weights: str, batch: int, args) -> float:
    cmd = [sys.executable, __file__, "--memory-only", which, "--weights", weights]
    cmd += ["--batches", str(batch), "--prompt-len", str(args.prompt_len)]
    cmd += ["--new-tokens", str(args.new_tokens), "--seed", str(args.seed), "--amp", args.amp]
    cmd += ["--dtype", args.dtype]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def measure_bandwidth_gbs(args) -> float | None:
    """Device memory bandwidth (GB/s): ``--bandwidth-gbs``, or on CUDA a 1 GiB
    device-to-device copy (3 warm-ups, mean of 10 timed; read + write bytes); else None."""
    if args.bandwidth_gbs:
        return args.bandwidth_gbs
    if args.device != "cuda":
        return None
    nbytes = 2**30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / 10
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds / 1e9


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters (tied ones once) and buffers of ``model``."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def bench_case(name: str, batch: int, hf, libai_model, weights: str, args, device) -> dict:
    vocab = hf.config.vocab_size
    ids, mask = make_prompt(vocab, batch, args, device)
    outputs: dict[str, torch.Tensor] = {}
    failed: dict[str, str] = {}

    def step_fn(label, run):
        def step(prompt, optimizer):
            if label in failed:  # it raised before: left out of the rest of the case
                return 0.0
            try:
                outputs[label] = run(*prompt)
                if args.device == "cuda":  # the last tokens may still be in flight
                    torch.cuda.synchronize()
            except Exception as e:
                if label in ("libai", "HF"):  # the references: the case cannot go on
                    raise
                print(f"  {name} batch {batch}: {label} FAILED ({e!r})", flush=True)
                traceback.print_exc()
                sys.stderr.flush()
                failed[label] = repr(e)
            return 0.0

        return step

    runs = {"libai": libai_generate_fn(libai_model, args), "HF": hf_generate_fn(hf, args)}
    for path in args.paths[1:]:
        for lib, make in (("libai", libai_generate_fn), ("HF", hf_generate_fn)):
            label = f"{lib} {path}"
            if label not in args.skip and f"{label}@{batch}" not in args.skip:
                runs[label] = make(libai_model if lib == "libai" else hf, args, path)
    contenders = [Contender(k, step_fn(k, fn), None) for k, fn in runs.items()]
    run_interleaved(contenders, [(ids, mask)], args.warmup, args.repeats, 1)

    a, b = (outputs[k][:, args.prompt_len :] for k in ("libai", "HF"))
    assert a.shape == b.shape == (batch, args.new_tokens), (a.shape, b.shape)
    agree = int((a == b).sum())
    if agree != a.numel():
        first = [int((r != 0).nonzero()[0]) if r.any() else None for r in (a != b)]
        print(
            f"  {name} batch {batch}: tokens agree at {agree}/{a.numel()} positions "
            f"(first difference per row: {first})"
        )
    ok = [c for c in contenders if c.name not in failed]
    wall = {c.name: sorted(c.wall)[len(c.wall) // 2] for c in ok}
    tps = {k: batch * args.new_tokens / t for k, t in wall.items()}
    weight_bytes = model_bytes(libai_model)
    bound = batch * args.bandwidth * 1e9 / weight_bytes if args.bandwidth else None
    row = dict(
        model=name,
        batch=batch,
        dtype=args.dtype,
        libai=tps["libai"],
        hf=tps["HF"],
        agree=agree,
        total=a.numel(),
        ratio=tps["libai"] / tps["HF"],
        weight_bytes=weight_bytes,
        bound=bound,
        paths={k: (v, _agreement(outputs[k], outputs["libai"], args)) for k, v in tps.items()},
        failed=failed,
    )
    if args.no_memory:
        row["mem_libai"] = row["mem_hf"] = None
    elif args.device == "cuda":
        row["mem_libai"] = peak_extra_mb(runs["libai"], ids, mask, "cuda")
        row["mem_hf"] = peak_extra_mb(runs["HF"], ids, mask, "cuda")
    else:
        row["mem_libai"] = subprocess_peak("libai", weights, batch, args)
        row["mem_hf"] = subprocess_peak("hf", weights, batch, args)
    print(
        f"  {name} batch {batch}: libai {tps['libai']:.1f} tok/s ({wall['libai']:.2f} s), "
        f"HF {tps['HF']:.1f} tok/s ({wall['HF']:.2f} s), ratio {row['ratio']:.3f}; "
        f"tokens agree {agree}/{a.numel()}; weights {weight_bytes / 2**20:.1f} MiB, "
        + (
            f"bound {bound:,.0f} tok/s, libai at {tps['libai'] / bound:.1%} of it"
            if bound
            else "bound n/a"
        ),
        flush=True,
    )
    for k in list(runs)[2:]:
        if k in failed:
            print(f"    {k}: failed")
            continue
        frac = f", {tps[k] / bound:.1%} of the bound" if bound else ""
        print(f"    {k}: {tps[k]:.1f} tok/s{frac}; tokens agree with libai {row['paths'][k][1]}")
    sys.stdout.flush()
    return row


def _agreement(out: torch.Tensor, reference: torch.Tensor, args) -> str:
    a, b = out[:, args.prompt_len :], reference[:, args.prompt_len :]
    return f"{int((a == b).sum())}/{b.numel()}" if a.shape == b.shape else f"shape {a.shape}"


def _mb(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def print_paths_table(rows: list[dict], args) -> None:
    """tokens/s of every cache / compile path (and agreement with libai's dynamic path)."""
    names = [f"{lib} {p}" for p in args.paths for lib in ("libai", "HF")]
    head = [n.replace(" dynamic", "") for n in names]
    print(
        "| model | batch | " + " | ".join(f"{h} tok/s" for h in names) + " | best libai / bound |"
    )
    print("|---|---:|" + "---:|" * (len(names) + 1))
    for r in rows:
        cells = [
            f"{r['paths'][h][0]:.1f} ({r['paths'][h][1]})" if h in r["paths"] else "-" for h in head
        ]
        libai = {h: r["paths"][h][0] for h in head if h.startswith("libai") and h in r["paths"]}
        best = max(libai, key=libai.get)
        best_text = f"{libai[best] / r['bound']:.1%} ({best})" if r["bound"] else "n/a"
        print(f"| {r['model']} | {r['batch']} | " + " | ".join(cells) + f" | {best_text} |")
    print("(cells: tok/s (new tokens equal to libai dynamic's / all); -: skipped or failed)")


def main(args: argparse.Namespace) -> list[dict]:
    device = dist.get_dist_util().device
    dtype = DTYPES[args.dtype]
    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    ) or platform.machine()
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {args.device} "
        f"({device_name}), {torch.get_num_threads()} threads, weights {args.dtype}, amp "
        f"{args.amp}; greedy, prompt {args.prompt_len} random tokens, {args.new_tokens} new "
        f"tokens; {args.warmup} warm-up + {args.repeats} interleaved timed runs each (median)"
        + (f"; skipped: {', '.join(sorted(args.skip))}" if args.skip else ""),
        flush=True,
    )
    try:
        args.bandwidth = measure_bandwidth_gbs(args)
    except Exception:  # the rows go on without the bound
        traceback.print_exc()
        args.bandwidth = None
    source = "--bandwidth-gbs" if args.bandwidth_gbs else "measured, 1 GiB D2D copy"
    print(
        f"memory bandwidth: {args.bandwidth:.0f} GB/s ({source}); bound tok/s = batch x "
        "bandwidth / weight bytes"
        if args.bandwidth
        else "memory bandwidth: n/a (CPU; pass --bandwidth-gbs)",
        flush=True,
    )
    rows, errors = [], []
    for name in args.models:
        hf = libai_model = None
        try:
            start = time.perf_counter()
            hf = build_hf(name, args)
            print(
                f"{name}: {sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M params",
                flush=True,
            )
            with tempfile.TemporaryDirectory() as tmp:
                hf.save_pretrained(tmp)
                libai_model = load_huggingface(tmp).to(device=device, dtype=dtype)
                hf.to(device=device, dtype=dtype)
                print(f"{name}: built and loaded in {time.perf_counter() - start:.1f} s")
                for batch in args.batches:
                    try:
                        rows.append(bench_case(name, batch, hf, libai_model, tmp, args, device))
                    except Exception as e:
                        print(f"  {name} batch {batch}: FAILED ({e!r})", flush=True)
                        traceback.print_exc()
                        sys.stderr.flush()
                        errors.append(dict(model=name, batch=batch, error=repr(e)))
                    _free(args)
                    _write_json(rows, errors, args)
        except Exception as e:
            print(f"{name}: FAILED ({e!r})", flush=True)
            traceback.print_exc()
            sys.stderr.flush()
            errors.append(dict(model=name, batch=None, error=repr(e)))
        del hf, libai_model
        _free(args)
        _write_json(rows, errors, args)

    print()
    print(
        "| model | batch | libai tok/s | HF tok/s | ratio | bound tok/s | libai / bound "
        "| libai peak extra MB | HF peak extra MB | tokens agree |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bound = f"{r['bound']:,.0f} | {r['libai'] / r['bound']:.1%}" if r["bound"] else "n/a | n/a"
        print(
            f"| {r['model']} | {r['batch']} | {r['libai']:.1f} | {r['hf']:.1f} "
            f"| {r['ratio']:.3f} | {bound} | {_mb(r['mem_libai'])} | {_mb(r['mem_hf'])} "
            f"| {r['agree']}/{r['total']} |"
        )
    for e in errors:
        print(f"| {e['model']} | {e['batch'] or '-'} | failed: {e['error'][:60]} |")
    if len(args.paths) > 1 and rows:
        print()
        print_paths_table(rows, args)
    if rows:
        worst = min(r["ratio"] for r in rows)
        print()
        print(
            f"target ratio >= {TARGET_RATIO:.2f}: {'MET' if worst >= TARGET_RATIO else 'MISSED'}"
            f" (lowest ratio {worst:.3f})"
        )
    if args.json:
        print(f"rows written to {args.json}")
    return rows


def _free(args) -> None:
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()


def _write_json(rows: list[dict], errors: list[dict], args) -> None:
    if not args.json:
        return
    meta = dict(
        torch=torch.__version__,
        transformers=transformers.__version__,
        device=torch.cuda.get_device_name() if args.device == "cuda" else "CPU",
        dtype=args.dtype,
        amp=args.amp,
        bandwidth_gbs=args.bandwidth,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        skip=sorted(args.skip),
    )
    Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows, errors=errors), indent=2))


if __name__ == "__main__":
    cli_args = parse_args()
    if cli_args.threads:
        torch.set_num_threads(cli_args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    dist.setup_dist_util({"device_type": cli_args.device})  # one process: tp = dp = pp = 1
    try:
        if cli_args.memory_only:
            memory_only(cli_args)
            sys.exit(0)
        result = main(cli_args)
    finally:
        dist.destroy_dist()
    missed = not result or min(r["ratio"] for r in result) < TARGET_RATIO
    sys.exit(1 if cli_args.strict and missed else 0)
