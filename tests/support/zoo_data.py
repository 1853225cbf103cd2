"""Tiny local data for the zoo's task tests: an SFT JSON-lines file with a byte-level BPE
tokenizer.json, an image folder of coloured noise (one class per colour), and sentence-split
indexed corpora."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from libai.data.data_utils import MMapIndexedDatasetBuilder

WORDS = "add the numbers please answer with one word red green blue sum of two and three".split()
COLORS = [(220, 30, 30), (30, 200, 40), (40, 60, 230)]  # one class per dominant colour


def build_sft_files(root: Path, rows: int = 48) -> tuple[Path, Path, int]:
    """``(tokenizer_dir, data.jsonl, vocab size)``: "Add a and b." records answered with the
    sum, and a BPE tokenizer with ``<pad>`` and ``</s>`` trained on them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from libai.data.datasets.sft_dataset import (
        DEFAULT_PROMPT_TEMPLATE,
        DEFAULT_PROMPT_TEMPLATE_NO_INPUT,
    )

    g = torch.Generator().manual_seed(0)
    records = []
    for _ in range(rows):
        a, b = (int(v) for v in torch.randint(0, 10, (2,), generator=g))
        words = [WORDS[int(j)] for j in torch.randint(0, len(WORDS), (4,), generator=g)]
        records.append(
            {"instruction": f"Add {a} and {b}.", "input": " ".join(words), "output": str(a + b)}
        )
    data = root / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<pad>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [json.dumps(r) for r in records] + [
        DEFAULT_PROMPT_TEMPLATE,
        DEFAULT_PROMPT_TEMPLATE_NO_INPUT,
    ]
    tok.train_from_iterator(corpus, trainer)
    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "</s>", "pad_token": "<pad>"})
    )
    return tok_dir, data, tok.get_vocab_size()


def build_image_folder(root: Path, counts=(("train", 12), ("val", 4)), size: int = 20) -> Path:
    """``root/{train,val}/class_{k}/img_{i}.png``: noisy images of one colour per class."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in counts:
        for label, color in enumerate(COLORS):
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(np.array(color) + rng.normal(0, 25, (size, size, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"img_{i}.png")
    return root


CLS_WORDS = "the movie was plot acting story music long short film scene actor".split()


def build_text_classification(root: Path, model_type: str = "bert") -> tuple[Path, Path, Path]:
    """``(hf_dir, train.csv, dev.csv)``: a tiny masked-LM checkpoint (BERT or RoBERTa) with
    its tokenizer files, and sentence pairs labelled 1 when they say "good", 0 when "bad"."""
    import csv
    import random

    import transformers
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer

    rng = random.Random(0)

    def sentence(word):
        words = [rng.choice(CLS_WORDS) for _ in range(5)]
        words.insert(rng.randrange(6), word)
        return " ".join(words)

    rows = []
    for _ in range(96):
        label = rng.randrange(2)
        rows.append((sentence("good" if label else "bad"), sentence(rng.choice(CLS_WORDS)), label))
    hf_dir = root / f"{model_type}_hf"
    hf_dir.mkdir(parents=True)
    corpus = [f"{a} {b}" for a, b, _ in rows]
    if model_type == "bert":
        tok = BertWordPieceTokenizer(lowercase=True)
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok.train_from_iterator(corpus, vocab_size=80, special_tokens=specials, show_progress=False)
        tok.save_model(str(hf_dir))
        config = transformers.BertConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
        )
        transformers.BertForPreTraining(config).save_pretrained(hf_dir)  # has the pooler
    else:
        tok = ByteLevelBPETokenizer()
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tok.train_from_iterator(
            corpus, vocab_size=300, special_tokens=specials, show_progress=False
        )
        tok.save_model(str(hf_dir))
        config = transformers.RobertaConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=80,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
        transformers.RobertaForMaskedLM(config).save_pretrained(hf_dir)
    paths = []
    for name, part in (("train.csv", rows[:80]), ("dev.csv", rows[80:])):
        path = root / name
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence1", "sentence2", "label"])
            writer.writerows(part)
        paths.append(path)
    return hf_dir, paths[0], paths[1]


def write_sentences(prefix, docs, dtype=np.uint16) -> str:
    """One item per sentence, documents delimited (the ``--split-sentences`` layout)."""
    prefix = str(prefix)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        for sentence in doc:
            builder.add_item(np.asarray(sentence))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix
