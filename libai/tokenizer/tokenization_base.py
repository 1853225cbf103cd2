"""The API every libai tokenizer shares, over a ``tokenizers.Tokenizer`` that does the work.

Subclasses build ``self._tokenizer`` (a ``tokenizers.Tokenizer``) from their vocabulary files
and call :meth:`BaseTokenizer._set_special_tokens`; a tokenizer on another library
(sentencepiece) overrides the few ``_``-prefixed primitives instead. Names follow both
LiBai / Hugging Face (``cls_token_id``, ``pad_token_id``, ...) and Megatron (``cls``, ``pad``,
``eod``, ...), so dataset code written for either reads the same ids.
"""

from __future__ import annotations

import logging
import os
import shutil

from tokenizers import AddedToken, Tokenizer

logger = logging.getLogger(__name__)

#: special-token roles, in the order they are reported
SPECIAL_TOKEN_ROLES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def check_file(path, arg: str, owner: str, hint: str) -> str:
    """``path`` as a string if it is an existing file.

    Raises:
        ValueError: ``path`` is ``None``.
        FileNotFoundError: the file does not exist; the message names ``path`` and ``arg``.
    """
    if path is None:
        raise ValueError(f"{owner} needs a {arg} (tokenization.tokenizer.{arg}): {hint}.")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{owner} {arg} not found: {path} does not exist. Set "
            f"tokenization.tokenizer.{arg} (or --{arg.replace('_', '-')}) to {hint}."
        )
    return path


def as_id_list(token_ids) -> list[int]:
    """A list of Python ints from a list, numpy array or tensor of ids."""
    return [int(i) for i in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)]


def add_special_tokens(tokenizer: Tokenizer, tokens) -> None:
    """Make ``tokens`` special in ``tokenizer``: matched whole in raw text, never split.

    Tokens the tokenizer already treats as added tokens (e.g. from a ``tokenizer.json``) keep
    their own settings.
    """
    present = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    new = []
    for token in dict.fromkeys(t for t in tokens if t is not None):
        if token not in present:
            new.append(AddedToken(token, special=True, normalized=False))
    if new:
        tokenizer.add_special_tokens(new)


def accept_libai_options(owner: str, options: dict, no_effect: dict[str, str]) -> None:
    """Keyword arguments LiBai's tokenizer takes that mean nothing here (``no_effect``:
    name -> why): accepted and named in one log line; any other is a ``TypeError``."""
    unknown = sorted(set(options) - set(no_effect))
    if unknown:
        raise TypeError(f"{owner}.__init__() got unexpected keyword argument(s) {unknown}")
    if options:
        logger.info(
            "%s: %s",
            owner,
            "; ".join(f"{k}={options[k]!r} has no effect here ({no_effect[k]})" for k in options),
        )


class BaseTokenizer:
    """Encode / decode / vocabulary / special-token API shared by libai's tokenizers.

    ``encode(text)`` returns the ids of ``text`` alone (except for T5, whose default
    :attr:`add_special_tokens_default` is ``True``); ``encode(text, add_special_tokens=True)``
    adds what the model's Hugging Face tokenizer adds (``[CLS] x [SEP]`` for BERT, ``<s> x </s>``
    for RoBERTa, ``x </s>`` for T5), so it equals ``transformers``' ``tokenizer.encode(text)``.
    ``eod`` is the end-of-document id that ``--append-eod`` appends (the eos token; ``None``
    where the model has none, e.g. BERT).
    """

    #: constructor argument -> file name, for :meth:`save_vocabulary`
    vocab_files_names: dict[str, str] = {}
    #: default of ``add_special_tokens`` in :meth:`encode` / :meth:`encode_batch`
    add_special_tokens_default: bool = False

    _tokenizer: Tokenizer
    _init_args: dict

    # ---- construction helpers -----------------------------------------------------------------
    def _set_special_tokens(self, additional_special_tokens=(), **tokens: str | None) -> None:
        """Record the special tokens by role (``eos_token="</s>"``, ...); each must be known."""
        owner = type(self).__name__
        for role in SPECIAL_TOKEN_ROLES:
            setattr(self, role, None)
        for role, token in tokens.items():
            if role not in SPECIAL_TOKEN_ROLES:
                raise TypeError(f"unknown special-token role {role!r}")
            if token is not None and self._token_to_id(token) is None:
                raise ValueError(
                    f"{owner} {role}={token!r} is not in the vocabulary of "
                    f"{self._vocab_source()}; add it to the vocabulary or set {role} to a token "
                    "that is."
                )
            setattr(self, role, token)
        self.additional_special_tokens = list(additional_special_tokens)

    def _vocab_source(self) -> str:
        """The main vocabulary file, for messages."""
        return str(getattr(self, next(iter(self.vocab_files_names), ""), "?"))

    # Rebuild from the files when pickled (DataLoader / multiprocessing workers).
    def __getstate__(self):
        return dict(self._init_args)

    def __setstate__(self, state):
        self.__init__(**state)

    def __repr__(self) -> str:
        arg, value = next(iter(self._init_args.items()))
        return f"{type(self).__name__}({arg}={value!r}, vocab_size={self.vocab_size})"

    # ---- primitives (a tokenizer on another library overrides these) --------------------------
    def _encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def _tokenize(self, text: str) -> list[str]:
        return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def _id_to_token(self, index: int) -> str | None:
        return self._tokenizer.id_to_token(index)

    @property
    def vocab_size(self) -> int:
        """Number of ids, special and added tokens included."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id for every id, special and added tokens included."""
        return self._tokenizer.get_vocab(with_added_tokens=True)

    # ---- encoding -----------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` also the model's framing tokens."""
        if add_special_tokens is None:
            add_special_tokens = self.add_special_tokens_default
        return self._encode(text, add_special_tokens)

    def encode_batch(self, texts, add_special_tokens: bool | None = None) -> list[list[int]]:
        """:meth:`encode` for many texts at once (parallel in the Rust library)."""
        if add_special_tokens is None:
            add_special_tokens = self.add_special_tokens_default
        return self._encode_batch(list(texts), add_special_tokens)

    def tokenize(self, text: str) -> list[str]:
        """Token strings of ``text`` (no special tokens are added)."""
        return self._tokenize(text)

    def encode_with_offsets(
        self, text: str, add_special_tokens: bool | None = None
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``(ids, offsets)`` of ``text``: the ids of :meth:`encode` and, per id, the
        ``(start, end)`` character span of ``text`` it came from (added framing tokens get
        ``(0, 0)``), e.g. to label the tokens of a span of characters.

        Raises:
            NotImplementedError: the tokenizer is not backed by a ``tokenizers.Tokenizer``
                (T5's sentencepiece model).
        """
        if add_special_tokens is None:
            add_special_tokens = self.add_special_tokens_default
        backend = getattr(self, "_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            raise NotImplementedError(
                f"{type(self).__name__} has no character offsets (it is not backed by a "
                "`tokenizers.Tokenizer`); use a tokenizer.json based tokenizer."
            )
        encoding = backend.encode(text, add_special_tokens=add_special_tokens)
        return list(encoding.ids), [tuple(o) for o in encoding.offsets]

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids`` (a list, numpy array or tensor of ids)."""
        return self._decode(as_id_list(token_ids), skip_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        """Id of a token string, or ids of a list of them; unknown tokens raise ``KeyError``."""
        if isinstance(tokens, str):
            token_id = self._token_to_id(tokens)
            if token_id is None:
                raise KeyError(
                    f"token {tokens!r} is not in the vocabulary of {self._vocab_source()}"
                )
            return token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        """Token string of an id, or of each id in a list."""
        if isinstance(ids, int):
            return self._id_to_token(ids)
        return [self._id_to_token(i) for i in as_id_list(ids)]

    # ---- vocabulary ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.vocab_size

    def padded_vocab_size(self, multiple: int = 1) -> int:
        """``vocab_size`` rounded up to a multiple of ``multiple``.

        The trainer passes ``make_vocab_size_divisible_by`` (128 by default): a GPU-friendly
        size that does not depend on the layout, so a checkpoint trained on tp2 loads on one
        process. LiBai and Megatron multiply it by the tensor-parallel size; here the
        vocab-parallel layers pad their shards themselves (``libai.layers.pad_vocab_size``).
        """
        multiple = int(multiple)
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}.")
        return -(-self.vocab_size // multiple) * multiple

    def save_vocabulary(self, save_directory, filename_prefix: str | None = None) -> tuple:
        """Copy the vocabulary files into ``save_directory``; returns the new paths."""
        os.makedirs(save_directory, exist_ok=True)
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        paths = []
        for arg, name in self.vocab_files_names.items():
            path = os.path.join(save_directory, prefix + name)
            shutil.copyfile(getattr(self, arg), path)
            paths.append(path)
        return tuple(paths)

    # ---- special tokens -----------------------------------------------------------------------
    def _token_id(self, token: str | None) -> int | None:
        return None if token is None else self._token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._token_id(self.unk_token)

    @property
    def sep_token_id(self) -> int | None:
        return self._token_id(self.sep_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id(self.pad_token)

    @property
    def cls_token_id(self) -> int | None:
        return self._token_id(self.cls_token)

    @property
    def mask_token_id(self) -> int | None:
        return self._token_id(self.mask_token)

    @property
    def start_token(self) -> str | None:
        """LiBai's name for the token that starts a sentence: the bos token, else the cls
        token (``None`` when neither is set, or when they are set and differ)."""
        return _one_of(self.bos_token, self.cls_token)

    @property
    def end_token(self) -> str | None:
        """LiBai's name for the token that ends a sentence: the eos token, else the sep
        token (``None`` when neither is set, or when they are set and differ)."""
        return _one_of(self.eos_token, self.sep_token)

    @property
    def start_token_id(self) -> int | None:
        return self._token_id(self.start_token)

    @property
    def end_token_id(self) -> int | None:
        return self._token_id(self.end_token)

    @property
    def eod_token(self) -> str | None:
        """End-of-document token: the eos token (``None`` if the model has none)."""
        return self.eos_token

    @property
    def eod_token_id(self) -> int | None:
        return self._token_id(self.eod_token)

    @property
    def additional_special_tokens_ids(self) -> list[int]:
        return [self._token_to_id(t) for t in self.additional_special_tokens]

    @property
    def all_special_tokens(self) -> list[str]:
        """Every special token (roles first, then the additional ones), without repeats."""
        roles = [getattr(self, role) for role in SPECIAL_TOKEN_ROLES]
        tokens = [t for t in roles if t is not None] + self.additional_special_tokens
        return list(dict.fromkeys(tokens))

    @property
    def all_special_ids(self) -> list[int]:
        return [self._token_to_id(t) for t in self.all_special_tokens]

    # Megatron's short names
    @property
    def eod(self) -> int | None:
        """End-of-document id appended by ``--append-eod`` (Megatron's name)."""
        return self.eod_token_id

    @property
    def bos(self) -> int | None:
        return self.bos_token_id

    @property
    def eos(self) -> int | None:
        return self.eos_token_id

    @property
    def unk(self) -> int | None:
        return self.unk_token_id

    @property
    def sep(self) -> int | None:
        return self.sep_token_id

    @property
    def pad(self) -> int | None:
        return self.pad_token_id

    @property
    def cls(self) -> int | None:
        return self.cls_token_id

    @property
    def mask(self) -> int | None:
        return self.mask_token_id


# LiBai's projects import their base class from this module
from libai.tokenizer.tokenization_pretrained import PreTrainedTokenizer  # noqa: E402, F401


def _one_of(first: str | None, second: str | None) -> str | None:
    """The token two roles share: either one that is set, ``None`` if they conflict."""
    if first is not None and second is not None and first != second:
        logger.warning("start/end token: %r and %r conflict; using neither", first, second)
        return None
    return first if first is not None else second
