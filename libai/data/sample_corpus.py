"""A built-in GPT-2 sample dataset that every machine can build offline, in seconds.

The corpus is the Python standard library's own source code (always installed with Python):
a deterministic selection of its ``.py`` files, cut into documents of ~1.5 kB at ``def`` /
``class`` lines. On it we train a byte-level BPE with the ``tokenizers`` library
(``gpt2-vocab.json`` + ``gpt2-merges.txt``, ``<|endoftext|>`` included) and tokenize it with
the same code as ``tools/preprocess_data.py`` into ``stdlib_text_document.bin/.idx``.

Usage::

    from libai.data.sample_corpus import ensure_sample_dataset

    paths = ensure_sample_dataset("/tmp/libai_sample")   # builds once, then reuses
    paths["data_prefix"], paths["vocab_file"], paths["merges_file"]

Concurrency: the build holds an exclusive file lock on ``DATA_DIR/.lock`` and moves finished
files into place atomically, so any number of processes may call it at once: one builds,
the others wait and reuse. Under ``torchrun`` you may also call it on local rank 0 only and
``dist.synchronize()`` afterwards; both work. :func:`prepare_sample_data` does it for a
config whose data paths point at a sample dataset.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

VOCAB_NAME = "gpt2-vocab.json"
MERGES_NAME = "gpt2-merges.txt"
DATA_NAME = "stdlib_text_document"
CORPUS_NAME = "stdlib_corpus.jsonl"
READY_NAME = "sample_dataset.json"
EOD_TOKEN = "<|endoftext|>"
#: file names that mark a path as part of a sample dataset
SAMPLE_FILE_NAMES = (VOCAB_NAME, MERGES_NAME, DATA_NAME)


def default_sample_data_dir() -> str:
    """``$LIBAI_SAMPLE_DATA_DIR``, else ``$XDG_CACHE_HOME/libai/sample_gpt2`` (~/.cache)."""
    if os.environ.get("LIBAI_SAMPLE_DATA_DIR"):
        return os.path.abspath(os.environ["LIBAI_SAMPLE_DATA_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "libai", "sample_gpt2")


def sample_dataset_paths(data_dir: str | None = None) -> dict[str, str]:
    """Where the sample dataset's files are (or will be) in ``data_dir``; touches nothing."""
    data_dir = os.path.abspath(data_dir or default_sample_data_dir())
    return {
        "data_dir": data_dir,
        "data_prefix": os.path.join(data_dir, DATA_NAME),
        "vocab_file": os.path.join(data_dir, VOCAB_NAME),
        "merges_file": os.path.join(data_dir, MERGES_NAME),
        "corpus": os.path.join(data_dir, CORPUS_NAME),
    }


def is_sample_dataset_ready(data_dir: str) -> bool:
    paths = sample_dataset_paths(data_dir)
    needed = [
        os.path.join(paths["data_dir"], READY_NAME),
        paths["vocab_file"],
        paths["merges_file"],
        paths["data_prefix"] + ".bin",
        paths["data_prefix"] + ".idx",
    ]
    return all(os.path.isfile(p) for p in needed)


# ---- the corpus ---------------------------------------------------------------------------------
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def _source_files(root: Path) -> Iterator[Path]:
    """The stdlib's top-level modules first, then its packages, each in sorted order."""
    yield from sorted(root.glob("*.py"))
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in _SKIP_DIRS):
        for dirpath, dirnames, filenames in os.walk(sub):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
            for name in sorted(filenames):
                if name.endswith(".py"):
                    yield Path(dirpath, name)


def split_documents(source: str, target_chars: int = 1500) -> list[str]:
    """Cut a module into documents of >= ``target_chars`` at ``def`` / ``class`` lines."""
    docs, current, size = [], [], 0
    # top-level statements, and methods (one indent level), start a new document
    starts = tuple(
        indent + kw for indent in ("", "    ") for kw in ("def ", "class ", "async def ", "@")
    ) + ("if __name__",)
    for line in source.splitlines(keepends=True):
        if size >= target_chars and line.startswith(starts):
            docs.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        docs.append("".join(current))
    return [d for d in docs if d.strip()]


def iter_stdlib_documents(max_bytes: int = 3_000_000, stdlib: str | None = None) -> Iterator[str]:
    """Documents from the standard library's sources, about ``max_bytes`` of UTF-8 in all."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    total = 0
    for path in _source_files(root):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for doc in split_documents(source):
            yield doc
            total += len(doc.encode("utf-8"))
        if total >= max_bytes:
            return


# ---- the build ----------------------------------------------------------------------------------
@contextmanager
def _exclusive_lock(lock_path: str):
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: rely on the atomic renames alone
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(data_dir: str, max_bytes: int, vocab_size: int, workers: int) -> dict:
    from tokenizers import ByteLevelBPETokenizer

    from libai.data.preprocess import preprocess_jsonl

    start = time.perf_counter()
    docs = list(iter_stdlib_documents(max_bytes))
    corpus_bytes = sum(len(d.encode("utf-8")) for d in docs)
    if corpus_bytes < min(max_bytes, 100_000):
        raise RuntimeError(
            f"Only {corpus_bytes} bytes of Python sources found under "
            f"{sysconfig.get_paths()['stdlib']}: this Python has no standard-library sources "
            "to build the sample dataset from. Point the config's data_prefix, vocab_file and "
            "merges_file at a dataset made with tools/preprocess_data.py instead."
        )
    with tempfile.TemporaryDirectory(prefix=".build-", dir=data_dir) as tmp:
        corpus = os.path.join(tmp, CORPUS_NAME)
        with open(corpus, "w", encoding="utf-8") as f:
            for doc in docs:
                f.write(json.dumps({"text": doc}) + "\n")
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(
            docs,
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=[EOD_TOKEN],
            show_progress=False,
        )
        bpe.save_model(tmp, "gpt2")  # gpt2-vocab.json, gpt2-merges.txt
        prefix = preprocess_jsonl(
            corpus,
            os.path.join(tmp, "stdlib"),
            vocab_file=os.path.join(tmp, VOCAB_NAME),
            merges_file=os.path.join(tmp, MERGES_NAME),
            json_keys=["text"],
            append_eod=True,
            workers=workers,
            progress=False,
        )["text"]
        from libai.data.data_utils.indexed_dataset import MMapIndexedDataset

        dataset = MMapIndexedDataset(prefix, skip_warmup=True)
        info = {
            "documents": len(dataset),
            "tokens": int(dataset.sizes.sum()),
            "corpus_bytes": corpus_bytes,
            "vocab_size": bpe.get_vocab_size(),
            "python": sys.version.split()[0],
            "build_seconds": round(time.perf_counter() - start, 2),
        }
        del dataset
        for name in (CORPUS_NAME, VOCAB_NAME, MERGES_NAME):
            os.replace(os.path.join(tmp, name), os.path.join(data_dir, name))
        for ext in (".bin", ".idx"):
            os.replace(prefix + ext, os.path.join(data_dir, DATA_NAME + ext))
        ready = os.path.join(tmp, READY_NAME)
        with open(ready, "w") as f:
            json.dump(info, f, indent=2)
        os.replace(ready, os.path.join(data_dir, READY_NAME))  # last: marks the build complete
    return info


def ensure_sample_dataset(
    data_dir: str | None = None,
    max_bytes: int = 3_000_000,
    vocab_size: int = 8192,
    workers: int = 1,
    force: bool = False,
) -> dict[str, str]:
    """Build the sample dataset in ``data_dir`` unless it is already there; return its paths.

    Args:
        data_dir: target directory (default :func:`default_sample_data_dir`).
        max_bytes: corpus size; the default 3 MB gives ~0.75M tokens and builds in a few
            seconds on 2 cores.
        vocab_size: BPE vocabulary size, ``<|endoftext|>`` included.
        workers: tokenizer processes for the preprocessing (1 = in this process).
        force: rebuild even if the files exist.

    Returns:
        ``{"data_dir", "data_prefix", "vocab_file", "merges_file", "corpus"}``.

    Safe to call from several processes at once (file lock + atomic renames).
    """
    paths = sample_dataset_paths(data_dir)
    data_dir = paths["data_dir"]
    if not force and is_sample_dataset_ready(data_dir):
        return paths
    os.makedirs(data_dir, exist_ok=True)
    with _exclusive_lock(os.path.join(data_dir, ".lock")):
        if force or not is_sample_dataset_ready(data_dir):  # someone may have built it meanwhile
            logger.info("building the sample GPT-2 dataset in %s ...", data_dir)
            info = _build(data_dir, max_bytes, vocab_size, workers)
            logger.info(
                "sample dataset ready: %d documents, %d tokens, vocab %d (%.1fs)",
                info["documents"],
                info["tokens"],
                info["vocab_size"],
                info["build_seconds"],
            )
    return paths


# ---- configs ------------------------------------------------------------------------------------
def _get(node, key):
    if node is None:
        return None
    if isinstance(node, Mapping):
        return node.get(key)
    return getattr(node, key, None)


def _configured_data_paths(cfg) -> list[str]:
    """vocab/merges files of ``cfg.tokenization`` and data prefixes of ``cfg.dataloader``."""
    paths = []
    tokenizer = _get(_get(cfg, "tokenization"), "tokenizer")
    for key in ("vocab_file", "merges_file"):
        if _get(tokenizer, key):
            paths.append(str(_get(tokenizer, key)))
    dataloader = _get(cfg, "dataloader")
    loaders = [_get(dataloader, "train")] + list(_get(dataloader, "test") or [])
    for loader in loaders:
        datasets = _get(loader, "dataset")
        if datasets is None:
            continue
        if isinstance(datasets, Mapping) or not hasattr(datasets, "__iter__"):
            datasets = [datasets]
        for ds in datasets:
            for node in (ds, _get(ds, "indexed_dataset")):
                if _get(node, "data_prefix"):
                    paths.append(str(_get(node, "data_prefix")))
    return paths


def prepare_sample_data(cfg, workers: int = 1) -> dict[str, str] | None:
    """Build the sample dataset for a config that points at one and finds it missing.

    A configured path (``tokenization.tokenizer.vocab_file`` / ``merges_file``,
    ``dataloader.*.dataset[*].data_prefix``) whose file name is a sample dataset's
    (``gpt2-vocab.json``, ``gpt2-merges.txt``, ``stdlib_text_document``) marks its directory
    as a sample-dataset directory; each such directory is built if incomplete. Other paths are
    left alone (a missing one fails later with a message naming it). Returns the paths of the
    (last) sample dataset, or ``None`` when the config uses none. Safe on every rank at once.
    """
    dirs = []
    for path in _configured_data_paths(cfg):
        if os.path.basename(path) in SAMPLE_FILE_NAMES:
            directory = os.path.dirname(os.path.abspath(path))
            if directory not in dirs:
                dirs.append(directory)
    result = None
    for directory in dirs:
        result = ensure_sample_dataset(directory, workers=workers)
    return result
