"""The serving engine: requests in, one token per running sequence per step out.

:class:`LLMEngine` owns the scheduler (continuous batching, :mod:`libai.serving.scheduler`),
the block allocator of the paged cache and the executor that runs the model. :meth:`step`
asks the scheduler for the next batch, packs it into one :class:`StepPlan`, runs it, picks
each finished-prefill sequence's next token under its own settings, and reports per
sequence what is new (token, text, log-probabilities) and whether it finished (eos, a stop
token or string, ``max_tokens``). It is synchronous and single-threaded; the HTTP front
(:mod:`libai.serving.api`) drives it from one thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from libai.serving.blocks import BlockAllocator
from libai.serving.executor import ModelExecutor, StepPlan
from libai.serving.sampling import (
    InvalidParameter,
    SamplingParams,
    choice_generator,
    choose_tokens,
    token_logprobs,
)
from libai.serving.scheduler import Scheduler, Sequence, Status
from libai.serving.text import TextTracker

logger = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    """Sizes of the engine (the ``libai-serve`` flags of the same names)."""

    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    #: blocks of the paged cache (None: every one of max_num_seqs sequences at full length)
    num_blocks: int | None = None

    def blocks(self) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        return self.max_num_seqs * -(-self.max_model_len // self.block_size)


@dataclass
class SequenceOutput:
    """What one step produced for one sequence."""

    seq: Sequence
    token_id: int | None
    text: str
    finished: bool
    logprob: tuple[float, list[tuple[int, float]]] | None = None
    #: set when this sequence failed (it is finished and freed; the others go on)
    error: BaseException | None = None


@dataclass
class _Tracking:
    text: TextTracker
    stop_ids: set[int] = field(default_factory=set)


class LLMEngine:
    """Continuous batching over a paged KV cache (see the module docstring)."""

    def __init__(
        self,
        executor: ModelExecutor,
        tokenizer=None,
        config: EngineConfig | None = None,
        eos_token_ids: list[int] | None = None,
    ):
        self.config = c = config or EngineConfig()
        if c.blocks() * c.block_size < c.max_model_len:
            raise ValueError(
                f"--num-blocks {c.blocks()} x --block-size {c.block_size} slots cannot hold "
                f"one sequence of --max-model-len {c.max_model_len}; raise --num-blocks"
            )
        if executor.cache.num_blocks != c.blocks() or executor.cache.block_size != c.block_size:
            raise ValueError("the executor's cache and the engine config disagree on blocks")
        self.executor, self.tokenizer = executor, tokenizer
        self.eos_token_ids = list(eos_token_ids or [])
        self.allocator = BlockAllocator(c.blocks(), c.block_size)
        self.scheduler = Scheduler(self.allocator, c.max_num_seqs, c.max_num_batched_tokens)
        self._tracking: dict[int, _Tracking] = {}

    # ---- requests -------------------------------------------------------------------------
    def add_request(
        self, prompt_ids: list[int], params: SamplingParams, adapter: int = -1
    ) -> list[Sequence]:
        """Queue ``params.n`` sequences continuing ``prompt_ids`` through ``adapter`` (an
        index of the executor's :attr:`~ModelExecutor.adapter_names`; -1: the base alone);
        raises :class:`InvalidParameter` (naming the field) before queueing anything."""
        params.validate()
        names = self.executor.adapter_names
        if not -1 <= adapter < len(names):
            raise InvalidParameter(
                "model", f"adapter {adapter} is not loaded ({len(names)} adapters: {names})"
            )
        limit = self.config.max_model_len
        if not prompt_ids:
            raise InvalidParameter("prompt", "the prompt is empty")
        if len(prompt_ids) >= limit:
            raise InvalidParameter(
                "prompt",
                f"the prompt has {len(prompt_ids)} tokens; this server's --max-model-len is "
                f"{limit}, which must also leave room for at least one new token",
            )
        room = limit - len(prompt_ids)
        if params.max_tokens is not None and params.max_tokens > room:
            raise InvalidParameter(
                "max_tokens",
                f"max_tokens={params.max_tokens} plus the prompt's {len(prompt_ids)} tokens "
                f"exceeds --max-model-len {limit}; ask for at most {room} tokens",
            )
        max_tokens = room if params.max_tokens is None else params.max_tokens
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(self.eos_token_ids)
        out = []
        for choice in range(params.n):
            seq = Sequence(
                list(prompt_ids),
                params,
                max_tokens,
                generator=choice_generator(params.seed, choice),
                adapter=adapter,
            )
            self._tracking[seq.seq_id] = _Tracking(
                TextTracker(self.tokenizer, params.stop), stop_ids
            )
            self.scheduler.add(seq)
            out.append(seq)
        return out

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        """Cancel ``seq`` (a client went away): its blocks are freed at once."""
        if seq.status is not Status.FINISHED:
            self.scheduler.finish(seq, reason)
        self._tracking.pop(seq.seq_id, None)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- one step -------------------------------------------------------------------------
    def step(self) -> list[SequenceOutput]:
        """Run one batch; returns an output for each sequence that got a token."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        plan, sampled = self._plan(batch)
        logits = self.executor.execute(plan)  # every rank writes the step's keys
        for seq, count in batch:
            seq.num_computed += count
        if not sampled:
            return []
        params = [seq.params for seq in sampled]
        tokens = choose_tokens(logits, params, [seq.generator for seq in sampled])
        outputs = []
        for row, (seq, token) in enumerate(zip(sampled, tokens)):
            try:
                outputs.append(self._advance(seq, token, logits[row]))
            except Exception as error:  # this sequence fails alone
                logger.exception("sequence %d failed", seq.seq_id)
                self.abort(seq, "error")
                outputs.append(SequenceOutput(seq, None, "", True, error=error))
        return outputs

    def _plan(self, batch) -> tuple[StepPlan, list[Sequence]]:
        if self.executor.adapters is not None:  # each adapter's tokens in one run of rows
            batch = sorted(batch, key=lambda item: item[0].adapter)
        ids, positions, starts, counts, tables, logits_at, sampled = [], [], [], [], [], [], []
        adapters = []
        for seq, count in batch:
            adapters.append(seq.adapter)
            start, tokens = seq.num_computed, seq.all_ids
            ids += tokens[start : start + count]
            positions += range(start, start + count)
            starts.append(start)
            counts.append(count)
            tables.append(list(seq.block_table))
            if start + count == len(tokens):  # prompt (and outputs) all computed
                logits_at.append(len(ids) - 1)
                sampled.append(seq)
        plan = StepPlan(ids, positions, starts, counts, tables, logits_at)
        if self.executor.adapters is not None:
            plan.adapters = adapters
        return plan, sampled

    def _advance(self, seq: Sequence, token: int, logits: torch.Tensor) -> SequenceOutput:
        tracking = self._tracking[seq.seq_id]
        seq.output_ids.append(token)
        logprob = None
        if seq.params.logprobs is not None:
            logprob = token_logprobs(logits, token, seq.params.logprobs)
        hit_stop_id = token in tracking.stop_ids
        text = tracking.text.update(seq.output_ids[:-1] if hit_stop_id else seq.output_ids)
        reason = None
        if hit_stop_id or tracking.text.stopped:
            reason = "stop"
        elif len(seq.output_ids) >= seq.max_tokens:
            reason = "length"
        if reason is not None:
            text += tracking.text.flush()
            self.scheduler.finish(seq, reason)
            del self._tracking[seq.seq_id]
        return SequenceOutput(seq, token, text, reason is not None, logprob)
