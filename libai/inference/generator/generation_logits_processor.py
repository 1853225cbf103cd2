"""LiBai's (and transformers') logits processor classes, over libai's processors.

Each is called as ``processor(input_ids, scores)`` with the ids so far ``[batch, cur_len]``
and the next-token scores ``[batch, vocab]`` and returns new scores; a
:class:`LogitsProcessorList` applies its processors in order. The arithmetic is
:mod:`libai.inference.generation.logits_process`'s, which ``generate`` uses.
"""

from __future__ import annotations

import torch

from libai.inference.generation import logits_process as lp

__all__ = [
    "InfNanRemoveLogitsProcessor",
    "LogitsProcessor",
    "LogitsProcessorList",
    "LogitsWarper",
    "MinLengthLogitsProcessor",
    "NoRepeatNGramLogitsProcessor",
    "RepetitionPenaltyLogitsProcessor",
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
]


class LogitsProcessor:
    """Base class: ``__call__(input_ids, scores) -> scores``."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")


class LogitsWarper(LogitsProcessor):
    """Base class of the sampling warpers (temperature, top-k, top-p)."""


class LogitsProcessorList(list):
    """A list of processors applied in order."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        for processor in self:
            scores = (
                processor(input_ids, scores, **kwargs) if kwargs else processor(input_ids, scores)
            )
        return scores


class _Wrapped(LogitsProcessor):
    def __init__(self, fn):
        self._fn = fn

    def __call__(self, input_ids, scores):
        return self._fn(input_ids, scores)


class MinLengthLogitsProcessor(_Wrapped):
    """No eos while the sequences (prompt included) are shorter than ``min_length``."""

    def __init__(self, min_length: int, eos_token_id: int | list[int]):
        if not isinstance(min_length, int) or min_length < 0:
            raise ValueError(f"min_length must be a non-negative int, got {min_length!r}")
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        super().__init__(lp.min_new_tokens(min_length, 0, eos))


class RepetitionPenaltyLogitsProcessor(_Wrapped):
    """CTRL's penalty on tokens already in the sequence (``penalty > 1`` discourages)."""

    def __init__(self, penalty: float):
        if not float(penalty) > 0:
            raise ValueError(f"penalty must be a positive float, got {penalty!r}")
        super().__init__(lp.repetition_penalty(float(penalty)))


class NoRepeatNGramLogitsProcessor(_Wrapped):
    """Ban tokens that would repeat an n-gram of the sequence."""

    def __init__(self, ngram_size: int):
        if not isinstance(ngram_size, int) or ngram_size <= 0:
            raise ValueError(f"ngram_size must be a positive int, got {ngram_size!r}")
        super().__init__(lp.no_repeat_ngram(ngram_size))


class TemperatureLogitsWarper(_Wrapped):
    def __init__(self, temperature: float):
        if not float(temperature) > 0:
            raise ValueError(f"temperature must be a positive float, got {temperature!r}")
        super().__init__(lp.temperature(float(temperature)))


class TopKLogitsWarper(_Wrapped):
    def __init__(self, top_k: int, filter_value=-float("inf"), min_tokens_to_keep: int = 1):
        if not isinstance(top_k, int) or top_k <= 0:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        _check_filter_value(filter_value)
        super().__init__(lp.top_k(top_k, min_tokens_to_keep))


class TopPLogitsWarper(_Wrapped):
    def __init__(self, top_p: float, filter_value=-float("inf"), min_tokens_to_keep: int = 1):
        if not 0.0 <= float(top_p) <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {top_p!r}")
        _check_filter_value(filter_value)
        super().__init__(lp.top_p(float(top_p), min_tokens_to_keep))


class InfNanRemoveLogitsProcessor(LogitsProcessor):
    """NaN -> 0 and +-inf -> the dtype's max / min, so sampling never breaks."""

    def __call__(self, input_ids, scores):
        info = torch.finfo(scores.dtype)
        return torch.nan_to_num(scores, nan=0.0, posinf=info.max, neginf=info.min)


def _check_filter_value(filter_value) -> None:
    if filter_value != -float("inf"):
        raise ValueError("only filter_value=-inf is supported (the removed tokens' score)")
