"""Any tokenizer saved as a Hugging Face ``tokenizer.json`` (Llama, Qwen2, ...).

``tokenizer.json`` holds the whole ``tokenizers`` pipeline (normalizer, pre-tokenizer, model,
post-processor, decoder, added tokens), so this wrapper only loads it and names the special
tokens. Given a directory, it reads ``tokenizer.json`` there and the special tokens from
``tokenizer_config.json`` (or ``special_tokens_map.json``), as ``transformers`` does; chat
templates are not applied.
"""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer

from libai.tokenizer.tokenization_base import BaseTokenizer, add_special_tokens, check_file

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")


def _token_content(value) -> str | None:
    """A special token from a config: a string, or an ``AddedToken`` dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_special_tokens(directory: str) -> dict[str, str]:
    """``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token`` of a tokenizer directory.

    Taken from ``tokenizer_config.json``, else ``special_tokens_map.json``; roles that are
    absent or ``null`` are left out.
    """
    for name in CONFIG_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"Cannot read the tokenizer config {path}: {e}") from e
        if not isinstance(config, dict):
            raise ValueError(f"The tokenizer config {path} is not a JSON object.")
        tokens = {role: _token_content(config.get(role)) for role in _ROLES}
        return {role: token for role, token in tokens.items() if token is not None}
    return {}


class JsonTokenizer(BaseTokenizer):
    """Tokenizer loaded from a ``tokenizer.json`` (or a directory holding one).

    Args:
        tokenizer_file: ``tokenizer.json``, or a directory with ``tokenizer.json`` and
            optionally ``tokenizer_config.json`` / ``special_tokens_map.json``.
        bos_token, eos_token, pad_token, unk_token: the special tokens; ``None`` takes the
            directory's config value (if any). Each must be in the vocabulary. ``eos`` is
            also ``eod``.

    ``encode(text)`` gives the ids of ``text`` alone; ``encode(text, add_special_tokens=True)``
    applies the file's post-processor (e.g. Llama's leading ``<s>``), equal to
    ``transformers.PreTrainedTokenizerFast(tokenizer_file=...).encode(text)``.

    Raises:
        FileNotFoundError: the file (or ``tokenizer.json`` in the directory) is missing.
        ValueError: the file cannot be parsed, or a special token is not in the vocabulary.
    """

    vocab_files_names = {"tokenizer_file": TOKENIZER_FILE}

    def __init__(
        self,
        tokenizer_file,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
    ):
        self._init_args = {
            "tokenizer_file": tokenizer_file,
            "bos_token": bos_token,
            "eos_token": eos_token,
            "pad_token": pad_token,
            "unk_token": unk_token,
        }
        special = {}
        path = tokenizer_file
        if path is not None and os.path.isdir(path):
            special = read_special_tokens(os.fspath(path))
            path = os.path.join(path, TOKENIZER_FILE)
        hint = "a Hugging Face tokenizer.json (or the directory holding it)"
        self.tokenizer_file = check_file(path, "tokenizer_file", "JsonTokenizer", hint)
        try:
            self._tokenizer = Tokenizer.from_file(self.tokenizer_file)
        except Exception as e:
            raise ValueError(
                f"Cannot read the tokenizer {self.tokenizer_file}: {e}. It must be a "
                "tokenizer.json saved by the `tokenizers` or `transformers` library."
            ) from e
        explicit = {
            "bos_token": bos_token,
            "eos_token": eos_token,
            "pad_token": pad_token,
            "unk_token": unk_token,
        }
        special.update({role: token for role, token in explicit.items() if token is not None})
        self._set_special_tokens(**special)
        add_special_tokens(self._tokenizer, self.all_special_tokens)

    def save_vocabulary(self, save_directory, filename_prefix: str | None = None) -> tuple:
        """Write ``tokenizer.json`` and a ``tokenizer_config.json`` naming the special tokens.

        ``JsonTokenizer(save_directory)`` loads the same tokenizer back (without a
        ``filename_prefix``).
        """
        os.makedirs(save_directory, exist_ok=True)
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        tokenizer_path = os.path.join(save_directory, prefix + TOKENIZER_FILE)
        config_path = os.path.join(save_directory, prefix + CONFIG_FILES[0])
        self._tokenizer.save(tokenizer_path)
        config = {role: getattr(self, role) for role in _ROLES}
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        return tokenizer_path, config_path
