"""A tiny WordPiece vocab.txt and a sentence-split indexed corpus of its ids: the data
LiBai's T5 config reads (its BERT tokenizer, ``--split-sentences`` preprocessing)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from libai.data.data_utils import MMapIndexedDatasetBuilder

WORDS = (
    "the quick brown fox jumps over a lazy dog while model training reads language data "
    "from many documents and every sentence ends here attention layers learn to predict"
).split()
#: LiBai's t5_dataset.py tokenizer keywords (with the vocab file added)
SPECIAL = {
    "bos_token": "[BOS]",
    "eos_token": "[EOS]",
    "additional_special_tokens": [f"<extra_id_{i}>" for i in range(100)],
}


def sentences(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(n)]


def build_t5_corpus(root: Path, documents: int = 120) -> tuple[str, str]:
    """``(vocab.txt, data prefix)``: a 120-token WordPiece vocab (words split into ``##``
    pieces) and documents of 2-6 sentences, one indexed item per sentence."""
    from tokenizers import BertWordPieceTokenizer

    root.mkdir(parents=True, exist_ok=True)
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(
        sentences(0, 200),
        vocab_size=120,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False,
    )
    wordpiece.save_model(str(root))
    encoded = [wordpiece.encode(s, add_special_tokens=False).ids for s in sentences(0, 200)]
    rng = random.Random(1)
    prefix = str(root / "t5_text_sentence")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(documents):
        for _ in range(rng.randint(2, 6)):
            builder.add_item(np.asarray(rng.choice(encoded)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return str(root / "vocab.txt"), prefix
