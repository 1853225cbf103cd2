"""GPT-2's byte-level BPE tokenizer on ``vocab.json`` + ``merges.txt``, via the ``tokenizers`` library.

Same pipeline as OpenAI's GPT-2 and Hugging Face's ``GPT2TokenizerFast``: the GPT-2 regex
splits text into words, bytes are mapped to printable characters, BPE merges are applied,
and decoding maps the characters back to bytes. ``<|endoftext|>`` is a special token that
ends every document (``eod``). :func:`byte_level_bpe` is shared with RoBERTa.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from libai.tokenizer.tokenization_base import (
    BaseTokenizer,
    accept_libai_options,
    add_special_tokens,
    check_file,
)

#: LiBai's GPT2Tokenizer keywords that change nothing (LiBai ignores them too)
LIBAI_GPT2_OPTIONS = {
    "do_lower_case": "LiBai's GPT2Tokenizer ignores it: byte-level BPE keeps case",
    "do_chinese_wwm": "whole-word masking marks are a BERT option; GPT-2 does not mask",
    "errors": "decoding replaces invalid bytes, as LiBai's default 'replace'",
}

_VOCAB_HINT = "a vocab.json (GPT-2's, or one trained with the `tokenizers` library)"
_MERGES_HINT = "a merges.txt (GPT-2's, or one trained with the `tokenizers` library)"


def byte_level_bpe(vocab_file, merges_file, add_prefix_space: bool, owner: str) -> Tokenizer:
    """A GPT-2 style byte-level BPE ``Tokenizer`` on ``vocab.json`` + ``merges.txt``.

    Raises:
        FileNotFoundError: a file is missing (the message names it).
        ValueError: a file cannot be parsed.
    """
    vocab_file = check_file(vocab_file, "vocab_file", owner, _VOCAB_HINT)
    merges_file = check_file(merges_file, "merges_file", owner, _MERGES_HINT)
    try:
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
        if not isinstance(vocab, dict):
            raise ValueError("not a JSON object")
        bpe = models.BPE.from_file(vocab_file, merges_file)
    except Exception as e:
        raise ValueError(
            f"Cannot read the BPE vocabulary {vocab_file} / merges {merges_file}: {e}. "
            "vocab.json must be a JSON object token -> id and merges.txt one 'left right' "
            "merge per line."
        ) from e
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class GPT2Tokenizer(BaseTokenizer):
    """Byte-level BPE tokenizer (GPT-2's) built from a vocab and a merges file.

    Args:
        vocab_file: ``vocab.json``, a JSON object token -> id.
        merges_file: ``merges.txt``, one merge per line (an optional ``#version`` header).
        eos_token: end-of-document token, also used as ``eod``; must be in the vocab.
        bos_token: beginning-of-sequence token (GPT-2 uses ``<|endoftext|>``; not added by
            :meth:`encode`).
        pad_token: optional padding token (GPT-2 has none).
        add_prefix_space: treat the text as if it started with a space (GPT-2: ``False``).

    Raises:
        FileNotFoundError: a file is missing (the message names it).
        ValueError: a file cannot be parsed, or a special token is not in the vocab.
    """

    vocab_files_names = {"vocab_file": "vocab.json", "merges_file": "merges.txt"}

    def __init__(
        self,
        vocab_file,
        merges_file,
        eos_token: str = "<|endoftext|>",
        bos_token: str | None = "<|endoftext|>",
        pad_token: str | None = None,
        add_prefix_space: bool = False,
        **libai_options,
    ):
        accept_libai_options("GPT2Tokenizer", libai_options, LIBAI_GPT2_OPTIONS)
        self._init_args = {
            "vocab_file": vocab_file,
            "merges_file": merges_file,
            "eos_token": eos_token,
            "bos_token": bos_token,
            "pad_token": pad_token,
            "add_prefix_space": add_prefix_space,
        }
        self._tokenizer = byte_level_bpe(vocab_file, merges_file, add_prefix_space, "GPT2Tokenizer")
        self.vocab_file, self.merges_file = str(vocab_file), str(merges_file)
        self.add_prefix_space = add_prefix_space
        self._set_special_tokens(eos_token=eos_token, bos_token=bos_token, pad_token=pad_token)
        add_special_tokens(self._tokenizer, self.all_special_tokens)
