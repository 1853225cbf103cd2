"""LiBai's ``Generator``: the ``generate`` mixin of LiBai's project models, on libai's loops.

A LiBai project model (``class GPTModel(nn.Module, Generator)``) keeps its own KV cache and
gives :meth:`Generator.generate` three things, as in LiBai (an encoder-decoder model, with
``cfg.is_encoder_decoder``, also ``forward(..., only_encoder=True)`` returning the encoder
output, which each step's ``prepare_inputs_for_generation`` gets as ``encoder_outputs``
with ``encoder_attn_mask``):

- ``forward(**inputs)`` returning ``{"logits": [batch, seq, vocab]}``;
- ``prepare_inputs_for_generation(input_ids, past=None, use_cache=None, ...)``: the forward
  inputs for the next step (with a ``past`` cache: the last token only);
- ``_reorder_cache(beam_idx)`` (beam search): the cache with its rows reordered.

The cache handed back as ``past`` is ``outputs["past_key_values"]`` when the forward returns
one, else the model's ``past_key_values`` attribute once its last entry is set (LiBai's
rule). Defaults of the generation settings come from ``self.cfg`` (``max_length``,
``num_beams``, ``eos_token_id``, ...) and else transformers' defaults. The decoding itself
is libai's (:func:`libai.inference.generation.generate`): greedy, multinomial sampling and
beam search with transformers' semantics.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch

from libai.inference.generation import GenerationConfig
from libai.inference.generation import generate as run_generate
from libai.inference.generator.generation_logits_processor import (
    LogitsProcessor,
    LogitsProcessorList,
)

__all__ = ["Generator", "LogitsProcessor", "LogitsProcessorList"]

#: transformers' default total length when neither max_length nor max_new_tokens is set
DEFAULT_MAX_LENGTH = 20

#: LiBai's generate arguments not implemented here -> the value that means "off"
UNSUPPORTED = {
    "typical_p": None,
    "force_words_ids": None,
    "encoder_no_repeat_ngram_size": None,
    "max_time": None,
    "num_beam_groups": 1,
    "diversity_penalty": None,
    "prefix_allowed_tokens_fn": None,
    "renormalize_logits": None,
    "constraints": None,
    "output_scores": False,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "remove_invalid_values": None,
    "exponential_decay_length_penalty": None,
}


class _ProjectModelStepper:
    """Drives a LiBai project model step by step for libai's decoding loops."""

    is_last = True  # one process holds the whole model here

    def __init__(
        self, model, model_kwargs: dict, use_cache: bool, pass_mask: bool, encoder_decoder: bool
    ):
        self.model, self.model_kwargs = model, model_kwargs
        self.use_cache, self.pass_mask = use_cache, pass_mask
        self.is_encoder_decoder = encoder_decoder
        self.past, self.vocab_size, self.kwargs = None, None, {}

    def start(self, input_ids, attention_mask, expand: int, max_length: int) -> None:
        self.kwargs = {
            k: v.repeat_interleave(expand, dim=0) if isinstance(v, torch.Tensor) else v
            for k, v in self.model_kwargs.items()
        }
        self.past = None
        _release(self.model)

    def next_logits(self, sequences: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        kwargs = dict(self.kwargs, past=self.past, use_cache=self.use_cache)
        if self.pass_mask:
            kwargs["attention_mask"] = attention_mask
        outputs = self.model(**self.model.prepare_inputs_for_generation(sequences, **kwargs))
        if "past_key_values" in outputs:
            self.past = outputs["past_key_values"]
        else:
            cache = getattr(self.model, "past_key_values", None)
            self.past = cache if cache and cache[-1] is not None else None
        logits = outputs["logits"][:, -1, :]
        self.vocab_size = logits.shape[-1]
        return logits

    def reorder(self, beam_idx: torch.Tensor) -> None:
        if self.past is not None:
            self.past = self.model._reorder_cache(beam_idx)

    def share(self, tensors: tuple) -> tuple:
        return tensors


def _release(model) -> None:
    """LiBai's "release records": the model's stored cache emptied."""
    cache = getattr(model, "past_key_values", None)
    if isinstance(cache, list):
        model.past_key_values = [None] * len(cache)


class Generator:
    """Mixin giving a LiBai project model ``generate`` (see the module docstring)."""

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, **kwargs) -> dict:
        """The forward inputs of one decoding step (override in the model, as in LiBai)."""
        return {"input_ids": input_ids}

    def _reorder_cache(self, beam_idx: torch.Tensor):
        raise NotImplementedError(
            f"{type(self).__name__} needs a `_reorder_cache(beam_idx)` method for beam search "
            "(num_beams > 1): its cache with the rows reordered by beam_idx"
        )

    def _encode_for_generation(self, input_ids, attention_mask, model_kwargs) -> dict:
        """LiBai's encoder pass of an encoder-decoder model: ``self(encoder_input_ids=...,
        encoder_attn_mask=..., only_encoder=True)`` gives ``encoder_outputs``; the masks go
        on to every decoding step (``encoder_decoder_attn_mask`` too when the forward takes
        it)."""
        kwargs = {"encoder_attn_mask": attention_mask}
        if "encoder_decoder_attn_mask" in inspect.signature(self.forward).parameters:
            kwargs["encoder_decoder_attn_mask"] = attention_mask
        encoder_outputs = self(
            **model_kwargs, **kwargs, encoder_input_ids=input_ids, only_encoder=True
        )
        return {**kwargs, "encoder_outputs": encoder_outputs}

    def _generation_default(self, name: str, default):
        cfg = getattr(self, "cfg", None)
        if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
            value = cfg.get(name, None)
        else:
            value = getattr(cfg, name, None)
        return default if value is None else value

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        max_length: int | None = None,
        min_length: int | None = None,
        do_sample: bool | None = None,
        early_stopping: bool | str | None = None,
        num_beams: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        bos_token_id: int | None = None,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        length_penalty: float | None = None,
        no_repeat_ngram_size: int | None = None,
        num_return_sequences: int | None = None,
        max_new_tokens: int | None = None,
        use_cache: bool | None = None,
        logits_processor: LogitsProcessorList | None = None,
        stopping_criteria=None,
        **model_kwargs,
    ) -> torch.Tensor:
        """Generate after ``inputs`` (``[batch, seq]`` token ids; ``input_ids=`` also works,
        none = one ``bos_token_id``). LiBai's arguments; ``max_length`` / ``min_length``
        count the prompt (an encoder-decoder's decoder start token), ``max_new_tokens`` does
        not. ``logits_processor``: processors applied after the built-in ones. Returns
        ``[batch * num_return_sequences, len]``: the prompt followed by the new tokens, or
        for an encoder-decoder model (``cfg.is_encoder_decoder``; ``inputs`` are the encoder
        ids) the decoder sequence from ``decoder_start_token_id``; finished rows are padded
        with ``pad_token_id``.
        """
        encoder_decoder = bool(self._generation_default("is_encoder_decoder", False))
        for name, off in UNSUPPORTED.items():
            value = model_kwargs.pop(name, off)
            if value is not None and value != off:
                raise NotImplementedError(
                    f"generate({name}={value!r}) is not supported here; leave {name} unset"
                )
        if stopping_criteria:
            raise NotImplementedError(
                "custom stopping_criteria are not supported; use max_length / max_new_tokens "
                "and eos_token_id"
            )
        name = "encoder_input_ids" if encoder_decoder else "input_ids"
        if inputs is not None and model_kwargs.get(name) is not None:
            raise ValueError(f"give the prompt as inputs or as {name}, not both")
        input_ids = inputs if inputs is not None else model_kwargs.pop(name, None)
        model_kwargs.pop(name, None)
        bos = (
            bos_token_id
            if bos_token_id is not None
            else self._generation_default("bos_token_id", None)
        )
        if input_ids is None:
            if bos is None:
                raise ValueError("`bos_token_id` has to be defined when no input_ids are given")
            input_ids = torch.full((1, 1), bos, dtype=torch.long)
        pad = (
            pad_token_id
            if pad_token_id is not None
            else self._generation_default("pad_token_id", None)
        )
        eos = (
            eos_token_id
            if eos_token_id is not None
            else self._generation_default("eos_token_id", None)
        )
        mask_name = "encoder_attn_mask" if encoder_decoder else "attention_mask"
        attention_mask = model_kwargs.pop(mask_name, None)
        if attention_mask is None:  # LiBai's rule: padding only when pad is in and != eos
            padded = pad is not None and bool((input_ids == pad).any()) and pad != eos
            attention_mask = input_ids.ne(pad).long() if padded else torch.ones_like(input_ids)
        forward_params = inspect.signature(self.forward).parameters
        start = None
        if encoder_decoder:
            start = model_kwargs.pop("decoder_start_token_id", None)
            start = (
                start
                if start is not None
                else self._generation_default("decoder_start_token_id", bos)
            )
            model_kwargs.update(
                self._encode_for_generation(input_ids, attention_mask, model_kwargs)
            )
        prompt = 1 if encoder_decoder else input_ids.shape[1]
        if max_length is not None and max_new_tokens is not None:
            raise ValueError("give max_length or max_new_tokens, not both")
        if max_new_tokens is None:
            total = (
                max_length
                if max_length is not None
                else self._generation_default("max_length", DEFAULT_MAX_LENGTH)
            )
            max_new_tokens = max(int(total) - prompt, 0)
        min_length = (
            min_length if min_length is not None else self._generation_default("min_length", 0)
        )

        def pick(value, name, default):
            return value if value is not None else self._generation_default(name, default)

        defaults = GenerationConfig()
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            min_new_tokens=max(int(min_length) - prompt, 0),
            do_sample=bool(pick(do_sample, "do_sample", False)),
            temperature=float(pick(temperature, "temperature", defaults.temperature)),
            top_k=int(pick(top_k, "top_k", defaults.top_k)),
            top_p=float(pick(top_p, "top_p", defaults.top_p)),
            repetition_penalty=float(pick(repetition_penalty, "repetition_penalty", 1.0)),
            no_repeat_ngram_size=int(pick(no_repeat_ngram_size, "no_repeat_ngram_size", 0)),
            num_beams=int(pick(num_beams, "num_beams", 1)),
            length_penalty=float(pick(length_penalty, "length_penalty", 1.0)),
            early_stopping=pick(early_stopping, "early_stopping", False),
            num_return_sequences=int(pick(num_return_sequences, "num_return_sequences", 1)),
            eos_token_id=eos,
            pad_token_id=pad,
            decoder_start_token_id=start,
        )
        use_cache = bool(pick(use_cache, "use_cache", True))
        pass_mask = not encoder_decoder and "attention_mask" in forward_params
        stepper = _ProjectModelStepper(self, model_kwargs, use_cache, pass_mask, encoder_decoder)
        try:
            return run_generate(
                stepper,
                input_ids,
                attention_mask,
                config,
                extra_processors=list(logits_processor or ()),
            )
        finally:
            _release(self)
