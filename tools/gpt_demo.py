"""Train a small GPT-2 for a few steps on any dp x tp x pp layout (CPU or GPU).

    torchrun --nproc_per_node 4 tools/gpt_demo.py --tp 2 --pp 2
    python tools/gpt_demo.py                      # one process

The data are arithmetic progressions modulo the vocabulary (random start and stride), so the
next token is predictable and the loss visibly falls. Data parallel size is derived from the
number of processes: world / (tp * pp).
"""

from __future__ import annotations

import argparse
import time

import torch

from libai import dist
from libai.models import GPTForPreTraining
from libai.runtime.parallel import ModelRunner


def progression_batch(batch: int, seq: int, vocab: int, generator: torch.Generator):
    start = torch.randint(0, vocab, (batch, 1), generator=generator)
    stride = torch.randint(1, 8, (batch, 1), generator=generator)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:].contiguous()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size")
    parser.add_argument("--schedule", default="1F1B", help="pipeline schedule (GPipe, 1F1B, ...)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    util = dist.setup_dist_util(
        {
            "tensor_parallel_size": args.tp,
            "pipeline_parallel_size": args.pp,
            "pipeline_num_layers": args.layers,
            "pipeline_schedule": args.schedule,
            "device_type": args.device,
        }
    )
    dp = util.layout.data_parallel_size
    if args.global_batch % (dp * args.microbatches):
        raise SystemExit(
            f"--global-batch {args.global_batch} must be divisible by data parallel size {dp} "
            f"x --microbatches {args.microbatches}"
        )
    torch.manual_seed(0)  # same seed everywhere: the weights do not depend on the layout
    model = GPTForPreTraining(
        hidden_layers=args.layers,
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        ffn_hidden_size=4 * args.hidden,
        num_attention_heads=4,
        max_seq_length=args.seq,
    )
    runner = ModelRunner(model, num_microbatches=args.microbatches)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    if dist.is_main_process():
        print(
            f"GPT-2 demo: {util.layout.world_size} processes as pp={args.pp} dp={dp} tp={args.tp}, "
            f"stage ids {list(util.layout.layer_stage_ids)}"
        )
    start = time.perf_counter()
    for step in range(args.steps):
        batch = progression_batch(args.global_batch, args.seq, args.vocab, generator)
        local = {k: v.chunk(dp)[util.data_parallel_rank].to(util.device) for k, v in batch.items()}
        loss = runner.train_step(local, optimizer)
        if dist.is_main_process() and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    if dist.is_main_process():
        tokens = args.steps * args.global_batch * args.seq
        print(f"done: {args.steps} steps in {elapsed:.1f}s ({tokens / elapsed:.0f} tokens/s)")
    dist.destroy_dist()


if __name__ == "__main__":
    main()
