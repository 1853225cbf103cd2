"""libai-accelerate's switches on a BERT-base-shaped classifier, against a plain transformers
loop on the same model and data (Rapidformer's table: one row per switch combination,
throughput mean ± std and peak memory).

Each row runs in a fresh process (peak memory is the row's own): the baseline is the usual
four-line transformers loop (forward, backward, clip, AdamW step) on one process; the other
rows are the black box (``tools/libai_accelerate.py``) on one process or on 2 data-parallel
processes (the ZeRO rows need 2), its per-step times read from ``metrics.json``. The model
is ``BertForSequenceClassification`` (hidden 768, 12 layers, 12 heads, ffn 3072, vocab
30522) with random weights, on random sentences of one-token words.

    python benchmarks/bench_accelerate.py                  # BERT-base shape (slow on CPU)
    python benchmarks/bench_accelerate.py --shape small    # 4 layers, hidden 256 (quick)
    python benchmarks/bench_accelerate.py --rows none,AMP  # a subset
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "base": dict(hidden=768, layers=12, heads=12, ffn=3072, vocab=30522),
    "small": dict(hidden=256, layers=4, heads=4, ffn=1024, vocab=30522),
}
AMP = ["--mixed-precision"]
#: name -> (processes, black-box flags; None = the transformers loop)
ROWS = {
    "transformers loop": (1, None),
    "none": (1, []),
    "AMP": (1, AMP),
    "AMP + checkpointing": (1, [*AMP, "--checkpoint-activations"]),
    "AMP + compile": (1, [*AMP, "--graph-optimization"]),
    "none (dp2)": (2, []),
    "AMP (dp2)": (2, AMP),
    "AMP + ZeRO-1 (dp2)": (2, [*AMP, "--zero-1-memory-optimization"]),
    "AMP + ZeRO-2 (dp2)": (2, [*AMP, "--zero-2-memory-optimization"]),
    "AMP + ZeRO-3 (dp2)": (2, [*AMP, "--zero-3-memory-optimization"]),
}


def build_files(root: Path, shape: dict, rows: int, seq: int) -> tuple[Path, Path]:
    """A random-weight BERT directory (WordPiece vocab of one-token words) and a CSV."""
    import random

    import transformers

    model_dir = root / "bert"
    model_dir.mkdir()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = [f"w{i}" for i in range(shape["vocab"] - len(specials))]
    (model_dir / "vocab.txt").write_text("\n".join(specials + words) + "\n")
    tok = transformers.BertTokenizerFast(vocab=str(model_dir / "vocab.txt"))
    assert len(tok) == shape["vocab"]
    config = transformers.BertConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["ffn"],
        max_position_embeddings=512,
    )
    transformers.BertForSequenceClassification(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rng = random.Random(0)
    data = root / "train.csv"
    with open(data, "w") as f:
        f.write("sentence,label\n")
        for _ in range(rows):
            f.write(" ".join(rng.choice(words) for _ in range(seq)) + f",{rng.randrange(2)}\n")
    return model_dir, data


def transformers_loop(model_dir: str, data: str, seq: int, batch: int, steps: int) -> list[float]:
    """The plain loop's per-step seconds (same model, data, AdamW and clipping)."""
    import torch
    import transformers

    from libai.accelerate.data import load_local_dataset

    torch.manual_seed(1234)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir)
    model.train()
    rows = load_local_dataset(data)
    enc = tok(
        list(rows["sentence"]),
        padding="max_length",
        truncation=True,
        max_length=seq,
        return_tensors="pt",
    )
    labels = torch.tensor(list(rows["label"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    times = []
    for step in range(steps):
        i = (step * batch) % (len(labels) - batch)
        b = {k: v[i : i + batch] for k, v in enc.items()}
        start = time.perf_counter()
        loss = model(**b, labels=labels[i : i + batch]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)
        times.append(time.perf_counter() - start)
    return times


def run_row(
    name: str, model_dir: str, data: str, seq: int, batch: int, steps: int, out: str
) -> dict:
    """One row, in this (fresh) process: per-step seconds and the peak RSS."""
    nproc, flags = ROWS[name]
    if flags is None:
        times = transformers_loop(model_dir, data, seq, batch, steps)
    else:
        argv = [
            "--task",
            "sequence_classification",
            "--pretrained-model-name-or-path",
            model_dir,
            "--data-path",
            data,
            "--seq-length",
            str(seq),
            "--micro-batch-size",
            str(batch),
            "--train-iters",
            str(steps),
            "--log-interval",
            "1",
            "--lr",
            "2e-5",
            "--save",
            out,
            *flags,
        ]
        tool = str(ROOT / "tools" / "libai_accelerate.py")
        if nproc == 1:
            cmd = [sys.executable, tool, *argv]
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={nproc}",
                tool,
                *argv,
            ]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, os.cpu_count() // nproc))}
        subprocess.run(cmd, check=True, env=env, capture_output=True)
        with open(os.path.join(out, "metrics.json")) as f:
            records = [json.loads(line) for line in f if line.strip()]
        times = [r["time"] for r in records if "time" in r]
    usage = resource.getrusage(resource.RUSAGE_SELF if flags is None else resource.RUSAGE_CHILDREN)
    return {"times": times, "nproc": nproc, "peak_mb": usage.ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="samples per step per process")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one row, print JSON
    parser.add_argument("--files", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        model_dir, data, out = args.files
        result = run_row(args.row, model_dir, data, args.seq, args.batch, args.steps, out)
        print(json.dumps(result))
        return 0
    import torch

    shape = SHAPES[args.shape]
    names = [r.strip() for r in args.rows.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data = build_files(Path(tmp), shape, 64 * args.batch, args.seq)
        for name in names:
            out = os.path.join(tmp, "".join(c if c.isalnum() else "_" for c in name))
            cmd = [
                sys.executable,
                __file__,
                "--row",
                name,
                "--files",
                str(model_dir),
                str(data),
                out,
                "--seq",
                str(args.seq),
                "--batch",
                str(args.batch),
                "--steps",
                str(args.steps),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                print(f"{name}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
                continue
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{name}: done", file=sys.stderr, flush=True)
    print(
        f"\nBERT {args.shape}-shaped classifier ({shape['layers']} layers, hidden "
        f"{shape['hidden']}), seq {args.seq}, {args.batch} samples / step / process, "
        f"{args.steps} steps ({args.warmup} warmup left out); torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| switches | processes | throughput (samples/s) | peak memory / process (MB) | vs loop |"
    )
    print("|---|---:|---:|---:|---:|")
    base = None
    for name, r in results.items():
        per_step = [r["nproc"] * args.batch / t for t in r["times"][args.warmup :]]
        mean = statistics.mean(per_step)
        std = statistics.stdev(per_step) if len(per_step) > 1 else 0.0
        base = mean if name == "transformers loop" else base
        ratio = f"{mean / base:.2f}x" if base else ""
        print(f"| {name} | {r['nproc']} | {mean:.2f} ± {std:.2f} | {r['peak_mb']:.0f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
