"""``build_tokenizer(cfg.tokenization)``: the tokenizer a config describes."""

from __future__ import annotations

import logging
from collections.abc import Mapping

logger = logging.getLogger(__name__)


def _get(cfg, key: str, default):
    return cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)


def build_tokenizer(cfg):
    """Build the tokenizer of a ``tokenization`` config namespace.

    ``cfg.tokenizer`` is a ``LazyCall`` config (``LazyCall(GPT2Tokenizer)(vocab_file=...,
    merges_file=...)``) or an already built tokenizer. With ``cfg.append_eod`` the tokenizer
    must have an end-of-document token. The model's vocabulary size is then
    ``tokenizer.padded_vocab_size(cfg.make_vocab_size_divisible_by)``, the same on every layout.
    """
    tokenizer = _get(cfg, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("the tokenization config has no `tokenizer` entry.")
    if isinstance(tokenizer, Mapping) and "_target_" in tokenizer:
        from libai.config import instantiate

        tokenizer = instantiate(tokenizer)
    if _get(cfg, "append_eod", False) and getattr(tokenizer, "eod", None) is None:
        raise ValueError(
            "tokenization.append_eod=True but the tokenizer has no end-of-document token; "
            "set its eos_token or append_eod=False."
        )
    logger.info("tokenizer %r", tokenizer)
    return tokenizer
