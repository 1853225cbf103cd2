"""Tokenize a JSON-lines corpus into Megatron ``.bin`` / ``.idx`` files.

The engine of ``tools/preprocess_data.py`` (and of the built-in sample dataset). Each line
of the input is a JSON object; the text under every ``json_keys`` entry becomes one document
of the dataset ``{output_prefix}_{key}_document``. With ``split_sentences`` (BERT-style
datasets) each sentence of a document is its own item (see :mod:`libai.data.sentence_split`)
and the dataset is ``{output_prefix}_{key}_sentence``. Lines are tokenized in chunks, in a pool
of ``workers`` processes (or in this process, with the tokenizer's own threads, when
``workers == 1``), and written in input order, so the output doesn't depend on ``workers``.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence

import numpy as np

from libai.data.data_utils.indexed_dataset import (
    DATASET_IMPLS,
    IndexedDatasetBuilder,
    MMapIndexedDatasetBuilder,
    best_fitting_dtype,
    data_file_path,
    index_file_path,
)
from libai.data.sentence_split import split_sentences as _split_sentences

logger = logging.getLogger(__name__)

#: ``--tokenizer-name`` choices -> (module, class)
TOKENIZERS = {
    "BertTokenizer": ("libai.tokenizer.tokenization_bert", "BertTokenizer"),
    "GPT2Tokenizer": ("libai.tokenizer.tokenization_gpt2", "GPT2Tokenizer"),
    "JsonTokenizer": ("libai.tokenizer.tokenization_hf", "JsonTokenizer"),
    "RobertaTokenizer": ("libai.tokenizer.tokenization_roberta", "RobertaTokenizer"),
    "T5Tokenizer": ("libai.tokenizer.tokenization_t5", "T5Tokenizer"),
}
#: the file arguments each tokenizer needs
TOKENIZER_FILES = {
    "BertTokenizer": ("vocab_file",),
    "GPT2Tokenizer": ("vocab_file", "merges_file"),
    "JsonTokenizer": ("tokenizer_file",),
    "RobertaTokenizer": ("vocab_file", "merges_file"),
    "T5Tokenizer": ("vocab_file",),
}
#: the optional constructor arguments each tokenizer takes from the command line
TOKENIZER_OPTIONS = {
    "BertTokenizer": ("do_lower_case", "do_chinese_wwm"),
    "JsonTokenizer": ("eos_token",),
    "T5Tokenizer": ("extra_ids",),
}


def _flag(arg: str) -> str:
    return "--" + arg.replace("_", "-")


def tokenizer_args(
    name: str, vocab_file=None, merges_file=None, tokenizer_file=None, **options
) -> dict:
    """The constructor arguments of tokenizer ``name``: its files plus the options it takes.

    Options that are ``None`` are left out (the tokenizer's default applies).

    Raises:
        ValueError: unknown tokenizer, a file it needs is not given, or an option it does
            not take is given.
    """
    if name not in TOKENIZERS:
        raise ValueError(f"Unknown tokenizer {name!r}; choose one of {sorted(TOKENIZERS)}.")
    files = {"vocab_file": vocab_file, "merges_file": merges_file, "tokenizer_file": tokenizer_file}
    args = {}
    for arg in TOKENIZER_FILES[name]:
        if files[arg] is None:
            raise ValueError(f"{_flag(arg)} is required for {name}.")
        args[arg] = files[arg]
    for arg, value in options.items():
        if value is None:
            continue
        if arg not in TOKENIZER_OPTIONS.get(name, ()):
            raise ValueError(f"{_flag(arg)} does not apply to {name}.")
        args[arg] = value
    return args


def _make_tokenizer(name: str, args: dict):
    module, cls = TOKENIZERS[name]
    return getattr(importlib.import_module(module), cls)(**args)


def build_tokenizer_by_name(name: str, vocab_file=None, merges_file=None, **kwargs):
    """The tokenizer class ``name`` on the given files (see :func:`tokenizer_args`)."""
    return _make_tokenizer(name, tokenizer_args(name, vocab_file, merges_file, **kwargs))


def output_prefix_for(output_prefix: str, key: str, level: str = "document") -> str:
    """Megatron's naming: ``{output_prefix}_{key}_{level}`` (``document`` or ``sentence``)."""
    return f"{output_prefix}_{key}_{level}"


class Encoder:
    """Turns chunks of ``(line number, raw line)`` into token ids, one tokenizer per process."""

    tokenizer = None  # set per process by initializer()

    def __init__(
        self,
        input_path: str,
        json_keys: Sequence[str],
        tokenizer_name: str,
        tokenizer_args: dict,
        append_eod: bool,
        single_thread: bool = False,
        split_sentences: bool = False,
    ):
        self.input_path = input_path
        self.json_keys = list(json_keys)
        self.tokenizer_name = tokenizer_name
        self.tokenizer_args = dict(tokenizer_args)
        self.append_eod = append_eod
        self.single_thread = single_thread
        self.split_sentences = split_sentences

    def initializer(self) -> None:
        if self.single_thread:  # one Rust thread per worker process, no oversubscription
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        Encoder.tokenizer = _make_tokenizer(self.tokenizer_name, self.tokenizer_args)

    def _texts(self, lineno: int, raw: bytes) -> list[str] | None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.input_path}:{lineno}: not valid UTF-8 ({e}).") from None
        if not line.strip():
            return None
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.input_path}:{lineno}: invalid JSON ({e}).") from None
        if not isinstance(data, dict):
            raise ValueError(
                f"{self.input_path}:{lineno}: expected a JSON object per line, got "
                f"{type(data).__name__}."
            )
        texts = []
        for key in self.json_keys:
            if key not in data:
                raise ValueError(
                    f"{self.input_path}:{lineno}: JSON key {key!r} is missing from this line "
                    f"(its keys: {sorted(data)}). Choose the text fields with --json-keys."
                )
            if not isinstance(data[key], str):
                raise ValueError(
                    f"{self.input_path}:{lineno}: JSON key {key!r} holds "
                    f"{type(data[key]).__name__}, expected a string."
                )
            texts.append(data[key])
        return texts

    def encode_chunk(
        self, chunk: list[tuple[int, bytes]]
    ) -> tuple[list[list[list[list[int]]]], int]:
        """``(docs, bytes)``: per line, per json key, the token ids of each sentence.

        Without ``split_sentences`` a document is one sentence. Empty sentences are dropped,
        as are blank lines; ``append_eod`` ends the last sentence of a document with ``eod``.
        """
        per_line = [self._texts(lineno, raw) for lineno, raw in chunk]
        per_line = [t for t in per_line if t is not None]
        split = _split_sentences if self.split_sentences else lambda text: [text]
        sentences = [split(text) for texts in per_line for text in texts]
        flat = [s for doc in sentences for s in doc]
        ids = iter(Encoder.tokenizer.encode_batch(flat, add_special_tokens=False) if flat else [])
        eod = Encoder.tokenizer.eod
        docs, k = [], 0
        for _ in per_line:
            doc = []
            for _key in self.json_keys:
                sentence_ids = [next(ids) for _ in sentences[k]]
                sentence_ids = [i for i in sentence_ids if i]  # empty sentences: no items
                k += 1
                if sentence_ids and self.append_eod:
                    sentence_ids[-1] = sentence_ids[-1] + [eod]
                doc.append(sentence_ids)
            docs.append(doc)
        return docs, sum(len(raw) for _, raw in chunk)


def _chunks(path: str, lines_per_chunk: int) -> Iterator[list[tuple[int, bytes]]]:
    chunk = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            chunk.append((lineno, raw))
            if len(chunk) == lines_per_chunk:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


_FILE_NAMES = {
    "vocab_file": "Vocab file (--vocab-file)",
    "merges_file": "Merges file (--merges-file)",
    "tokenizer_file": "Tokenizer file (--tokenizer-file)",
}


def _check_input(path, what: str, directory_ok: bool = False) -> str:
    path = os.fspath(path)
    if not (os.path.isfile(path) or (directory_ok and os.path.isdir(path))):
        raise FileNotFoundError(f"{what} not found: {path} does not exist.")
    return path


def preprocess_jsonl(
    input_path,
    output_prefix: str,
    vocab_file=None,
    merges_file=None,
    json_keys: Sequence[str] = ("text",),
    tokenizer_name: str = "GPT2Tokenizer",
    append_eod: bool = False,
    workers: int = 1,
    lines_per_chunk: int = 64,
    progress: bool = True,
    *,
    tokenizer_file=None,
    tokenizer_options: dict | None = None,
    split_sentences: bool = False,
    dataset_impl: str = "mmap",
    log_interval: int | None = None,
) -> dict[str, str]:
    """Tokenize ``input_path`` (JSON lines) into one indexed dataset per key.

    ``tokenizer_name`` is a key of :data:`TOKENIZERS`; it takes the files of
    :data:`TOKENIZER_FILES` (``vocab_file``, ``merges_file``, ``tokenizer_file``) and the
    ``tokenizer_options`` of :data:`TOKENIZER_OPTIONS` (e.g. ``{"do_lower_case": False}``).
    Text is encoded without special tokens; ``append_eod`` ends each document with the
    tokenizer's ``eod``. With ``split_sentences`` each sentence is an item of its document.
    ``dataset_impl`` is the format written: ``mmap`` (Megatron's), or ``lazy`` / ``cached``
    (the older ``TNTIDX`` format, int32 values, as LiBai writes them; both names give the
    same files, the name is how they are read). ``log_interval`` logs a progress line every
    that many documents (LiBai's ``--log-interval``).

    Returns ``{key: dataset prefix}``. Output files appear only when everything succeeded
    (they are written under temporary names first).

    Raises:
        FileNotFoundError: the input or a tokenizer file is missing.
        ImportError: ``do_chinese_wwm`` without jieba installed, at the first Chinese text
            (names ``pip install jieba``; ``tools/preprocess_data.py`` checks it up front).
        ValueError: a file the tokenizer needs is not given; ``append_eod`` with a tokenizer
            that has no end-of-document token; a line is not a JSON object, lacks a key or
            holds a non-string there (the message gives ``file:line``).
    """
    input_path = _check_input(input_path, "Input file (--input)")
    args = tokenizer_args(
        tokenizer_name,
        vocab_file,
        merges_file,
        tokenizer_file=tokenizer_file,
        **(tokenizer_options or {}),
    )
    for arg, what in _FILE_NAMES.items():
        if arg in args:
            args[arg] = _check_input(args[arg], what, directory_ok=arg == "tokenizer_file")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}.")
    json_keys = list(json_keys)
    tokenizer = _make_tokenizer(tokenizer_name, args)
    if append_eod and tokenizer.eod is None:
        raise ValueError(
            f"--append-eod: {tokenizer_name} has no end-of-document token (eos_token); "
            "drop --append-eod or give the tokenizer an eos token."
        )
    dtype = best_fitting_dtype(tokenizer.vocab_size)
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)

    level = "sentence" if split_sentences else "document"
    prefixes = {key: output_prefix_for(output_prefix, key, level) for key in json_keys}
    tmp = {key: f"{p}.tmp{os.getpid()}" for key, p in prefixes.items()}
    if dataset_impl not in DATASET_IMPLS:
        raise ValueError(f"--dataset-impl {dataset_impl!r}: use one of {DATASET_IMPLS}")
    if log_interval is not None and log_interval < 1:
        raise ValueError(f"--log-interval must be >= 1, got {log_interval}")
    if dataset_impl == "mmap":
        builders = {
            key: MMapIndexedDatasetBuilder(data_file_path(tmp[key]), dtype=dtype)
            for key in json_keys
        }
    else:
        builders = {key: IndexedDatasetBuilder(data_file_path(tmp[key])) for key in json_keys}
    encoder = Encoder(
        input_path,
        json_keys,
        tokenizer_name,
        args,
        append_eod,
        single_thread=workers > 1,
        split_sentences=split_sentences,
    )
    from tqdm import tqdm

    bar = tqdm(
        total=os.path.getsize(input_path),
        unit="B",
        unit_scale=True,
        desc="tokenizing",
        disable=not progress,
    )
    start = time.perf_counter()
    num_docs, num_tokens = 0, 0
    pool = None
    try:
        if workers == 1:
            encoder.initializer()
            results = map(encoder.encode_chunk, _chunks(input_path, lines_per_chunk))
        else:
            pool = multiprocessing.Pool(workers, initializer=encoder.initializer)
            results = pool.imap(encoder.encode_chunk, _chunks(input_path, lines_per_chunk))
        for docs, nbytes in results:
            for doc in docs:
                for key, sentences in zip(json_keys, doc):
                    if not sentences:  # empty text: no document (as in Megatron)
                        continue
                    for token_ids in sentences:
                        builders[key].add_item(np.asarray(token_ids, dtype=np.int64))
                        num_tokens += len(token_ids)
                    builders[key].end_document()
                num_docs += 1
                if log_interval and num_docs % log_interval == 0:
                    logger.info(
                        "processed %d documents, %d tokens (%.1fs)",
                        num_docs,
                        num_tokens,
                        time.perf_counter() - start,
                    )
            bar.update(nbytes)
            bar.set_postfix(docs=num_docs, tokens=num_tokens, refresh=False)
        for key in json_keys:
            builders[key].finalize(index_file_path(tmp[key]))
        for key in json_keys:
            os.replace(data_file_path(tmp[key]), data_file_path(prefixes[key]))
            os.replace(index_file_path(tmp[key]), index_file_path(prefixes[key]))
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
        for key in json_keys:
            builders[key].close()
            for path in (data_file_path(tmp[key]), index_file_path(tmp[key])):
                if os.path.exists(path):
                    os.remove(path)
    elapsed = time.perf_counter() - start
    logger.info(
        "tokenized %d documents, %d tokens in %.1fs (%.2f MB/s) -> %s",
        num_docs,
        num_tokens,
        elapsed,
        os.path.getsize(input_path) / max(elapsed, 1e-9) / 2**20,
        ", ".join(prefixes.values()),
    )
    return prefixes
