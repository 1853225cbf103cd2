"""Shared timing harness of the benchmarks: two contenders, same batches, interleaved blocks.

Other processes share these machines in bursts, so the contenders are timed in alternating
blocks (A B, B A, ...) and compared pair by pair: the verdict is the median, over pairs of
adjacent blocks, of the ratio of their median step times.
"""

from __future__ import annotations

import statistics
import time


class Contender:
    """One model's ``step_fn(batch, optimizer) -> float`` with its timings and losses."""

    def __init__(self, name, step_fn, optimizer):
        self.name, self._step, self.optimizer = name, step_fn, optimizer
        self.wall: list[float] = []  # seconds, one entry per timed step
        self.cpu: list[float] = []  # process CPU seconds (all threads), one per timed step
        self.losses: list[float] = []

    def step(self, batch) -> float:
        loss = self._step(batch, self.optimizer)
        self.losses.append(loss)
        return loss


def run_interleaved(contenders, batches, warmup: int, repeats: int, steps: int) -> None:
    """Warm up each contender, then time ``repeats`` alternating blocks of ``steps`` steps.

    Both see the same batches in the same order, so both follow the same trajectory.
    """
    cursor = {c.name: 0 for c in contenders}

    def run(c: Contender, n: int, record: bool) -> None:
        for _ in range(n):
            batch = batches[cursor[c.name] % len(batches)]
            cursor[c.name] += 1
            wall, cpu = time.perf_counter(), time.process_time()
            c.step(batch)
            if record:
                c.wall.append(time.perf_counter() - wall)
                c.cpu.append(time.process_time() - cpu)

    for c in contenders:
        run(c, warmup, record=False)
    for r in range(repeats):
        order = contenders if r % 2 == 0 else contenders[::-1]  # A B, B A, ...
        for c in order:
            run(c, steps, record=True)


def print_step_table(contenders, tokens_per_step: int) -> tuple[dict, dict]:
    """Print the markdown table of median step times; return (wall, cpu) medians by name."""
    # Medians, not means: other processes on the machine come in bursts.
    wall = {c.name: statistics.median(c.wall) for c in contenders}
    cpu = {c.name: statistics.median(c.cpu) for c in contenders}
    print()
    print("| model | step time (ms) | steps/s | tokens/s | CPU time/step (ms) |")
    print("|---|---:|---:|---:|---:|")
    for c in contenders:
        t = wall[c.name]
        print(
            f"| {c.name} | {t * 1e3:.2f} | {1 / t:.2f} | {tokens_per_step / t:,.0f} "
            f"| {cpu[c.name] * 1e3:.2f} |"
        )
    return wall, cpu


def block_pair_ratios(numerator: Contender, denominator: Contender, steps: int) -> list[float]:
    """Sorted ratios of median step times, one per pair of adjacent blocks (moments apart)."""
    return sorted(
        statistics.median(numerator.wall[i : i + steps])
        / statistics.median(denominator.wall[i : i + steps])
        for i in range(0, len(numerator.wall), steps)
    )


def random_llama_dir(directory: str, hidden: int, layers: int, vocab: int, positions: int) -> str:
    """A seeded random Llama (``hidden / 64`` heads, half as many kv heads, SwiGLU width
    8/3 x hidden) saved to ``directory`` as a Hugging Face model, for a benchmark whose
    contenders both load it."""
    import torch
    import transformers

    torch.manual_seed(0)
    heads = max(hidden // 64, 2)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 16 * 16,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        max_position_embeddings=positions,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory
