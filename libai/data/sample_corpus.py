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

Where it is built: only in our cache directory, ``$LIBAI_SAMPLE_DATA_DIR`` or
``~/.cache/libai/sample_gpt2`` (:func:`~libai.config.resolvers.default_sample_data_dir`),
and only when asked explicitly: a LiBai config names the sample files with
``${libai_sample:vocab_file}`` / ``merges_file`` / ``data_prefix`` (see
:mod:`libai.config.resolvers`; :func:`prepare_sample_data` builds for such a config), FleetX's
``GPTModule`` / ``GPTDataset`` with ``vocab_file`` / ``merges_file`` / ``data_prefix`` null.
A path is never taken for sample data because of its file name: a user's own
``gpt2-vocab.json`` is just a vocabulary.

Users' files are safe: :func:`ensure_sample_dataset` refuses (``ValueError``, nothing touched)
a directory that holds files with the sample's names but no ``sample_dataset.json`` marker of a
build of ours; it overwrites only files that it created.

Concurrency: the build holds an exclusive file lock on ``DATA_DIR/.lock`` and moves finished
files into place atomically, so any number of processes may call it at once: one builds,
the others wait and reuse. Under ``torchrun`` you may also call it on local rank 0 only and
``dist.synchronize()`` afterwards; both work.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from libai.config.resolvers import (
    CORPUS_NAME,
    DATA_NAME,
    MERGES_NAME,
    READY_NAME,
    SAMPLE_RESOLVER,
    VOCAB_NAME,
    default_sample_data_dir,
)

logger = logging.getLogger(__name__)

EOD_TOKEN = "<|endoftext|>"
#: present while a build of ours moves its files into place (an interrupted build's files are
#: ours to replace, and a concurrent caller must not take them for a user's)
PARTIAL_NAME = ".sample_dataset.partial"
#: the files a build writes: a directory holding any of them without our marker is a user's
SAMPLE_FILES = (
    VOCAB_NAME,
    MERGES_NAME,
    DATA_NAME + ".bin",
    DATA_NAME + ".idx",
    CORPUS_NAME,
)
#: how a config value asks for the sample dataset: ``${libai_sample:...}``
_SAMPLE_INTERPOLATION = re.compile(r"\$\{\s*" + SAMPLE_RESOLVER + r"\s*:")


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
    """Whether a build of ours completed in ``data_dir`` and its files are all there."""
    paths = sample_dataset_paths(data_dir)
    needed = [
        os.path.join(paths["data_dir"], READY_NAME),
        paths["vocab_file"],
        paths["merges_file"],
        paths["data_prefix"] + ".bin",
        paths["data_prefix"] + ".idx",
    ]
    return all(os.path.isfile(p) for p in needed)


def foreign_sample_files(data_dir: str) -> list[str]:
    """The files in ``data_dir`` named like the sample's that no build of ours wrote.

    Empty when there are none, or when our marker (a completed build's ``sample_dataset.json``
    or an interrupted one's partial marker) says they are ours. The files are looked up before
    the markers, so a concurrent build that is moving its files in is never taken for a user.
    """
    present = [n for n in SAMPLE_FILES if os.path.lexists(os.path.join(data_dir, n))]
    if not present:
        return []
    if any(os.path.isfile(os.path.join(data_dir, m)) for m in (READY_NAME, PARTIAL_NAME)):
        return []
    return present


def _refuse_foreign_files(data_dir: str) -> None:
    """Raise, touching nothing, if ``data_dir`` holds sample-named files that are not ours."""
    foreign = foreign_sample_files(data_dir)
    if foreign:
        raise ValueError(
            f"Refusing to build the sample dataset in {data_dir}: it holds {', '.join(foreign)} "
            f"but no {READY_NAME} of a sample build, so they are someone's own files and are "
            "left untouched. Set LIBAI_SAMPLE_DATA_DIR to an empty or new directory."
        )


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
        partial = os.path.join(data_dir, PARTIAL_NAME)
        open(partial, "w").close()  # before the first file moves in: these files are ours
        for name in (CORPUS_NAME, VOCAB_NAME, MERGES_NAME):
            os.replace(os.path.join(tmp, name), os.path.join(data_dir, name))
        for ext in (".bin", ".idx"):
            os.replace(prefix + ext, os.path.join(data_dir, DATA_NAME + ext))
        ready = os.path.join(tmp, READY_NAME)
        with open(ready, "w") as f:
            json.dump(info, f, indent=2)
        os.replace(ready, os.path.join(data_dir, READY_NAME))  # last: marks the build complete
        os.remove(partial)
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
        force: rebuild even if a build of ours is complete there.

    Returns:
        ``{"data_dir", "data_prefix", "vocab_file", "merges_file", "corpus"}``.

    Raises:
        ValueError: ``data_dir`` holds files with the sample's names (``gpt2-vocab.json``,
            ``gpt2-merges.txt``, ``stdlib_text_document.bin/.idx``, ``stdlib_corpus.jsonl``)
            that no build of ours wrote (no ``sample_dataset.json``); nothing is touched,
            ``force`` or not.

    Safe to call from several processes at once (file lock + atomic renames). Its temporary
    files (``.lock``, ``.build-*``) live in ``data_dir``; the build directory is removed.
    """
    paths = sample_dataset_paths(data_dir)
    data_dir = paths["data_dir"]
    if not force and is_sample_dataset_ready(data_dir):
        return paths
    _refuse_foreign_files(data_dir)  # before the lock file: a user's directory stays as it was
    os.makedirs(data_dir, exist_ok=True)
    with _exclusive_lock(os.path.join(data_dir, ".lock")):
        if force or not is_sample_dataset_ready(data_dir):  # someone may have built it meanwhile
            _refuse_foreign_files(data_dir)
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
def _raw_strings(node) -> Iterator[str]:
    """Every string value under ``node``, interpolations left unresolved (lazy nodes too)."""
    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=False)
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _raw_strings(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _raw_strings(value)


def uses_sample_data(cfg) -> bool:
    """Whether some value of ``cfg``, unresolved, is a ``${libai_sample:...}`` interpolation:
    the one way a config asks for the sample dataset (file names are never looked at)."""
    return any(_SAMPLE_INTERPOLATION.search(value) for value in _raw_strings(cfg))


def prepare_sample_data(cfg, workers: int = 1) -> dict[str, str] | None:
    """Build the sample dataset if ``cfg`` asks for it, in our cache directory only.

    A config asks by naming a sample file with ``${libai_sample:vocab_file}`` (or
    ``merges_file``, ``data_prefix``, ...) anywhere, lazy nodes included; then the dataset is
    built, unless present, in :func:`default_sample_data_dir` (the directory the interpolation
    resolves to). A config whose paths are all the user's own builds nothing, whatever its file
    names. Returns the sample dataset's paths, or ``None`` when the config uses none. Safe on
    every rank at once.
    """
    if not uses_sample_data(cfg):
        return None
    return ensure_sample_dataset(default_sample_data_dir(), workers=workers)
