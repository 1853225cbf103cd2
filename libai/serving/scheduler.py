"""Continuous batching: which sequences run in the next step, and how many of their tokens.

Every step the :class:`Scheduler` fills a token budget (``max_num_batched_tokens``):
first the running sequences (one token each while decoding, the next chunk of the prompt
while prefilling), then waiting requests are admitted while the budget, ``max_num_seqs``
and the free blocks allow; a long prompt is prefilled in chunks beside the decoding
sequences. When a running sequence needs a block and none is free, the most recently
admitted sequence is preempted: its blocks are freed and it waits again at the front of
the queue, to recompute its prompt and the tokens it already produced when readmitted.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass, field

import torch

from libai.serving.blocks import BlockAllocator
from libai.serving.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """One sequence being generated (one choice of a request)."""

    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    generator: torch.Generator | None = None
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    #: tokens whose keys and values are in the cache
    num_computed: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    #: times this sequence was preempted (its cache freed and recomputed later)
    preemptions: int = 0
    #: the adapter it runs through (an index of the model's adapters; -1: the base alone)
    adapter: int = -1

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_uncomputed(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) - self.num_computed


class Scheduler:
    """The waiting queue and the running batch over one :class:`BlockAllocator`."""

    def __init__(self, allocator: BlockAllocator, max_num_seqs: int, max_num_batched_tokens: int):
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"--max-num-batched-tokens ({max_num_batched_tokens}) must be at least "
                f"--max-num-seqs ({max_num_seqs}): every running sequence decodes one token "
                "per step"
            )
        self.allocator = allocator
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End ``seq`` (done, stopped, cancelled or failed) and free its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.release(seq.block_table)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    def schedule(self) -> list[tuple[Sequence, int]]:
        """The next step: ``(sequence, number of its tokens to compute)`` in batch order."""
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget == 0:
                continue  # preempted below for an earlier sequence, or no budget left
            count = min(seq.num_uncomputed, budget)
            while not self.allocator.grow(seq.block_table, seq.num_computed + count):
                victim = self.running[-1]  # the newest admitted
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                scheduled.append((seq, count))
                budget -= count
        while (
            not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            count = min(seq.num_uncomputed, budget)
            if not self.allocator.grow(seq.block_table, seq.num_computed + count):
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            scheduled.append((seq, count))
            budget -= count
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.allocator.release(seq.block_table)
        seq.num_computed, seq.status = 0, Status.WAITING
        seq.preemptions += 1
        self.waiting.appendleft(seq)
