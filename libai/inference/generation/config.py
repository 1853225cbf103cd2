"""Generation settings: one validated dataclass, unknown names rejected."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class GenerationConfig:
    """How :func:`libai.inference.generation.generate` decodes.

    Length: ``max_new_tokens`` (default 20) and ``min_new_tokens`` (eos is masked until that
    many tokens exist). Search: greedy (default), multinomial sampling (``do_sample``, with
    ``temperature``, ``top_k``, ``top_p``; with a ``seed`` each prompt's samples depend only
    on the prompt and the seed, not on the batch or the layout), or beam search
    (``num_beams > 1``, ``length_penalty``, ``early_stopping`` = True / False / "never").
    Penalties: ``repetition_penalty`` (> 1 discourages tokens already present),
    ``no_repeat_ngram_size``. Stopping: ``eos_token_id`` (one id or a list), ``stop_strings``
    (needs a tokenizer; a sequence ends once its generated text contains one). Finished
    sequences are padded with ``pad_token_id`` (eos when unset). Encoder-decoder models start
    the decoder with ``decoder_start_token_id``.

    KV cache and compilation (transformers' names; None = the stepper's default, see
    :mod:`libai.inference.generation.stepper`): ``cache_implementation`` ``"dynamic"`` (a
    cache that grows) or ``"static"`` (fixed-shape buffers of ``max_cache_len`` slots, default
    prompt + ``max_new_tokens``); ``compile=True`` runs each decode step through
    ``torch.compile`` on the static cache (CUDA graphs on CUDA). Tokens are the same either way.
    """

    max_new_tokens: int = 20
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    stop_strings: str | list[str] | None = None
    seed: int | None = None
    cache_implementation: str | None = None
    max_cache_len: int | None = None
    compile: bool | None = None

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def updated(self, **kwargs) -> GenerationConfig:
        """A copy with ``kwargs`` applied; an unknown name raises ``ValueError`` naming it."""
        unknown = sorted(set(kwargs) - set(self.names()))
        if unknown:
            raise ValueError(
                f"unknown generation argument(s) {unknown}; valid arguments: {self.names()}"
            )
        config = dataclasses.replace(self, **kwargs)
        config.validate()
        return config

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return (
            [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)
        )

    def cache_settings(self) -> dict:
        """The cache / compile settings that are set (for ``stepper.start``)."""
        names = ("cache_implementation", "max_cache_len", "compile")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @property
    def stop_string_list(self) -> list[str]:
        if not self.stop_strings:
            return []
        return (
            [self.stop_strings] if isinstance(self.stop_strings, str) else list(self.stop_strings)
        )

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad setting."""

        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: {rule}")

        need(_is_int(self.max_new_tokens) and self.max_new_tokens >= 0, "max_new_tokens", ">= 0")
        need(_is_int(self.min_new_tokens) and self.min_new_tokens >= 0, "min_new_tokens", ">= 0")
        need(self.temperature > 0, "temperature", "must be > 0 (use do_sample=False for greedy)")
        need(_is_int(self.top_k) and self.top_k >= 0, "top_k", "an integer >= 0 (0 = off)")
        need(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(self.repetition_penalty > 0, "repetition_penalty", "must be > 0")
        need(_is_int(self.no_repeat_ngram_size) and self.no_repeat_ngram_size >= 0,
             "no_repeat_ngram_size", ">= 0")  # fmt: skip
        need(_is_int(self.num_beams) and self.num_beams >= 1, "num_beams", ">= 1")
        need(self.early_stopping in (True, False, "never"), "early_stopping",
             "True, False or 'never'")  # fmt: skip
        need(_is_int(self.num_return_sequences) and self.num_return_sequences >= 1,
             "num_return_sequences", ">= 1")  # fmt: skip
        need(self.cache_implementation in (None, "dynamic", "static"), "cache_implementation",
             "'dynamic' or 'static'")  # fmt: skip
        need(self.max_cache_len is None or (_is_int(self.max_cache_len) and self.max_cache_len > 0),
             "max_cache_len", "an integer >= 1 (or None: prompt + max_new_tokens)")  # fmt: skip
        need(self.compile in (None, True, False), "compile", "True, False or None")
        dynamic = self.cache_implementation == "dynamic"
        need(not (dynamic and self.compile), "compile",
             "a compiled decode step needs cache_implementation='static'")  # fmt: skip
        need(not (dynamic and self.max_cache_len), "max_cache_len",
             "applies to cache_implementation='static' only")  # fmt: skip
        if self.num_beams > 1:
            need(not self.do_sample, "do_sample", "beam sampling is not supported; use num_beams=1")
            need(self.num_return_sequences <= self.num_beams, "num_return_sequences",
                 f"at most num_beams={self.num_beams}")  # fmt: skip
        elif not self.do_sample:
            need(self.num_return_sequences == 1, "num_return_sequences",
                 "greedy search returns one sequence; use do_sample=True or num_beams")  # fmt: skip


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
