"""Offline stand-ins for the Hub names in Rapidformer's documented commands, of the same
shape: a tiny ``bert-base-cased`` (a BertForSequenceClassification + WordPiece tokenizer saved
by transformers), the GLUE dataset repository as laid out on the Hub (``glue/README.md`` with
its ``configs:`` header + ``glue/mrpc/{train,validation,test}-*.parquet``), a BERT vocab file,
GPT-2 vocab / merges, and a JSON-lines corpus for ``tools/preprocess_data.py``."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "the a of and to is was in it on cat dog sat ran mat big red".split()
BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ".", ","]

GLUE_README = """---
configs:
- config_name: mrpc
  data_files:
  - split: train
    path: mrpc/train-*
  - split: validation
    path: mrpc/validation-*
  - split: test
    path: mrpc/test-*
- config_name: qnli
  data_files:
  - split: train
    path: qnli/train-*
  - split: validation
    path: qnli/validation-*
---
# GLUE (a local stand-in of the Hub repository's layout)
"""


def _sentence(rng: random.Random, low: int = 3, high: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def bert_vocab(root: Path) -> Path:
    path = Path(root) / "bert-en-uncased-vocab.txt"
    path.write_text("\n".join(BERT_VOCAB) + "\n")
    return path


def bert_base_cased(root: Path) -> Path:
    """A tiny ``bert-base-cased`` stand-in: dropout off, weights large enough that rows get
    different logits."""
    import torch
    import transformers

    out = Path(root) / "bert-base-cased"
    out.mkdir(parents=True, exist_ok=True)
    # transformers 5 reads the vocabulary from vocab= (vocab_file= is ignored)
    tok = transformers.BertTokenizerFast(vocab=str(bert_vocab(root)), do_lower_case=True)
    tok.save_pretrained(out)
    config = transformers.BertConfig(
        vocab_size=len(BERT_VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        initializer_range=0.2,
        num_labels=2,
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(out)
    return out


def glue_repo(root: Path, sizes=(("train", 16), ("validation", 8), ("test", 4))) -> Path:
    """``glue/`` as on the Hub: README.md with the ``configs:`` header, parquet splits of
    ``mrpc`` (sentence1, sentence2, label, idx; test labels -1) and ``qnli`` (question,
    sentence, label, idx)."""
    import pandas as pd

    out = Path(root) / "glue"
    rng = random.Random(0)
    for config, columns in (
        ("mrpc", ("sentence1", "sentence2")),
        ("qnli", ("question", "sentence")),
    ):
        (out / config).mkdir(parents=True, exist_ok=True)
        for split, n in sizes:
            if config == "qnli" and split == "test":
                continue
            rows = {c: [_sentence(rng) for _ in range(n)] for c in columns}
            rows["label"] = [-1 if split == "test" else rng.randint(0, 1) for _ in range(n)]
            rows["idx"] = list(range(n))
            path = out / config / f"{split}-00000-of-00001.parquet"
            pd.DataFrame(rows).to_parquet(path)
    (out / "README.md").write_text(GLUE_README)
    return out


def corpus_jsonl(root: Path, documents: int = 40) -> Path:
    """Documents of 2-5 sentences, one per line of text (the sentence splitter's unit)."""
    rng = random.Random(1)
    path = Path(root) / "book_wiki_owtv2_small.json"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            sentences = [_sentence(rng) + " ." for _ in range(rng.randint(2, 5))]
            f.write(json.dumps({"text": "\n".join(sentences)}) + "\n")
    return path


def gpt2_files(root: Path) -> tuple[Path, Path]:
    """``gpt2-vocab.json`` / ``gpt2-merges.txt`` of a byte-level BPE trained on the corpus
    words (with ``<|endoftext|>``)."""
    from tokenizers import ByteLevelBPETokenizer

    out = Path(root) / "gpt2-files"
    out.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    rng = random.Random(2)
    texts = [_sentence(rng) + " ." for _ in range(200)]
    bpe.train_from_iterator(
        texts,
        vocab_size=300,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    bpe.save_model(str(out), "gpt2")
    return out / "gpt2-vocab.json", out / "gpt2-merges.txt"
