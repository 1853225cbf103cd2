"""``generate``: validate the request, prepare the sequences, run the chosen search."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

from libai.inference.generation.config import GenerationConfig
from libai.inference.generation.search import beam_search, sample_search


def _check_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a [batch, seq] tensor of token ids")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
            f"{tuple(input_ids.shape)}"
        )
    if not bool(attention_mask.any(dim=1).all()):
        raise ValueError("a prompt is all padding (an attention_mask row has no 1)")
    return attention_mask.long()


@torch.no_grad()
def generate(
    stepper,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    *,
    tokenizer=None,
    streamer: Callable[[torch.Tensor], None] | None = None,
    extra_processors=(),
    **settings,
) -> torch.Tensor:
    """Generate continuations of ``input_ids`` (``[batch, seq]``, left-padded, with
    ``attention_mask`` 1 for real tokens).

    ``settings`` override ``generation_config`` (:class:`GenerationConfig` field names; an
    unknown name raises ``ValueError``). ``tokenizer`` is needed for ``stop_strings``;
    ``streamer(tokens)`` is called after every step with the new token of each row
    (``[rows]``; greedy and sampling only). ``extra_processors``: a caller's own
    ``(ids, scores) -> scores`` processors, applied after the config's.

    Returns, on every rank, ``[batch * num_return_sequences, len]``: decoder-only models the
    prompt followed by the new tokens, encoder-decoder models the decoder sequence starting
    with ``decoder_start_token_id``. Finished rows are padded with ``pad_token_id``.
    """
    config = (generation_config or GenerationConfig()).updated(**settings)
    attention_mask = _check_prompt(input_ids, attention_mask)
    if streamer is not None and config.num_beams > 1:
        raise ValueError("streamer is not supported with beam search (num_beams > 1)")
    expand = max(config.num_beams, config.num_return_sequences)
    if stepper.is_encoder_decoder:
        start = config.decoder_start_token_id
        if start is None:
            raise ValueError("an encoder-decoder model needs decoder_start_token_id")
        rows = input_ids.shape[0] * expand
        sequences = torch.full((rows, 1), start, dtype=torch.long, device=input_ids.device)
        mask = torch.ones_like(sequences)
    else:
        sequences = input_ids.repeat_interleave(expand, dim=0)
        mask = attention_mask.repeat_interleave(expand, dim=0)
    max_length = sequences.shape[1] + config.max_new_tokens
    limit = getattr(stepper, "max_positions", None)
    if limit is not None and max_length > limit:
        raise ValueError(
            f"the prompt ({sequences.shape[1]} tokens) plus max_new_tokens="
            f"{config.max_new_tokens} needs {max_length} positions but the model has "
            f"{limit}; shorten the prompt or lower max_new_tokens"
        )
    cache_settings = config.cache_settings()
    if cache_settings and not getattr(stepper, "supports_static_cache", False):
        raise ValueError(
            f"{type(stepper).__name__} keeps its own cache: {sorted(cache_settings)} apply to "
            "ModelStepper only"
        )
    stepper.start(input_ids, attention_mask, expand, max_length, **cache_settings)
    if config.num_beams > 1:
        return beam_search(
            stepper, sequences, mask, config, tokenizer=tokenizer, extra_processors=extra_processors
        )
    generators = None
    if config.do_sample and config.seed is not None:
        generators = row_generators(config.seed, input_ids, attention_mask, expand)
    return sample_search(
        stepper,
        sequences,
        mask,
        config,
        generators=generators,
        tokenizer=tokenizer,
        streamer=streamer,
        extra_processors=extra_processors,
    )


def row_generators(seed: int, input_ids, attention_mask, copies: int) -> list[torch.Generator]:
    """One generator per output row, seeded from ``seed``, the row's prompt tokens and its
    copy index: a prompt's sampled continuation does not depend on the other prompts of the
    batch, its padding, or how the batch is split over data-parallel replicas."""
    out = []
    for ids, keep in zip(input_ids.tolist(), attention_mask.tolist()):
        prompt = [t for t, k in zip(ids, keep) if k]
        for copy in range(copies):
            digest = hashlib.sha256(f"{seed}/{copy}/{prompt}".encode()).digest()
            generator = torch.Generator(device=input_ids.device)
            out.append(generator.manual_seed(int.from_bytes(digest[:8], "little") >> 1))
    return out
