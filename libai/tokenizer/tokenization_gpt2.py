"""GPT-2's byte-level BPE tokenizer on ``vocab.json`` + ``merges.txt``, via the ``tokenizers`` library.

Same pipeline as OpenAI's GPT-2 and Hugging Face's ``GPT2TokenizerFast``: the GPT-2 regex
splits text into words, bytes are mapped to printable characters, BPE merges are applied,
and decoding maps the characters back to bytes. ``<|endoftext|>`` is a special token that
ends every document (``eod``).
"""

from __future__ import annotations

import json
import os
import shutil

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def _check_file(path, what: str) -> str:
    if path is None:
        raise ValueError(f"GPT2Tokenizer needs a {what} (tokenization.tokenizer.{what}).")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"GPT2Tokenizer {what} not found: {path} does not exist. Set "
            f"tokenization.tokenizer.{what} (or --{what.replace('_', '-')}) to GPT-2's "
            f"{'vocab.json' if what == 'vocab_file' else 'merges.txt'} or one trained with "
            "the `tokenizers` library."
        )
    return path


class GPT2Tokenizer:
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
        ValueError: a file cannot be parsed, or ``eos_token`` is not in the vocab.
    """

    def __init__(
        self,
        vocab_file,
        merges_file,
        eos_token: str = "<|endoftext|>",
        bos_token: str | None = "<|endoftext|>",
        pad_token: str | None = None,
        add_prefix_space: bool = False,
    ):
        self.vocab_file = _check_file(vocab_file, "vocab_file")
        self.merges_file = _check_file(merges_file, "merges_file")
        self.eos_token, self.bos_token, self.pad_token = eos_token, bos_token, pad_token
        self.add_prefix_space = add_prefix_space
        try:
            with open(self.vocab_file, encoding="utf-8") as f:
                vocab = json.load(f)
            if not isinstance(vocab, dict):
                raise ValueError("not a JSON object")
            bpe = models.BPE.from_file(self.vocab_file, self.merges_file)
        except Exception as e:
            raise ValueError(
                f"Cannot read the BPE vocabulary {self.vocab_file} / merges {self.merges_file}: "
                f"{e}. vocab.json must be a JSON object token -> id and merges.txt one "
                "'left right' merge per line."
            ) from e
        tokenizer = Tokenizer(bpe)
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        tokenizer.decoder = decoders.ByteLevel()
        specials = []
        for name, token in (
            ("eos_token", eos_token),
            ("bos_token", bos_token),
            ("pad_token", pad_token),
        ):
            if token is None:
                continue
            if token not in vocab:
                raise ValueError(
                    f"GPT2Tokenizer {name}={token!r} is not in {self.vocab_file}; add it to the "
                    f"vocabulary or set {name} to a token that is."
                )
            specials.append(AddedToken(token, special=True, normalized=False))
        tokenizer.add_special_tokens(specials)
        self._tokenizer = tokenizer

    # Rebuild from the files when pickled (DataLoader / multiprocessing workers).
    def __getstate__(self):
        return {
            "vocab_file": self.vocab_file,
            "merges_file": self.merges_file,
            "eos_token": self.eos_token,
            "bos_token": self.bos_token,
            "pad_token": self.pad_token,
            "add_prefix_space": self.add_prefix_space,
        }

    def __setstate__(self, state):
        self.__init__(**state)

    def __repr__(self) -> str:
        return f"GPT2Tokenizer(vocab_file={self.vocab_file!r}, vocab_size={self.vocab_size})"

    # ---- encoding -----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens are added)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` for many texts at once (parallel in the Rust library)."""
        return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def tokenize(self, text: str) -> list[str]:
        """Byte-level BPE token strings of ``text`` (e.g. ``"Ġworld"`` for ``" world"``)."""
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids`` (a list, numpy array or tensor of ids)."""
        ids = [int(i) for i in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        """Id of a token string, or ids of a list of them; unknown tokens raise ``KeyError``."""
        if isinstance(tokens, str):
            token_id = self._tokenizer.token_to_id(tokens)
            if token_id is None:
                raise KeyError(f"token {tokens!r} is not in the vocabulary {self.vocab_file}")
            return token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        """Token string of an id, or of each id in a list."""
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(int(i)) for i in ids]

    # ---- vocabulary ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included (50257 for GPT-2)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def padded_vocab_size(self, multiple: int = 1) -> int:
        """``vocab_size`` rounded up to a multiple of ``multiple``.

        The trainer passes ``make_vocab_size_divisible_by x tensor_parallel_size`` so every
        tensor-parallel shard of the embedding has the same, GPU-friendly number of rows.
        """
        multiple = int(multiple)
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}.")
        return -(-self.vocab_size // multiple) * multiple

    def _token_id(self, token: str | None) -> int | None:
        return None if token is None else self._tokenizer.token_to_id(token)

    @property
    def eos_token_id(self) -> int:
        return self._token_id(self.eos_token)

    @property
    def eod(self) -> int:
        """End-of-document id appended by ``--append-eod`` (Megatron's name)."""
        return self.eos_token_id

    @property
    def eod_token(self) -> str:
        return self.eos_token

    @property
    def eod_token_id(self) -> int:
        return self.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id(self.bos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id(self.pad_token)

    def save_vocabulary(
        self, save_directory, filename_prefix: str | None = None
    ) -> tuple[str, str]:
        """Copy ``vocab.json`` and ``merges.txt`` into ``save_directory``; returns both paths."""
        os.makedirs(save_directory, exist_ok=True)
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        vocab = os.path.join(save_directory, f"{prefix}vocab.json")
        merges = os.path.join(save_directory, f"{prefix}merges.txt")
        shutil.copyfile(self.vocab_file, vocab)
        shutil.copyfile(self.merges_file, merges)
        return vocab, merges
