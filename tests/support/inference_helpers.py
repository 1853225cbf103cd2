"""Tiny random Hugging Face models with locally trained tokenizers, saved to directories,
for the inference pipeline tests (in-process and under torchrun)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

_WORDS = (
    "the quick brown fox jumps over lazy dog hello world paris is capital of france model "
    "training data language attention layer good bad movie great awful fine"
).split()
_rng = random.Random(0)
CORPUS = [" ".join(_rng.choice(_WORDS) for _ in range(10)) + "." for _ in range(200)]
TEXTS = [
    "the quick brown fox",
    "paris is the capital of france.",
    "a good movie, a great model",
    "hello world",
    "bad awful data",
]
BERT_MASKED = ["paris is the [MASK] of france.", "hello [MASK]", "the [MASK] fox jumps [MASK]"]
ROBERTA_MASKED = [t.replace("[MASK]", "<mask>") for t in BERT_MASKED]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def train_wordpiece_vocab(directory) -> None:
    """A lowercasing WordPiece ``vocab.txt`` of 200 entries trained on CORPUS, in ``directory``."""
    from tokenizers import BertWordPieceTokenizer

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(
        CORPUS,
        vocab_size=200,
        min_frequency=1,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False,
    )
    wordpiece.save_model(str(directory))


def _bert_config(**kw):
    base = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.3,  # peaked predictions: no near-ties in the rankings
    )
    return {**base, **kw}


def make_bert_dir(root, head: str = "pretraining", seed: int = 0, num_layers: int = 2) -> str:
    """A BERT directory (``head``: ``pretraining`` or ``classification`` with 3 labels)
    with a WordPiece tokenizer trained on CORPUS; returns its path."""
    import transformers

    root = Path(root)
    vocab_dir = root / "vocab"
    vocab_dir.mkdir(parents=True, exist_ok=True)
    train_wordpiece_vocab(vocab_dir)
    tokenizer = transformers.BertTokenizer.from_pretrained(vocab_dir)  # vocab_file= is ignored
    out = root / f"bert_{head}_{num_layers}"
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    if head == "pretraining":
        config = transformers.BertConfig(
            vocab_size=len(tokenizer), **_bert_config(num_hidden_layers=num_layers)
        )
        model = transformers.BertForPreTraining(config)
    else:
        config = transformers.BertConfig(
            vocab_size=len(tokenizer),
            num_labels=3,
            id2label=LABELS,
            label2id={v: k for k, v in LABELS.items()},
            **_bert_config(num_hidden_layers=num_layers),
        )
        model = transformers.BertForSequenceClassification(config)
    model.save_pretrained(out)
    return str(out)


def make_roberta_dir(root, seed: int = 0) -> str:
    """A RobertaForMaskedLM directory with a byte-level BPE trained on CORPUS."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    root = Path(root)
    vocab_dir = root / "bpe"
    vocab_dir.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS,
        vocab_size=300,
        min_frequency=2,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    bpe.save_model(str(vocab_dir))
    tokenizer = transformers.RobertaTokenizer(
        vocab=str(vocab_dir / "vocab.json"), merges=str(vocab_dir / "merges.txt")
    )
    out = root / "roberta"
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = transformers.RobertaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
        **_bert_config(max_position_embeddings=66),
    )
    transformers.RobertaForMaskedLM(config).save_pretrained(out)
    return str(out)


def make_vit_dir(root, seed: int = 0) -> str:
    """A ViTForImageClassification directory (16x16 images, 4 labels) with a
    ``preprocessor_config.json`` (non-default mean / std)."""
    import transformers
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    out = Path(root) / "vit"
    torch.manual_seed(seed)
    labels = {0: "cat", 1: "dog", 2: "bird", 3: "fish"}
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.3,
        num_labels=4,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    transformers.ViTForImageClassification(config).save_pretrained(out)
    processor = ViTImageProcessorPil(
        size={"height": 16, "width": 16},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    processor.save_pretrained(out)
    return str(out)


def make_images(n: int = 4, seed: int = 0):
    """Random RGB PIL images of different sizes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(20, 24), (16, 16), (31, 17), (8, 12), (40, 40)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes[:n]]


def assert_same_results(ours, theirs, tol: float = 1e-5, where: str = "result") -> None:
    """Same structure, strings and ints; floats within ``tol``."""
    if isinstance(theirs, float):
        assert isinstance(ours, float) and abs(ours - theirs) <= tol, (where, ours, theirs)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), (where, ours, theirs)
        for k in theirs:
            assert_same_results(ours[k], theirs[k], tol, f"{where}[{k!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert isinstance(ours, list) and len(ours) == len(theirs), (where, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same_results(a, b, tol, f"{where}[{i}]")
    else:
        assert ours == theirs, (where, ours, theirs)
