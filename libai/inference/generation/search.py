"""The decoding loops: greedy / multinomial sampling and beam search.

Both drive a *stepper* (see :mod:`libai.inference.generation.stepper`), which owns the model
and its KV cache and answers "the next-token logits after these sequences". The loops run on
every rank: only the last pipeline stage has logits, so it picks the tokens and
``stepper.share`` hands them to the other stages, which keep the same sequences.

The semantics follow transformers' ``generate`` (processor order, eos padding, beam scoring
with ``length_penalty`` over the generated length, ``early_stopping``), so greedy and beam
outputs match it token for token on the same weights.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from libai.inference.generation.config import GenerationConfig
from libai.inference.generation.logits_process import apply_processors, build_processors

_NEG = -1e9  # transformers' "impossible" score in beam search


class _StopStrings:
    """Ends a sequence once its generated text holds a stop string that ends in (or runs
    through) the newest token."""

    def __init__(self, stop_strings: list[str], tokenizer, prompt_len: int):
        if stop_strings and tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass tokenizer= to generate")
        self.stop_strings, self.tokenizer, self.prompt_len = stop_strings, tokenizer, prompt_len

    def __call__(self, sequences: torch.Tensor) -> torch.Tensor:
        hit = torch.zeros(sequences.shape[0], dtype=torch.bool, device=sequences.device)
        if not self.stop_strings:
            return hit
        for row, ids in enumerate(sequences[:, self.prompt_len :].tolist()):
            text = self.tokenizer.decode(ids)
            # the text the newest token left as it was: not all of the text before it when
            # that ended in part of a character (byte-level BPE decodes it to U+FFFD)
            kept = len(os.path.commonprefix([self.tokenizer.decode(ids[:-1]), text]))
            for stop in self.stop_strings:
                # a match that ends after the kept text: one not found at an earlier step
                if text.find(stop, max(0, kept - len(stop) + 1)) != -1:
                    hit[row] = True
        return hit


def _eos_hit(last_tokens: torch.Tensor, eos_ids: list[int] | torch.Tensor) -> torch.Tensor:
    if len(eos_ids) == 0:
        return torch.zeros_like(last_tokens, dtype=torch.bool)
    if not isinstance(eos_ids, torch.Tensor):
        eos_ids = torch.tensor(eos_ids, device=last_tokens.device)
    return torch.isin(last_tokens, eos_ids)


def _left_pad_counts(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """Per row, the number of leading padding tokens (None without padding)."""
    if bool(attention_mask.all()):
        return None
    return (attention_mask != 0).int().argmax(dim=1)


def _next_tokens(stepper, sequences, attention_mask, processors, config, generators):
    """The next token of each row on the last stage (None on the others): the logits,
    the processors, then the argmax or a multinomial draw."""
    logits = stepper.next_logits(sequences, attention_mask)
    if not stepper.is_last:
        return None
    scores = apply_processors(processors, sequences, logits.float())
    if not config.do_sample:
        return scores.argmax(dim=-1)
    probs = scores.softmax(dim=-1)
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(1)
    return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])


def sample_search(
    stepper,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    config: GenerationConfig,
    *,
    generators: list[torch.Generator] | None = None,
    tokenizer=None,
    streamer: Callable[[torch.Tensor], None] | None = None,
    extra_processors=(),
) -> torch.Tensor:
    """Greedy (``do_sample=False``) or multinomial decoding; returns ``[B, prompt + new]``.
    ``generators``: one random generator per row (seeded sampling), else the global RNG.
    ``extra_processors``: ``(ids, scores) -> scores`` callables applied after the config's
    (a caller's own logits processors)."""
    prompt_len = sequences.shape[1]
    eos = config.eos_token_ids
    pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
    processors = build_processors(config, prompt_len, _left_pad_counts(attention_mask))
    processors += list(extra_processors)
    stop = _StopStrings(config.stop_string_list, tokenizer, prompt_len)
    unfinished = torch.ones(sequences.shape[0], dtype=torch.bool, device=sequences.device)
    # with neither eos nor stop strings no row can finish early: no device read per token
    # (the host then queues the next step while the device runs this one)
    can_stop = bool(eos) or bool(stop.stop_strings)
    eos_ids = torch.tensor(eos, device=sequences.device) if eos else []
    # greedy without processors on a compiled static cache: the argmax is in the graph
    fused = getattr(stepper, "fuses_greedy", None)
    fused = fused is not None and fused(config, processors)
    for _ in range(config.max_new_tokens):
        if fused:
            tokens = stepper.greedy_next(sequences, attention_mask)
        else:
            tokens = _next_tokens(
                stepper, sequences, attention_mask, processors, config, generators
            )
        if eos and tokens is not None:
            tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad))
        (tokens,) = stepper.share((tokens,))
        sequences = torch.cat((sequences, tokens[:, None]), dim=1)
        attention_mask = torch.cat((attention_mask, attention_mask.new_ones(len(tokens), 1)), 1)
        if streamer is not None:
            streamer(tokens)
        if not can_stop:
            continue
        unfinished &= ~(_eos_hit(tokens, eos_ids) | stop(sequences))
        if not bool(unfinished.any()):
            break
    return sequences


def beam_search(
    stepper,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    config: GenerationConfig,
    *,
    tokenizer=None,
    extra_processors=(),
) -> torch.Tensor:
    """Beam search over ``sequences`` already expanded to ``[B * num_beams, len]`` (rows of
    one input adjacent). Returns ``[B * num_return_sequences, len + generated]``.
    ``extra_processors`` as :func:`sample_search`'s."""
    k, device = config.num_beams, sequences.device
    total, prompt_len = sequences.shape
    batch = total // k
    max_length = prompt_len + config.max_new_tokens
    eos = config.eos_token_ids
    keep = max(2, 1 + len(eos)) * k
    # hypotheses that ended early are padded as transformers' beam search pads them when
    # there is an eos: with a non-zero pad_token_id, else eos (T5's pad 0 too). Without an
    # eos: with pad_token_id where transformers writes -1, and -1 without either
    fill = config.pad_token_id if config.pad_token_id else (eos[0] if eos else -1)
    processors = build_processors(config, prompt_len, _left_pad_counts(attention_mask))
    processors += list(extra_processors)
    stop = _StopStrings(config.stop_string_list, tokenizer, prompt_len)
    top_rank = torch.arange(keep, device=device) < k  # only the top k candidates may finish

    running = torch.full((batch, k, max_length), fill, dtype=torch.long, device=device)
    running[:, :, :prompt_len] = sequences.view(batch, k, prompt_len)
    finished = running.clone()
    running_scores = torch.zeros(batch, k, device=device)
    running_scores[:, 1:] = _NEG  # identical beams at the start: only the first one expands
    finished_scores = torch.full((batch, k), _NEG, device=device)
    is_finished = torch.zeros(batch, k, dtype=torch.bool, device=device)
    finished_lengths = torch.zeros(batch, k, dtype=torch.long, device=device)
    unsatisfied = torch.ones(batch, 1, dtype=torch.bool, device=device)
    offsets = (torch.arange(batch, device=device) * k)[:, None]
    cur_len = prompt_len
    lp = config.length_penalty
    while cur_len < max_length:
        grown = attention_mask.new_ones(total, cur_len - prompt_len)
        logits = stepper.next_logits(
            running[:, :, :cur_len].reshape(total, cur_len), torch.cat((attention_mask, grown), 1)
        )
        cand_scores = cand_index = None
        if stepper.is_last:
            vocab = logits.shape[-1]
            logp = logits.float().log_softmax(dim=-1)  # transformers: before the processors
            logp = apply_processors(processors, running[:, :, :cur_len].reshape(total, -1), logp)
            accumulated = (logp.view(batch, k, vocab) + running_scores[:, :, None]).view(batch, -1)
            cand_scores, cand_index = torch.topk(accumulated, keep)
        cand_scores, cand_index = stepper.share((cand_scores, cand_index))
        vocab_size = int(stepper.vocab_size)
        source, tokens = cand_index // vocab_size, cand_index % vocab_size
        cand = running.gather(1, source[:, :, None].expand(-1, -1, max_length)).clone()
        cand[:, :, cur_len] = tokens
        flat = cand[:, :, : cur_len + 1].reshape(batch * keep, -1)
        hit = (_eos_hit(flat[:, -1], eos) | stop(flat)).view(batch, keep)
        if cur_len + 1 >= max_length:
            hit[:] = True
        # the next running beams: the best k candidates that did not end
        alive = cand_scores + hit.float() * _NEG
        best = torch.topk(alive, k).indices
        running = cand.gather(1, best[:, :, None].expand(-1, -1, max_length))
        running_scores = alive.gather(1, best)
        beam_index = source.gather(1, best) + offsets
        # finished hypotheses: top-k candidates that ended, scored over the generated length
        generated = cur_len + 1 - prompt_len
        scores = cand_scores / (generated**lp)
        full = is_finished.all(-1, keepdim=True) & (config.early_stopping is True)
        scores = scores + (full | ~unsatisfied).float() * _NEG + (~(hit & top_rank)).float() * _NEG
        merged_scores = torch.cat((finished_scores, scores), 1)
        chosen = torch.topk(merged_scores, k).indices
        merged = torch.cat((finished, cand), 1)
        finished = merged.gather(1, chosen[:, :, None].expand(-1, -1, max_length))
        finished_scores = merged_scores.gather(1, chosen)
        is_finished = torch.cat((is_finished, hit & top_rank), 1).gather(1, chosen)
        lengths = torch.cat(
            (finished_lengths, torch.full_like(hit, generated, dtype=torch.long)), 1
        )
        finished_lengths = lengths.gather(1, chosen)
        cur_len += 1
        if cur_len >= max_length:
            break
        stepper.reorder(beam_index.flatten())
        # may a running beam still beat the worst finished one? (transformers' heuristic)
        never = config.early_stopping == "never" and lp > 0
        length = (max_length - prompt_len) if never else (cur_len - prompt_len)
        best_running = running_scores[:, :1] / (length**lp)
        worst = torch.where(
            is_finished,
            finished_scores.min(1, keepdim=True).values,
            torch.full_like(finished_scores, _NEG),
        )
        unsatisfied = unsatisfied & (best_running > worst).any(-1, keepdim=True)
        all_full = bool(is_finished.all()) and config.early_stopping is True
        if not bool(unsatisfied.any()) or all_full or bool(hit.all()):
            break
    n = config.num_return_sequences
    out = finished[:, :n].reshape(batch * n, max_length)
    generated = int(finished_lengths[:, :n].max())
    return out[:, : prompt_len + generated]
