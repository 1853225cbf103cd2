"""LiBai's slow-tokenizer base class, ``PreTrainedTokenizer``, that its projects subclass.

A subclass (a vocab-file tokenizer written in Python) implements ``vocab_size``,
``get_vocab``, ``_tokenize(text) -> tokens``, ``_convert_token_to_id(token)`` and
``_convert_id_to_token(index)`` (optionally ``convert_tokens_to_string``,
``build_inputs_with_special_tokens`` and ``save_vocabulary``); this class adds what LiBai's
gives them: the special tokens by role (set from keyword arguments, even before they are in
the vocabulary), added tokens (``add_tokens`` / ``add_special_tokens``: new ids after the
vocabulary, matched whole in text and never split), ``tokenize`` / ``encode`` / ``decode``,
and ``save_pretrained`` / ``from_pretrained`` on local directories (nothing is downloaded:
a name that is not a local path is a clear error).
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["PreTrainedTokenizer"]

SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
ADDED_TOKENS_FILE = "added_tokens.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

_ROLES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "eod_token",
)


def _role_property(role: str) -> property:
    def get(self):
        return getattr(self, "_" + role)

    def set_(self, value):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"special token {role} has to be a str, got {type(value).__name__}")
        setattr(self, "_" + role, value)

    return property(get, set_, doc=f"The {role.replace('_', ' ')} (a string, or None).")


def _role_id_property(role: str) -> property:
    def get(self):
        token = getattr(self, role)
        return None if token is None else self.convert_tokens_to_ids(token)

    return property(get, doc=f"The id of the {role.replace('_', ' ')} (None when unset).")


class PreTrainedTokenizer:
    """Base class of LiBai's slow tokenizers (see the module docstring).

    Args:
        verbose: log added tokens.
        bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token,
        eod_token: the special tokens by role (strings).
        additional_special_tokens: more special tokens (a list of strings).
    """

    #: ``__init__`` argument -> file name of each vocabulary file (for save / from_pretrained)
    vocab_files_names: dict[str, str] = {}
    pretrained_vocab_files_map: dict = {}
    pretrained_init_configuration: dict = {}
    max_model_input_sizes: dict = {}
    SPECIAL_TOKENS_ATTRIBUTES = [*_ROLES, "additional_special_tokens"]

    def __init__(self, verbose=True, **kwargs):
        for role in _ROLES:
            setattr(self, "_" + role, None)
        self._additional_special_tokens: list[str] = []
        self.verbose = verbose
        self.added_tokens_encoder: dict[str, int] = {}
        self.added_tokens_decoder: dict[int, str] = {}
        self.unique_no_split_tokens: list[str] = []
        self.init_inputs = ()
        self.init_kwargs = dict(kwargs)
        for key, value in kwargs.items():
            if value is None:
                continue
            if key == "additional_special_tokens":
                if not all(isinstance(t, str) for t in value):
                    raise TypeError("additional_special_tokens must all be strings")
                self._additional_special_tokens = list(value)
            elif key in _ROLES:
                setattr(self, key, value)

    # ---- what a subclass implements --------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary (without added tokens)."""
        raise NotImplementedError(f"{type(self).__name__} must define vocab_size")

    def get_vocab(self) -> dict[str, int]:
        """Token -> id of the base vocabulary plus the added tokens."""
        raise NotImplementedError(f"{type(self).__name__} must define get_vocab")

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} must define _tokenize")

    def _convert_token_to_id(self, token: str) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define _convert_token_to_id")

    def _convert_id_to_token(self, index: int) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define _convert_id_to_token")

    def save_vocabulary(self, save_directory) -> tuple:
        """Write the vocabulary files into ``save_directory``; returns their paths."""
        raise NotImplementedError(f"{type(self).__name__} must define save_vocabulary")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    # ---- vocabulary ------------------------------------------------------------------------
    def __len__(self) -> int:
        """The full vocabulary: base plus added tokens."""
        return self.vocab_size + len(self.added_tokens_encoder)

    def padded_vocab_size(self, multiple: int = 1) -> int:
        """``len(self)`` rounded up to a multiple of ``multiple``."""
        return -(-len(self) // int(multiple)) * int(multiple)

    def get_added_vocab(self) -> dict[str, int]:
        return dict(self.added_tokens_encoder)

    def add_tokens(self, new_tokens, special_tokens: bool = False) -> int:
        """Append the tokens the vocabulary lacks (those that map to the unknown token) with
        ids ``len(self), len(self) + 1, ...``; they are matched whole in text from now on.
        Non-special tokens are lower-cased when the tokenizer has ``do_lower_case``.
        Returns how many were added."""
        if not new_tokens:
            return 0
        if isinstance(new_tokens, str):
            new_tokens = [new_tokens]
        unk_id = self.convert_tokens_to_ids(self.unk_token) if self.unk_token else None
        to_add = []
        for token in new_tokens:
            if not isinstance(token, str):
                raise TypeError(f"token {token!r} is not a str but a {type(token).__name__}")
            if not special_tokens and getattr(self, "do_lower_case", False):
                token = token.lower()
            if token in to_add or token in self.added_tokens_encoder or token == self.unk_token:
                continue
            known = self._lookup_base(token)
            if known is None or known == unk_id:
                to_add.append(token)
                if self.verbose:
                    logger.info("Adding %s to the vocabulary", token)
        start = len(self)
        for i, token in enumerate(to_add):
            self.added_tokens_encoder[token] = start + i
            self.added_tokens_decoder[start + i] = token
        no_split = new_tokens if special_tokens else to_add
        self.unique_no_split_tokens = sorted(set(self.unique_no_split_tokens) | set(no_split))
        return len(to_add)

    def _lookup_base(self, token: str):
        try:
            return self._convert_token_to_id(token)
        except KeyError:
            return None

    def add_special_tokens(self, special_tokens_dict: dict) -> int:
        """Set special tokens by role (``{"eos_token": "</s>", "additional_special_tokens":
        [...]}``) and add those missing from the vocabulary; returns how many were added."""
        added = 0
        for key, value in special_tokens_dict.items():
            if key not in self.SPECIAL_TOKENS_ATTRIBUTES:
                raise ValueError(
                    f"{key!r} is not a special-token role: {self.SPECIAL_TOKENS_ATTRIBUTES}"
                )
            if key == "additional_special_tokens":
                self._additional_special_tokens = list(value)
                added += self.add_tokens(list(value), special_tokens=True)
            else:
                setattr(self, key, value)
                added += self.add_tokens([value], special_tokens=True)
        return added

    def sanitize_special_tokens(self) -> int:
        """Add every special token to the vocabulary (no-op for those present)."""
        return self.add_tokens(self.all_special_tokens, special_tokens=True)

    # ---- encoding --------------------------------------------------------------------------
    def tokenize(self, text: str, **kwargs) -> list[str]:
        """Tokens of ``text``: added / special tokens kept whole (the text around each one
        stripped of spaces), the rest split by ``_tokenize``."""
        pieces = [text]
        for special in self.unique_no_split_tokens:
            split = []
            for piece in pieces:
                if piece in self.unique_no_split_tokens:
                    split.append(piece)
                    continue
                parts = piece.split(special)
                for i, part in enumerate(parts):
                    if part.strip():
                        split.append(part.strip())
                    if i < len(parts) - 1:
                        split.append(special)
            pieces = split
        tokens = []
        for piece in pieces:
            if piece in self.unique_no_split_tokens:
                tokens.append(piece)
            elif piece:
                tokens.extend(self._tokenize(piece, **kwargs))
        return tokens

    def convert_tokens_to_ids(self, tokens):
        """Id of a token, or ids of a list (or a list of lists) of tokens."""
        if tokens is None:
            return None
        if isinstance(tokens, str):
            if tokens in self.added_tokens_encoder:
                return self.added_tokens_encoder[tokens]
            return self._convert_token_to_id(tokens)
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """Token of an id, or tokens of a list of ids (special ones dropped on request)."""
        if isinstance(ids, int):
            return self.added_tokens_decoder.get(ids) or self._convert_id_to_token(ids)
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.convert_ids_to_tokens(int(i)) for i in ids if int(i) not in special]

    def encode(self, text, return_tensors: str | None = None, **kwargs):
        """Ids of ``text`` (a string, or a list of strings: a list of id lists), framed by
        ``build_inputs_with_special_tokens`` when the subclass has it. ``return_tensors``:
        ``None`` (lists), ``"pt"`` (a torch.long tensor; LiBai's ``"of"`` too) or ``"np"``."""
        if isinstance(text, str):
            ids = self.convert_tokens_to_ids(self.tokenize(text))
            if hasattr(self, "build_inputs_with_special_tokens"):
                ids = self.build_inputs_with_special_tokens(ids)
        elif isinstance(text, (list, tuple)) and text and isinstance(text[0], str):
            return self.convert_to_tensors([self.encode(t) for t in text], return_tensors)
        elif isinstance(text, (list, tuple)) and text and isinstance(text[0], int):
            ids = list(text)
        else:
            raise ValueError("encode takes a string, a list of strings or a list of ids")
        return self.convert_to_tensors(ids, return_tensors)

    @staticmethod
    def convert_to_tensors(token_ids, return_tensors: str | None = None, **kwargs):
        if return_tensors is None:
            return token_ids
        if return_tensors in ("pt", "of"):
            return torch.tensor(token_ids, dtype=torch.long)
        if return_tensors == "np":
            return np.array(token_ids, dtype=np.int64)
        raise ValueError(f"return_tensors must be None, 'pt', 'of' or 'np', got {return_tensors!r}")

    def decode(
        self,
        token_ids,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """Text of ``token_ids``: runs of ordinary tokens through
        ``convert_tokens_to_string``, added tokens as they are, joined by spaces (or not)."""
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):  # one id (or a 0-d tensor): its token, as transformers
            token_ids = [token_ids]
        tokens = self.convert_ids_to_tokens(token_ids, skip_special_tokens=skip_special_tokens)
        parts, run = [], []
        for token in tokens:
            if token in self.added_tokens_encoder:
                if run:
                    parts.append(self.convert_tokens_to_string(run))
                    run = []
                parts.append(token)
            else:
                run.append(token)
        if run:
            parts.append(self.convert_tokens_to_string(run))
        text = (" " if spaces_between_special_tokens else "").join(parts)
        return self.clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    @staticmethod
    def clean_up_tokenization(text: str) -> str:
        """Spaces before punctuation and English contractions removed."""
        for before, after in (
            (" .", "."),
            (" ?", "?"),
            (" !", "!"),
            (" ,", ","),
            (" ' ", "'"),
            (" n't", "n't"),
            (" 'm", "'m"),
            (" 's", "'s"),
            (" 've", "'ve"),
            (" 're", "'re"),
        ):
            text = text.replace(before, after)
        return text

    # ---- special tokens --------------------------------------------------------------------
    bos_token = _role_property("bos_token")
    eos_token = _role_property("eos_token")
    unk_token = _role_property("unk_token")
    sep_token = _role_property("sep_token")
    pad_token = _role_property("pad_token")
    cls_token = _role_property("cls_token")
    mask_token = _role_property("mask_token")
    eod_token = _role_property("eod_token")
    bos_token_id = _role_id_property("bos_token")
    eos_token_id = _role_id_property("eos_token")
    unk_token_id = _role_id_property("unk_token")
    sep_token_id = _role_id_property("sep_token")
    pad_token_id = _role_id_property("pad_token")
    cls_token_id = _role_id_property("cls_token")
    mask_token_id = _role_id_property("mask_token")
    eod_token_id = _role_id_property("eod_token")

    @property
    def additional_special_tokens(self) -> list[str]:
        return self._additional_special_tokens

    @additional_special_tokens.setter
    def additional_special_tokens(self, value):
        self._additional_special_tokens = list(value or [])

    @property
    def additional_special_tokens_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.additional_special_tokens)

    @property
    def special_tokens_map(self) -> dict:
        """Role -> token for every role that is set."""
        out = {role: getattr(self, role) for role in _ROLES if getattr(self, role) is not None}
        if self._additional_special_tokens:
            out["additional_special_tokens"] = list(self._additional_special_tokens)
        return out

    @property
    def all_special_tokens(self) -> list[str]:
        tokens = [getattr(self, role) for role in _ROLES if getattr(self, role) is not None]
        return list(dict.fromkeys(tokens + self._additional_special_tokens))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    # ---- saving and loading (local files only) ---------------------------------------------
    def save_pretrained(self, save_directory) -> tuple:
        """Vocabulary files plus ``special_tokens_map.json``, ``added_tokens.json`` and
        ``tokenizer_config.json`` (the init keyword arguments) in ``save_directory``."""
        if os.path.isfile(save_directory):
            raise ValueError(f"save_directory {save_directory} is a file, not a directory")
        os.makedirs(save_directory, exist_ok=True)
        files = {
            SPECIAL_TOKENS_MAP_FILE: self.special_tokens_map,
            ADDED_TOKENS_FILE: self.added_tokens_encoder,
            TOKENIZER_CONFIG_FILE: {
                k: v for k, v in self.init_kwargs.items() if k not in self.vocab_files_names
            },
        }
        paths = []
        for name, content in files.items():
            path = os.path.join(save_directory, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(content, f, ensure_ascii=False, indent=2)
            paths.append(path)
        return (*self.save_vocabulary(save_directory), *paths)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *init_inputs, **kwargs):
        """The tokenizer of a local directory written by :meth:`save_pretrained` (or holding
        the ``vocab_files_names`` files), or of a single vocabulary file. Nothing is
        downloaded: any other name is a ``FileNotFoundError`` saying so."""
        path = os.fspath(pretrained_model_name_or_path)
        if os.path.isfile(path):
            if len(cls.vocab_files_names) != 1:
                raise ValueError(
                    f"{cls.__name__} needs the files {sorted(cls.vocab_files_names.values())}: "
                    "give their directory, not one file"
                )
            files = {next(iter(cls.vocab_files_names)): path}
            extra = {}
        elif os.path.isdir(path):
            files, extra = {}, {}
            for arg, name in cls.vocab_files_names.items():
                file = os.path.join(path, name)
                if not os.path.isfile(file):
                    raise FileNotFoundError(f"{cls.__name__}: {file} is missing in {path}")
                files[arg] = file
            for name in (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE):
                file = os.path.join(path, name)
                if os.path.isfile(file):
                    with open(file, encoding="utf-8") as f:
                        extra.update(json.load(f))
        else:
            raise FileNotFoundError(
                f"{cls.__name__}.from_pretrained({path!r}): no such local file or directory. "
                "Nothing is downloaded at run time: save the tokenizer files locally "
                f"({', '.join(sorted(cls.vocab_files_names.values())) or 'its files'}) and pass "
                "their directory."
            )
        tokenizer = cls(*init_inputs, **{**extra, **files, **kwargs})
        added_file = os.path.join(path, ADDED_TOKENS_FILE) if os.path.isdir(path) else None
        if added_file and os.path.isfile(added_file):
            with open(added_file, encoding="utf-8") as f:
                added = json.load(f)
            for token, index in sorted(added.items(), key=lambda item: item[1]):
                if index != len(tokenizer):
                    raise ValueError(
                        f"{added_file}: {token!r} has id {index} but would get {len(tokenizer)}; "
                        "the added tokens must follow the vocabulary without gaps"
                    )
                tokenizer.add_tokens([token], special_tokens=token in tokenizer.all_special_tokens)
        return tokenizer
