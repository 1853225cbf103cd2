"""The libai tokenizer of a Hugging Face model directory, chosen from the files it holds.

In order of preference:

- ``tokenizer.json`` (what ``transformers`` 5 saves for every fast tokenizer): the whole
  ``tokenizers`` pipeline, loaded by :class:`PretrainedJsonTokenizer` with every special
  token role (``cls`` / ``sep`` / ``mask`` too) from ``tokenizer_config.json``;
- ``vocab.json`` + ``merges.txt``: :class:`~libai.tokenizer.RobertaTokenizer` for
  ``model_type`` ``roberta``, else :class:`~libai.tokenizer.GPT2Tokenizer`;
- ``vocab.txt``: :class:`~libai.tokenizer.BertTokenizer` (``do_lower_case`` from
  ``tokenizer_config.json``);
- ``spiece.model``: :class:`~libai.tokenizer.T5Tokenizer`.

Usage::

    spec = find_tokenizer_files("path/to/hf_model")   # FileNotFoundError if none
    tokenizer = load_tokenizer(spec)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from libai.tokenizer import (
    BaseTokenizer,
    BertTokenizer,
    GPT2Tokenizer,
    JsonTokenizer,
    RobertaTokenizer,
    T5Tokenizer,
)
from libai.tokenizer.tokenization_base import SPECIAL_TOKEN_ROLES, add_special_tokens
from libai.tokenizer.tokenization_hf import CONFIG_FILES, TOKENIZER_FILE


def read_tokenizer_config(directory: str) -> dict:
    """``tokenizer_config.json`` (else ``special_tokens_map.json``) of ``directory``, or ``{}``."""
    for name in CONFIG_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    config = json.load(f)
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"cannot read the tokenizer config {path}: {exc}") from exc
            if not isinstance(config, dict):
                raise ValueError(f"the tokenizer config {path} is not a JSON object")
            return config
    return {}


def _special_tokens(config: Mapping) -> dict[str, str]:
    """Every special-token role the config names (strings or ``AddedToken`` dicts)."""
    tokens = {}
    for role in SPECIAL_TOKEN_ROLES:
        value = config.get(role)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[role] = value
    return tokens


class PretrainedJsonTokenizer(JsonTokenizer):
    """:class:`JsonTokenizer` of a Hugging Face directory with *all* special-token roles of
    its ``tokenizer_config.json`` (``cls_token``, ``sep_token``, ``mask_token`` as well as
    ``bos`` / ``eos`` / ``pad`` / ``unk``), as the fill-mask and classification pipelines
    need them."""

    def __init__(self, directory: str):
        super().__init__(directory)
        self._init_args = {"directory": directory}
        self._set_special_tokens(**_special_tokens(read_tokenizer_config(directory)))
        add_special_tokens(self._tokenizer, self.all_special_tokens)


@dataclass(frozen=True)
class TokenizerSpec:
    """A tokenizer class and its constructor arguments, found in ``directory``."""

    directory: str
    cls: type
    kwargs: dict = field(default_factory=dict)


def find_tokenizer_files(directory: str, hf_config: Mapping | None = None) -> TokenizerSpec:
    """Pick the tokenizer of a Hugging Face model directory from its files (see the module
    docstring); ``hf_config`` (``config.json``) gives the ``model_type``.

    Raises:
        FileNotFoundError: no tokenizer files; the message names the directory and the
            files looked for.
    """
    directory = os.fspath(directory)
    model_type = (hf_config or {}).get("model_type")

    def has(*names: str) -> bool:
        return all(os.path.isfile(os.path.join(directory, n)) for n in names)

    def path(name: str) -> str:
        return os.path.join(directory, name)

    if has(TOKENIZER_FILE):
        return TokenizerSpec(directory, PretrainedJsonTokenizer, {"directory": directory})
    config = read_tokenizer_config(directory)
    if has("vocab.json", "merges.txt"):
        cls = RobertaTokenizer if model_type == "roberta" else GPT2Tokenizer
        kwargs = {"vocab_file": path("vocab.json"), "merges_file": path("merges.txt")}
        if "add_prefix_space" in config:
            kwargs["add_prefix_space"] = bool(config["add_prefix_space"])
        return TokenizerSpec(directory, cls, kwargs)
    if has("vocab.txt"):
        kwargs = {"vocab_file": path("vocab.txt")}
        if "do_lower_case" in config:
            kwargs["do_lower_case"] = bool(config["do_lower_case"])
        return TokenizerSpec(directory, BertTokenizer, kwargs)
    if has("spiece.model"):
        return TokenizerSpec(directory, T5Tokenizer, {"vocab_file": path("spiece.model")})
    raise FileNotFoundError(
        f"no tokenizer in {directory}: expected {TOKENIZER_FILE}, vocab.json + merges.txt "
        "(GPT-2 / RoBERTa), vocab.txt (BERT) or spiece.model (T5). Save the tokenizer next "
        "to the weights, e.g. tokenizer.save_pretrained(dir)."
    )


def load_tokenizer(spec: TokenizerSpec | str, hf_config: Mapping | None = None) -> BaseTokenizer:
    """Build the tokenizer of ``spec`` (or of the directory ``spec``)."""
    if not isinstance(spec, TokenizerSpec):
        spec = find_tokenizer_files(spec, hf_config)
    return spec.cls(**spec.kwargs)
