"""The LM loss with and without chunking (``loss_chunk_size``): memory and time of one
forward + backward of head + cross entropy, on one process.

For each row a fresh process builds an untied LM head (vocab x hidden, fp32) and hidden states
(tokens x hidden, requiring grad) and runs ``loss.backward()`` a few times. Reported:

- saved: bytes autograd keeps between forward and backward (parameters excluded), counted
  with ``torch.autograd.graph.saved_tensors_hooks``;
- peak: the CPU allocator's peak above what was allocated before the step (``torch.profiler``
  memory events, summed in time order), i.e. the loss's own peak including gradients;
- rss: the process's max RSS growth during the first step (``getrusage``), a cross-check;
- time: seconds per forward + backward, the fastest of ``--repeat`` (after warm-up).

    python benchmarks/bench_chunked_loss.py                      # tokens 2048, hidden 512, vocab 32000
    python benchmarks/bench_chunked_loss.py --vocab 128256 --chunks 1024,4096

Measured (2-core CPU shared with other jobs, torch 2.13; memory exact, times +-20%)::

    tokens 2048, hidden 512, vocab 32000, 2 threads; MB = 2^20 bytes
    dtype            loss  saved MB   peak MB   rss MB  s/step
    fp32            plain     254.0     750.0    795.5   2.798
    fp32        chunk 256       4.0      98.3    176.9   4.265
    fp32       chunk 1024       4.0     193.5    240.2   3.579
    fp32       chunk 4096       4.0     320.5    367.5   3.430   (one chunk: the recompute alone)
    bf16            plain     283.3     783.3    822.6   1.356
    bf16        chunk 256       2.0     207.1    355.7   2.140
    bf16       chunk 1024       2.0     285.3    359.7   1.753
    bf16       chunk 4096       2.0     472.8    511.7   1.620
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MB = 2**20


def run_row(args) -> dict:
    import torch

    from libai import dist
    from libai.layers import LMLogits, ParallelCrossEntropyLoss, chunked_lm_loss

    torch.set_num_threads(args.threads)
    dist.setup_dist_util({})
    torch.manual_seed(0)
    head = LMLogits(None, vocab_size=args.vocab, hidden_size=args.hidden, layer_idx=-1)
    hidden = torch.randn(args.tokens, args.hidden, requires_grad=True)
    labels = torch.randint(0, args.vocab, (args.tokens,))
    labels[::10] = -100
    plain = ParallelCrossEntropyLoss()
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else None

    def loss_fn():
        if args.chunk:
            return chunked_lm_loss(hidden, head, labels, args.chunk)
        return plain(head(hidden), labels)

    def step():
        hidden.grad, head.weight.grad = None, None
        if amp is not None:
            with amp:
                loss = loss_fn()
        else:
            loss = loss_fn()
        loss.backward()
        return loss

    # first step: max RSS growth and the profiler's allocator peak
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        step()
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    allocs = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in allocs:
        current += nbytes
        peak = max(peak, current)
    saved = {}
    params = {p.untyped_storage().data_ptr() for p in head.parameters()}

    def pack(t):  # each storage once; parameters (or views of them, W^T) exist anyway
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {
        "loss": float(loss),
        "saved_MB": sum(saved.values()) / MB,
        "peak_MB": peak / MB,
        "rss_MB": rss / MB,
        "time_s": min(times),  # the least disturbed run (the machine may be shared)
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--chunks", default="256,1024", help="chunk sizes to compare")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)  # in the child
    args = parser.parse_args()
    if args.row is not None:
        args.chunk, args.bf16 = json.loads(args.row)
        print(json.dumps(run_row(args)))
        return
    print(
        f"tokens {args.tokens}, hidden {args.hidden}, vocab {args.vocab}, "
        f"{args.threads} threads; MB = 2^20 bytes"
    )
    print(f"{'dtype':6} {'loss':>14} {'saved MB':>9} {'peak MB':>9} {'rss MB':>8} {'s/step':>7}")
    chunks = [None] + [int(c) for c in args.chunks.split(",")]
    for bf16 in (False, True):
        for chunk in chunks:
            cmd = [sys.executable, __file__, *sys.argv[1:], "--row", json.dumps([chunk, bf16])]
            row = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[
                    -1
                ]
            )
            name = "plain" if chunk is None else f"chunk {chunk}"
            print(
                f"{'bf16' if bf16 else 'fp32':6} {name:>14} {row['saved_MB']:9.1f} "
                f"{row['peak_MB']:9.1f} {row['rss_MB']:8.1f} {row['time_s']:7.3f}"
                f"   loss {row['loss']:.6f}"
            )


if __name__ == "__main__":
    main()
