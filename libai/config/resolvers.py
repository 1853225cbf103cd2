"""OmegaConf resolvers that every config may use; registered when :mod:`libai.config` is imported.

``${libai_sample:KEY}`` is the path of a file of the built-in sample dataset (see
:mod:`libai.data.sample_corpus`) in our cache directory, :func:`default_sample_data_dir`::

    tokenization.tokenizer = LazyCall(GPT2Tokenizer)(
        vocab_file="${libai_sample:vocab_file}",     # also merges_file, data_prefix, data_dir
        merges_file="${libai_sample:merges_file}",
    )

Writing it is how a config says, explicitly, that it uses the sample dataset: the trainer
builds the dataset (in the cache directory only) exactly when some value of the config is such
an interpolation, never because a path's file name looks like a sample file. The resolver
itself is a pure function evaluated at resolution time (so ``$LIBAI_SAMPLE_DATA_DIR`` set in a
subprocess's environment applies), and a saved ``config.yaml`` keeps the interpolation.

This module sits low in the import stack (``os`` and ``omegaconf`` only): ``libai.data``
imports the sample file names from here, never the other way round.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

__all__ = [
    "CORPUS_NAME",
    "DATA_NAME",
    "MERGES_NAME",
    "READY_NAME",
    "SAMPLE_RESOLVER",
    "VOCAB_NAME",
    "default_sample_data_dir",
    "register_resolvers",
    "sample_path",
]

#: the resolver's name: ``${libai_sample:vocab_file}``
SAMPLE_RESOLVER = "libai_sample"
VOCAB_NAME = "gpt2-vocab.json"
MERGES_NAME = "gpt2-merges.txt"
DATA_NAME = "stdlib_text_document"  # the .bin / .idx prefix
CORPUS_NAME = "stdlib_corpus.jsonl"
#: written last by a completed build: the directory's sample files are ours
READY_NAME = "sample_dataset.json"
#: the keys ``${libai_sample:KEY}`` accepts -> file name in the sample directory
_SAMPLE_KEYS = {
    "data_dir": "",
    "vocab_file": VOCAB_NAME,
    "merges_file": MERGES_NAME,
    "data_prefix": DATA_NAME,
    "corpus": CORPUS_NAME,
}


def default_sample_data_dir() -> str:
    """``$LIBAI_SAMPLE_DATA_DIR``, else ``$XDG_CACHE_HOME/libai/sample_gpt2`` (~/.cache)."""
    if os.environ.get("LIBAI_SAMPLE_DATA_DIR"):
        return os.path.abspath(os.environ["LIBAI_SAMPLE_DATA_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "libai", "sample_gpt2")


def sample_path(key: str) -> str:
    """The ``${libai_sample:KEY}`` resolver: ``KEY``'s path in :func:`default_sample_data_dir`.

    Pure: it reads the environment and touches no file.
    """
    if key not in _SAMPLE_KEYS:
        raise ValueError(
            f"${{{SAMPLE_RESOLVER}:{key}}}: unknown key {key!r}; use one of {sorted(_SAMPLE_KEYS)}"
        )
    data_dir = default_sample_data_dir()
    return os.path.join(data_dir, _SAMPLE_KEYS[key]) if _SAMPLE_KEYS[key] else data_dir


def register_resolvers() -> None:
    """Register libai's resolvers with OmegaConf (idempotent)."""
    if not OmegaConf.has_resolver(SAMPLE_RESOLVER):
        OmegaConf.register_new_resolver(SAMPLE_RESOLVER, sample_path)
