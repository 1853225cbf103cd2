"""configs/bert_large_pretrain.py and configs/roberta_pretrain.py through tools/train_net.py
with tiny overrides on tiny data built here (a WordPiece / byte-level BPE trained with
`tokenizers`, sentence-split indexed datasets): the losses fall, evaluation runs, and BERT
trains under pp2 through the multi-tensor pipeline contract."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from train_net_helpers import ROOT, read_metrics, run_train_net

from libai.config import LazyConfig
from libai.data.data_utils import MMapIndexedDatasetBuilder

_WORDS = (
    "the quick brown fox jumps over a lazy dog while model training reads language data "
    "from many documents and every sentence ends here attention layers learn to predict"
).split()


def _sentences(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(n)]


def _write_corpus(prefix: Path, encode, seed: int) -> str:
    """Documents of 2-6 sentences, one indexed item per sentence (``--split-sentences``)."""
    rng = random.Random(seed)
    encoded = [encode(s) for s in _sentences(seed, 200)]
    builder = MMapIndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for _ in range(120):
        for _ in range(rng.randint(2, 6)):
            builder.add_item(np.asarray(rng.choice(encoded)))
        builder.end_document()
    builder.finalize(str(prefix) + ".idx")
    return str(prefix)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer

    root = tmp_path_factory.mktemp("zoo_data")
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(
        _sentences(0, 200),
        vocab_size=120,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False,
    )
    wordpiece.save_model(str(root))
    bert = _write_corpus(
        root / "bert_text_sentence",
        lambda s: wordpiece.encode(s, add_special_tokens=False).ids,
        seed=1,
    )
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _sentences(0, 200),
        vocab_size=300,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],  # <pad> = 1, as RoBERTa's
        show_progress=False,
    )
    bpe.save_model(str(root))
    roberta = _write_corpus(root / "roberta_text_sentence", lambda s: bpe.encode(s).ids, seed=2)
    return {
        "bert": [
            f"tokenization.tokenizer.vocab_file={root / 'vocab.txt'}",
            f"dataloader.train.dataset.0.data_prefix={bert}",
        ],
        "roberta": [
            f"tokenization.tokenizer.vocab_file={root / 'vocab.json'}",
            f"tokenization.tokenizer.merges_file={root / 'merges.txt'}",
            f"dataloader.train.dataset.0.data_prefix={roberta}",
        ],
    }


TINY = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=32",
    "model.cfg.num_attention_heads=2",
    "model.cfg.intermediate_size=64",
    "model.cfg.hidden_dropout_prob=0.0",
    "model.cfg.attention_probs_dropout_prob=0.0",
    "dataloader.train.dataset.0.max_seq_length=32",
    "dataloader.train.num_workers=0",
    "train.train_micro_batch_size=8",
    "train.test_micro_batch_size=8",
    "train.log_period=1",
    "train.warmup_ratio=0",
    "train.evaluation.eval_iter=2",
    "optim.lr=5e-3",
]


def train_net(config: str, out_dir, overrides, nproc=1):
    opts = [*TINY, f"train.output_dir={out_dir}", *overrides]
    run_train_net(ROOT / "configs" / config, opts, nproc=nproc)
    return read_metrics(out_dir)


def assert_learns(metrics: dict, iters: int) -> None:
    """The mean loss of the last 3 steps is well below that of the first 3."""
    losses = [metrics[i]["total_loss"] for i in range(iters)]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses


def test_bert_large_pretrain_config_trains(corpora, tmp_path):
    out = tmp_path / "bert"
    metrics = train_net(
        "bert_large_pretrain.py",
        out,
        [
            *corpora["bert"],
            "model.cfg.max_position_embeddings=32",
            "train.train_iter=30",
            "train.evaluation.eval_period=30",
        ],
    )
    cfg = LazyConfig.load(str(out / "config.yaml"))  # the saved config loads back
    assert cfg.model.cfg.hidden_layers == 2 and cfg.model._target_.endswith("BertForPreTraining")
    assert_learns(metrics, 30)
    assert "ppl" in metrics[29]
    assert (out / "model_final" / ".metadata").exists()


def test_bert_trains_under_pipeline_parallelism(corpora, tmp_path):
    """pp2 (padding masks read by each stage, 2 micro-batches) gives the one-process losses
    on the same global batches."""
    opts = [
        *corpora["bert"],
        "model.cfg.max_position_embeddings=32",
        "train.train_iter=3",
        "train.num_accumulation_steps=2",
        "train.evaluation.enabled=False",
    ]
    pp2 = train_net(
        "bert_large_pretrain.py",
        tmp_path / "bert_pp2",
        [*opts, "train.dist.pipeline_parallel_size=2"],
        nproc=2,
    )
    one = train_net("bert_large_pretrain.py", tmp_path / "bert_one", opts)
    got = [pp2[i]["total_loss"] for i in range(3)]
    want = [one[i]["total_loss"] for i in range(3)]
    assert got == pytest.approx(want, rel=1e-5), (got, want)
    assert len(set(want)) == 3  # three different batches, not one repeated


def test_roberta_pretrain_config_trains(corpora, tmp_path):
    out = tmp_path / "roberta"
    metrics = train_net(
        "roberta_pretrain.py",
        out,
        [
            *corpora["roberta"],
            "model.cfg.max_position_embeddings=34",
            "train.train_iter=30",
            "train.evaluation.eval_period=30",
        ],
    )
    assert_learns(metrics, 30)
    assert "ppl" in metrics[29]
