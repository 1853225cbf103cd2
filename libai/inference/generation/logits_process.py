"""Logits processors of generation, in the order transformers applies them.

Each takes the token ids so far ``[batch, cur_len]`` and the next-token scores
``[batch, vocab]`` (float32) and returns new scores. :func:`build_processors` picks the ones
a :class:`GenerationConfig` asks for: first the penalties and constraints (repetition
penalty, no-repeat-ngram, min new tokens), then, when sampling, the warpers (temperature,
top-k, top-p).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from libai.inference.generation.config import GenerationConfig

Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def repetition_penalty(penalty: float, left_pads: torch.Tensor | None = None) -> Processor:
    """Tokens already in the sequence: positive scores divided by ``penalty``, negative ones
    multiplied (CTRL's penalty). The first ``left_pads[row]`` positions (padding) are skipped."""

    def apply(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        if left_pads is not None:  # point padding at an extra scratch column
            position = torch.arange(ids.shape[1], device=ids.device)
            ids = ids.masked_fill(position < left_pads.to(ids.device)[:, None], vocab)
        padded = torch.nn.functional.pad(scores, (0, 1))
        seen = padded.gather(1, ids)
        seen = torch.where(seen < 0, seen * penalty, seen / penalty)
        return padded.scatter(1, ids, seen)[:, :vocab]

    return apply


def no_repeat_ngram(n: int) -> Processor:
    """Ban every token that would complete an n-gram already present in the sequence."""

    def apply(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        cur_len = ids.shape[1]
        if cur_len < n:
            return scores
        scores = scores.clone()
        for row, tokens in enumerate(ids.tolist()):
            prefix = tuple(tokens[cur_len - n + 1 :]) if n > 1 else ()
            banned = {
                tokens[i + n - 1]
                for i in range(cur_len - n + 1)
                if tuple(tokens[i : i + n - 1]) == prefix
            }
            if banned:
                scores[row, list(banned)] = -float("inf")
        return scores

    return apply


def min_new_tokens(minimum: int, prompt_len: int, eos_ids: list[int]) -> Processor:
    """Mask the eos tokens until ``minimum`` tokens were generated after the prompt."""
    eos = torch.tensor(eos_ids, dtype=torch.long)

    def apply(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] - prompt_len >= minimum:
            return scores
        scores = scores.clone()
        scores[:, eos.to(scores.device)] = -float("inf")
        return scores

    return apply


def temperature(t: float) -> Processor:
    return lambda ids, scores: scores / t


def top_k(k: int, min_tokens_to_keep: int = 1) -> Processor:
    """Keep the ``k`` highest scores (ties with the k-th are kept too)."""

    def apply(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        keep = min(max(k, min_tokens_to_keep), scores.shape[-1])
        threshold = torch.topk(scores, keep)[0][..., -1, None]
        return scores.masked_fill(scores < threshold, -float("inf"))

    return apply


def top_p(p: float, min_tokens_to_keep: int = 1) -> Processor:
    """Keep the smallest set of most likely tokens whose probability adds up to ``p``."""

    def apply(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        sorted_scores, sorted_idx = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - p)
        remove[..., -min_tokens_to_keep:] = False
        remove = remove.scatter(1, sorted_idx, remove)
        return scores.masked_fill(remove, -float("inf"))

    return apply


def build_processors(
    config: GenerationConfig, prompt_len: int, left_pads: torch.Tensor | None = None
) -> list[Processor]:
    """The processors ``config`` asks for, in application order. ``prompt_len`` is the
    length of the sequences before the first new token (decoder-only: the prompt;
    encoder-decoder: the decoder start token); ``left_pads`` the padding per row."""
    out: list[Processor] = []
    if config.repetition_penalty != 1.0:
        out.append(repetition_penalty(config.repetition_penalty, left_pads))
    if config.no_repeat_ngram_size > 0:
        out.append(no_repeat_ngram(config.no_repeat_ngram_size))
    if config.min_new_tokens > 0 and config.eos_token_ids:
        out.append(min_new_tokens(config.min_new_tokens, prompt_len, config.eos_token_ids))
    if config.do_sample:
        keep = 1 if config.num_beams == 1 else len(config.eos_token_ids) + 1
        if config.temperature != 1.0:
            out.append(temperature(config.temperature))
        if config.top_k:
            out.append(top_k(config.top_k, keep))
        if config.top_p < 1.0:
            out.append(top_p(config.top_p, keep))
    return out


def apply_processors(processors: list[Processor], ids: torch.Tensor, scores: torch.Tensor):
    for process in processors:
        scores = process(ids, scores)
    return scores
