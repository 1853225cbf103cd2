"""Per-request sampling settings and the choice of each sequence's next token.

:class:`SamplingParams` carries the OpenAI fields (``max_tokens``, ``temperature``, ``top_p``,
``stop``, ``seed``, ``logprobs``) plus vLLM's ``top_k`` and ``ignore_eos``; :meth:`validate`
names the first bad field. :func:`choose_tokens` picks the next token of every sequence of
a step from its logits row, each with its own settings: greedy rows at once, sampled rows
through the generation code's warpers (temperature, top-k, top-p) with the sequence's own
generator (a seeded request draws the same tokens whatever else is in the batch).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from libai.inference.generation.logits_process import temperature, top_k, top_p

#: most top log-probabilities a request may ask for (OpenAI's limit)
MAX_TOP_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How one sequence is decoded. ``temperature == 0`` is greedy; ``logprobs`` None = no
    log-probabilities, k >= 0 = the chosen token's and the k most likely ones'."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logprobs: int | None = None

    def validate(self) -> None:
        """Raise ``ValueError(field, message)`` for the first bad setting."""

        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise InvalidParameter(name, f"{name}={getattr(self, name)!r}: {rule}")

        need(self.max_tokens is None or _int(self.max_tokens) and self.max_tokens >= 1,
             "max_tokens", "must be an integer >= 1")  # fmt: skip
        need(_number(self.temperature) and 0 <= self.temperature <= 2, "temperature",
             "must be between 0 and 2")  # fmt: skip
        need(_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(_int(self.top_k) and self.top_k >= 0, "top_k", "must be an integer >= 0 (0 = off)")
        need(isinstance(self.stop, list) and len(self.stop) <= 4
             and all(isinstance(s, str) and s for s in self.stop), "stop",
             "must be a non-empty string or a list of at most 4 of them")  # fmt: skip
        need(self.seed is None or _int(self.seed), "seed", "must be an integer")
        need(_int(self.n) and 1 <= self.n <= 128, "n", "must be an integer in [1, 128]")
        need(self.logprobs is None or _int(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
             "logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")  # fmt: skip

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class InvalidParameter(ValueError):
    """A request setting out of range: ``param`` names the field (OpenAI's error ``param``)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def choice_generator(seed: int | None, choice: int, device="cpu") -> torch.Generator | None:
    """The generator of choice ``choice`` of a seeded request (None without a seed): the
    same seed gives the same draws, choice by choice, in any batch."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}/{choice}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def choose_tokens(logits: torch.Tensor, params: list[SamplingParams], generators) -> list[int]:
    """``logits [rows, vocab]`` (float32) -> the next token of each row under its own
    ``params`` and generator."""
    tokens = logits.argmax(-1).tolist()
    for row, (p, generator) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        scores = logits[row : row + 1]
        for warp in _warpers(p):
            scores = warp(None, scores)
        probs = scores.softmax(-1)
        tokens[row] = int(torch.multinomial(probs, 1, generator=generator))
    return tokens


def _warpers(p: SamplingParams):
    out = []
    if p.temperature != 1.0:
        out.append(temperature(p.temperature))
    if p.top_k:
        out.append(top_k(p.top_k))
    if p.top_p < 1.0:
        out.append(top_p(p.top_p))
    return out


def token_logprobs(
    logits: torch.Tensor, token: int, top: int
) -> tuple[float, list[tuple[int, float]]]:
    """The model's log-probability of ``token`` and the ``top`` most likely tokens with
    theirs, from the raw (unwarped) ``logits [vocab]``."""
    logprobs = torch.log_softmax(logits.float(), -1)
    chosen = float(logprobs[token])
    if top == 0:
        return chosen, []
    values, ids = logprobs.topk(top)
    return chosen, list(zip(ids.tolist(), values.tolist()))


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
