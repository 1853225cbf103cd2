"""T5's tokenizer: a sentencepiece model (``spiece.model``) plus ``<extra_id_*>`` sentinels.

The text is cut at special tokens (``</s>``, ``<pad>``, ``<unk>`` and the sentinels), each
piece in between is encoded by the ``sentencepiece`` library, and ``encode`` appends ``</s>``
as ``transformers.T5Tokenizer`` does. The ``extra_ids`` sentinels take the ids after the
sentencepiece vocabulary in T5's order: ``<extra_id_0>`` is the *last* id,
``<extra_id_{extra_ids-1}>`` the first one after the sentencepiece pieces.
"""

from __future__ import annotations

import re

from libai.tokenizer.tokenization_base import BaseTokenizer, check_file


class T5Tokenizer(BaseTokenizer):
    """Sentencepiece (unigram) tokenizer with T5's sentinel tokens.

    Args:
        vocab_file: the sentencepiece model, ``spiece.model``.
        extra_ids: number of sentinels ``<extra_id_0>`` ... ``<extra_id_{extra_ids-1}>``
            appended to the vocabulary (T5: 100).
        eos_token, unk_token, pad_token: special pieces of the sentencepiece model (T5:
            ``</s>`` = 1, ``<unk>`` = 2, ``<pad>`` = 0). ``eos`` is also ``eod``.

    ``encode(text)`` ends with ``</s>`` (``add_special_tokens`` defaults to ``True`` here,
    matching ``transformers``); ``encode(text, add_special_tokens=False)`` gives the pieces
    alone, which is what ``tools/preprocess_data.py`` stores. :attr:`sentinel_token_ids` (also
    ``additional_special_tokens_ids``) lists the sentinel ids for span corruption, ordered
    ``<extra_id_0>`` first.

    Raises:
        FileNotFoundError: ``vocab_file`` is missing (the message names it).
        ValueError: it is not a sentencepiece model, or a special token is not one of its pieces.
    """

    vocab_files_names = {"vocab_file": "spiece.model"}
    add_special_tokens_default = True

    def __init__(
        self,
        vocab_file,
        extra_ids: int = 100,
        eos_token: str = "</s>",
        unk_token: str = "<unk>",
        pad_token: str = "<pad>",
    ):
        import sentencepiece

        self._init_args = {
            "vocab_file": vocab_file,
            "extra_ids": extra_ids,
            "eos_token": eos_token,
            "unk_token": unk_token,
            "pad_token": pad_token,
        }
        self.vocab_file = check_file(
            vocab_file, "vocab_file", "T5Tokenizer", "a sentencepiece model (spiece.model)"
        )
        if int(extra_ids) < 0:
            raise ValueError(f"T5Tokenizer extra_ids must be >= 0, got {extra_ids}.")
        self.extra_ids = int(extra_ids)
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=self.vocab_file)
        except Exception as e:
            raise ValueError(
                f"T5Tokenizer cannot load the sentencepiece model {self.vocab_file}: {e}"
            ) from e
        self._num_pieces = self._sp.get_piece_size()
        last = self._num_pieces + self.extra_ids - 1
        self._sentinels = {f"<extra_id_{i}>": last - i for i in range(self.extra_ids)}
        self._set_special_tokens(
            additional_special_tokens=list(self._sentinels),
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
        )
        self._special_to_id = {t: self._token_to_id(t) for t in self.all_special_tokens}
        self._id_to_special = {i: t for t, i in self._special_to_id.items()}
        alternatives = sorted(self._special_to_id, key=len, reverse=True)
        self._special_re = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")

    # ---- primitives on sentencepiece ----------------------------------------------------------
    def _encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        # split every text at special tokens: even parts are plain text, odd parts specials
        parts = [self._special_re.split(text) for text in texts]
        plain = [p for split in parts for p in split[::2]]
        encoded = iter(self._sp.encode(plain) if plain else [])
        out = []
        for split in parts:
            ids = []
            for k, part in enumerate(split):
                ids.extend(next(encoded) if k % 2 == 0 else [self._special_to_id[part]])
            if add_special_tokens:
                ids.append(self._special_to_id[self.eos_token])
            out.append(ids)
        return out

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._encode_batch([text], add_special_tokens)[0]

    def _tokenize(self, text: str) -> list[str]:
        tokens = []
        for k, part in enumerate(self._special_re.split(text)):
            tokens.extend(self._sp.encode(part, out_type=str) if k % 2 == 0 else [part])
        return tokens

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        # plain runs go through sentencepiece; a run after a special token keeps its leading
        # space, as transformers' Metaspace decoder does
        chunks, run = [], []

        def flush():
            if run:
                text = self._sp.decode(run)
                if chunks and self._sp.id_to_piece(run[0]).startswith("\u2581"):
                    text = " " + text
                chunks.append(text)
                run.clear()

        for i in ids:
            special = self._id_to_special.get(i)
            if special is None:
                run.append(i)
                continue
            flush()
            if not skip_special_tokens:
                chunks.append(special)
        flush()
        return "".join(chunks)

    def _token_to_id(self, token: str) -> int | None:
        if token in self._sentinels:
            return self._sentinels[token]
        index = self._sp.piece_to_id(token)
        if index == self._sp.unk_id() and token != self._sp.id_to_piece(index):
            return None
        return index

    def _id_to_token(self, index: int) -> str | None:
        if 0 <= index < self._num_pieces:
            return self._sp.id_to_piece(index)
        if index < self.vocab_size:
            return f"<extra_id_{self.vocab_size - 1 - index}>"
        return None

    @property
    def vocab_size(self) -> int:
        """Sentencepiece pieces plus ``extra_ids`` sentinels."""
        return self._num_pieces + self.extra_ids

    def get_vocab(self) -> dict[str, int]:
        return {self._id_to_token(i): i for i in range(self.vocab_size)}

    # ---- sentinels ----------------------------------------------------------------------------
    @property
    def sentinel_tokens(self) -> list[str]:
        """``["<extra_id_0>", "<extra_id_1>", ...]``."""
        return list(self._sentinels)

    @property
    def sentinel_token_ids(self) -> list[int]:
        """Ids of :attr:`sentinel_tokens`, in the same order (decreasing ids)."""
        return list(self._sentinels.values())

    def get_sentinel_tokens(self) -> list[str]:
        """:attr:`sentinel_tokens` (``transformers``' name)."""
        return self.sentinel_tokens

    def get_sentinel_token_ids(self) -> list[int]:
        """:attr:`sentinel_token_ids` (``transformers``' name)."""
        return self.sentinel_token_ids
