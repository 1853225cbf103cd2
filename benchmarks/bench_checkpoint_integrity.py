"""What checkpoint integrity and safe loading cost: a GPT-2 124M checkpoint (model + AdamW
state, ~1.5 GB) saved and loaded by libai's ``Checkpointer`` against plain DCP
(``dcp.save`` / ``dcp.load`` of the same state dicts, what torchtitan does) in the same run.

libai's save adds the manifest (an xxh3-64 checksum of every file, read back from the page
cache right after writing) and the per-rank state file; its load adds the checksum
verification, the weights-only / allow-list readers and the layout views. The checksum time
inside each is measured separately (the hashing functions are wrapped with a timer), so the
table shows the manifest's share of the save and load time: the target is <= 5 % of the save.
Loads read from the page cache (the files were just written), as a resume on the same node.

    python benchmarks/bench_checkpoint_integrity.py                 # GPT-2 124M
    python benchmarks/bench_checkpoint_integrity.py --layers 2 --hidden 128 --vocab 1024  # quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libai import dist  # noqa: E402
from libai.checkpoint import checkpointer as ckpt  # noqa: E402
from libai.checkpoint import files as checkpoint_files  # noqa: E402
from libai.models import GPTForPreTraining  # noqa: E402


class Timed:
    """Wraps a module function and adds up the seconds spent in it."""

    def __init__(self, module, name):
        self.module, self.name, self.real = module, name, getattr(module, name)
        self.seconds = 0.0
        setattr(module, name, self)

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.real(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def build(args):
    dist.setup_dist_util({})
    torch.manual_seed(0)
    model = GPTForPreTraining(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        hidden_layers=args.layers,
        num_attention_heads=args.heads,
        ffn_hidden_size=4 * args.hidden,
        max_seq_length=1024,
        embedding_dropout_prob=0.0,
        attention_dropout_prob=0.0,
        output_dropout_prob=0.0,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (2, 64))
    loss = model(input_ids=ids, labels=ids)["lm_loss"].mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def du(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    model, optimizer = build(args)
    hashing = Timed(ckpt, "file_checksums")
    verifying = Timed(checkpoint_files, "verify_files")
    root = tempfile.mkdtemp(prefix="libai_ckpt_bench_", dir=args.dir)
    rows = {
        k: []
        for k in ("plain save", "libai save", "checksum", "plain load", "libai load", "verify")
    }
    size = 0
    try:
        checkpointer = ckpt.Checkpointer(model, os.path.join(root, "libai"), optimizer=optimizer)
        for i in range(args.repeats):
            # plain DCP: the same model and optimizer state dicts, nothing else (their
            # construction is timed too: a real save makes them). Each timed part starts
            # after os.sync(), so no write-back of the previous one is left to slow it, and
            # the order alternates between repeats.
            plain = os.path.join(root, f"plain_{i}")
            name = os.path.join(root, "libai", f"model_{i:07d}")

            def plain_save(plain=plain):
                state = {
                    "model": get_model_state_dict(model),
                    "optimizer": get_optimizer_state_dict(model, optimizer),
                }
                dcp.save(state, storage_writer=dcp.FileSystemWriter(plain, thread_count=1))
                return state

            def libai_save(i=i):
                checkpointer.save(f"model_{i:07d}", iteration=i)

            order = [("plain save", plain_save), ("libai save", libai_save)]
            state = None
            for key, fn in order if i % 2 == 0 else order[::-1]:
                os.sync()
                start = time.perf_counter()
                result = fn()
                rows[key].append(time.perf_counter() - start)
                state = result if result is not None else state
            rows["checksum"].append(hashing.take())
            size = du(name)

            def plain_load(plain=plain, state=state):
                dcp.load(state, storage_reader=dcp.FileSystemReader(plain))

            def libai_load(name=name):
                checkpointer.load(name)

            order = [("plain load", plain_load), ("libai load", libai_load)]
            for key, fn in order if i % 2 == 0 else order[::-1]:
                os.sync()
                start = time.perf_counter()
                fn()
                rows[key].append(time.perf_counter() - start)
            rows["verify"].append(verifying.take())
            shutil.rmtree(plain)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in rows.items()}
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"GPT {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}: "
        f"{n_params / 1e6:.1f}M parameters; checkpoint {size / 2**30:.2f} GiB "
        f"(model + AdamW); torch {torch.__version__}; {os.cpu_count()} CPUs; "
        f"median of {args.repeats}"
    )
    print(f"{'':24}{'seconds':>10}{'GiB/s':>10}")
    for key, seconds in med.items():
        print(f"{key:24}{seconds:10.3f}{size / 2**30 / seconds:10.2f}")
    print(
        f"checksums / libai save        {med['checksum'] / med['libai save']:7.1%}  (target <= 5%)"
    )
    print(f"verification / libai load     {med['verify'] / med['libai load']:7.1%}")
    print(f"libai save / plain DCP save   {med['libai save'] / med['plain save']:7.2f}x")
    print(f"libai load / plain DCP load   {med['libai load'] / med['plain load']:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
