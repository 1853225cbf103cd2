"""LiBai's ``libai.inference.generator``: the ``Generator`` mixin its project models inherit
(``generate`` with greedy search, sampling and beam search) and its logits processors, run
by libai's decoding loops (:mod:`libai.inference.generation`)."""

from libai.inference.generator.generation_logits_processor import (
    InfNanRemoveLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    LogitsWarper,
    MinLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from libai.inference.generator.generation_utils import Generator

__all__ = [
    "Generator",
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
