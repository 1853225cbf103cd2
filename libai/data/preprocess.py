"""Tokenize a JSON-lines corpus into Megatron ``.bin`` / ``.idx`` files.

The engine of ``tools/preprocess_data.py`` (and of the built-in sample dataset). Each line
of the input is a JSON object; the text under every ``json_keys`` entry becomes one document
of the dataset ``{output_prefix}_{key}_document``. Lines are tokenized in chunks, in a pool
of ``workers`` processes (or in this process, with the tokenizer's own threads, when
``workers == 1``), and written in input order, so the output doesn't depend on ``workers``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence

import numpy as np

from libai.data.data_utils.indexed_dataset import (
    MMapIndexedDatasetBuilder,
    best_fitting_dtype,
    data_file_path,
    index_file_path,
)

logger = logging.getLogger(__name__)

#: ``--tokenizer-name`` choices -> (module, class)
TOKENIZERS = {"GPT2Tokenizer": ("libai.tokenizer.tokenization_gpt2", "GPT2Tokenizer")}


def build_tokenizer_by_name(name: str, vocab_file, merges_file=None):
    """The tokenizer class ``name`` on the given files."""
    if name not in TOKENIZERS:
        raise ValueError(f"Unknown tokenizer {name!r}; choose one of {sorted(TOKENIZERS)}.")
    module, cls = TOKENIZERS[name]
    import importlib

    return getattr(importlib.import_module(module), cls)(vocab_file, merges_file)


def output_prefix_for(output_prefix: str, key: str) -> str:
    """Megatron's naming: ``{output_prefix}_{key}_document``."""
    return f"{output_prefix}_{key}_document"


class Encoder:
    """Turns chunks of ``(line number, raw line)`` into token ids, one tokenizer per process."""

    tokenizer = None  # set per process by initializer()

    def __init__(
        self,
        input_path: str,
        json_keys: Sequence[str],
        tokenizer_name: str,
        vocab_file: str,
        merges_file: str | None,
        append_eod: bool,
        single_thread: bool = False,
    ):
        self.input_path = input_path
        self.json_keys = list(json_keys)
        self.tokenizer_name = tokenizer_name
        self.vocab_file = vocab_file
        self.merges_file = merges_file
        self.append_eod = append_eod
        self.single_thread = single_thread

    def initializer(self) -> None:
        if self.single_thread:  # one Rust thread per worker process, no oversubscription
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        Encoder.tokenizer = build_tokenizer_by_name(
            self.tokenizer_name, self.vocab_file, self.merges_file
        )

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

    def encode_chunk(self, chunk: list[tuple[int, bytes]]) -> tuple[list[list[list[int]]], int]:
        """``(docs, bytes)``: per line, the token ids of each json key; blank lines dropped."""
        per_line = [self._texts(lineno, raw) for lineno, raw in chunk]
        per_line = [t for t in per_line if t is not None]
        flat = [text for texts in per_line for text in texts]
        ids = Encoder.tokenizer.encode_batch(flat) if flat else []
        eod = Encoder.tokenizer.eod
        docs, k = [], 0
        for _ in per_line:
            doc = []
            for _key in self.json_keys:
                token_ids = ids[k]
                k += 1
                if token_ids and self.append_eod:
                    token_ids = token_ids + [eod]
                doc.append(token_ids)
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


def _check_input(path, what: str) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path} does not exist.")
    return path


def preprocess_jsonl(
    input_path,
    output_prefix: str,
    vocab_file,
    merges_file=None,
    json_keys: Sequence[str] = ("text",),
    tokenizer_name: str = "GPT2Tokenizer",
    append_eod: bool = False,
    workers: int = 1,
    lines_per_chunk: int = 64,
    progress: bool = True,
) -> dict[str, str]:
    """Tokenize ``input_path`` (JSON lines) into one indexed dataset per key.

    Returns ``{key: dataset prefix}``. Output files appear only when everything succeeded
    (they are written under temporary names first).

    Raises:
        FileNotFoundError: the input, vocab or merges file is missing.
        ValueError: a line is not a JSON object, lacks a key or holds a non-string there
            (the message gives ``file:line``).
    """
    input_path = _check_input(input_path, "Input file (--input)")
    vocab_file = _check_input(vocab_file, "Vocab file (--vocab-file)")
    if merges_file is not None:
        merges_file = _check_input(merges_file, "Merges file (--merges-file)")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}.")
    json_keys = list(json_keys)
    tokenizer = build_tokenizer_by_name(tokenizer_name, vocab_file, merges_file)
    dtype = best_fitting_dtype(tokenizer.vocab_size)
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(out_dir, exist_ok=True)

    prefixes = {key: output_prefix_for(output_prefix, key) for key in json_keys}
    tmp = {key: f"{p}.tmp{os.getpid()}" for key, p in prefixes.items()}
    builders = {
        key: MMapIndexedDatasetBuilder(data_file_path(tmp[key]), dtype=dtype) for key in json_keys
    }
    encoder = Encoder(
        input_path, json_keys, tokenizer_name, vocab_file, merges_file, append_eod, workers > 1
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
                for key, token_ids in zip(json_keys, doc):
                    if not token_ids:  # empty text: no document (as in Megatron)
                        continue
                    builders[key].add_item(np.asarray(token_ids, dtype=dtype))
                    builders[key].end_document()
                    num_tokens += len(token_ids)
                num_docs += 1
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
