"""Tiny byte-level BPE vocabularies and indexed datasets for the data / tokenizer tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SAMPLE_TEXTS = [
    "def hello(world):\n    return world + 1\n",
    "class Greeter:\n    def greet(self, name):\n        print('hello', name)\n",
    "The quick brown fox jumps over the lazy dog. Hello world!\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(0)\n",
] * 8


def train_tiny_bpe(out_dir, vocab_size: int = 400) -> tuple[str, str]:
    """Train a byte-level BPE with ``<|endoftext|>`` on SAMPLE_TEXTS; return (vocab, merges)."""
    from tokenizers import ByteLevelBPETokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        SAMPLE_TEXTS,
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    bpe.save_model(str(out_dir), "tiny")
    return str(out_dir / "tiny-vocab.json"), str(out_dir / "tiny-merges.txt")


def write_hand_bpe(out_dir) -> tuple[str, str]:
    """A hand-written GPT-2 style vocab where 'hello' and 'Ġworld' are single tokens."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chars = ["h", "e", "l", "o", "Ġ", "w", "r", "d", "!"]
    merged = ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld"]
    vocab = {tok: i for i, tok in enumerate(chars + merged)}
    vocab["<|endoftext|>"] = len(vocab)
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]
    (out_dir / "vocab.json").write_text(json.dumps(vocab))
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return str(out_dir / "vocab.json"), str(out_dir / "merges.txt")


def write_indexed(prefix, docs, dtype=np.uint16) -> str:
    """Write ``docs`` (lists of token ids), one sequence and document each."""
    from libai.data.data_utils import MMapIndexedDatasetBuilder

    prefix = str(prefix)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        builder.add_item(np.asarray(doc))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix
