"""LiBai's options on the BERT family's data side: ``masking_style`` (whole-word n-gram
masking), RoBERTa's ``short_seq_prob``, BertTokenizer's ``do_chinese_wwm`` / extra special
tokens, ``--do-chinese-wwm`` in tools/preprocess_data.py, and LiBai's batch names in the
perplexity / accuracy evaluators -- each against a rule computed in the test."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest
import torch
from bpe_helpers import write_indexed
from train_net_helpers import ROOT

from libai import dist
from libai.data.datasets import BertDataset
from libai.data.datasets.lm_masking import WholeWordMasking
from libai.data.datasets.roberta_dataset import pack_sentences
from libai.evaluation import ClsEvaluator, PPLEvaluator
from libai.tokenizer import BertTokenizer

WORDS = ["the", "fox", "jump", "run", "dog", "中", "国", "人"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ed", "##国", "##人"]
HAS_JIEBA = importlib.util.find_spec("jieba") is not None


@pytest.fixture(scope="module", autouse=True)
def single_process_mesh():
    dist.setup_dist_util({})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return BertTokenizer(str(path))


def sample_tokens(rng) -> np.ndarray:
    """[CLS] words (some with ## pieces) [SEP]."""
    ids = [2]
    for _ in range(rng.integers(8, 20)):
        ids.append(int(rng.integers(5, 13)))
        for _ in range(rng.integers(0, 3)):
            ids.append(int(rng.integers(13, 17)))
    return np.asarray([*ids, 3])


def test_whole_word_masking_masks_whole_words_at_libai_rates(tokenizer):
    masker = WholeWordMasking("t", "bert", tokenizer, mask_id=4, vocab_size=len(VOCAB))
    rng = np.random.default_rng(0)
    masked = kept = as_mask = 0
    for _ in range(300):
        tokens = sample_tokens(rng)
        candidates = np.ones(len(tokens), bool)
        candidates[[0, -1]] = False
        out, labels = masker(tokens, candidates, target_length=len(tokens), prob=0.15, rng=rng)
        chosen = labels != -100
        want = min(0.15 * len(tokens), max(1, round(len(tokens) * 0.15)))
        assert 0 < chosen.sum() <= want  # LiBai's budget
        assert not chosen[[0, -1]].any()
        np.testing.assert_array_equal(labels[chosen], tokens[chosen])
        for pos in range(1, len(tokens) - 1):  # a piece is masked iff its word's start is
            if tokens[pos] >= 13:
                assert chosen[pos] == chosen[pos - 1], (tokens, labels)
        masked += chosen.sum()
        as_mask += (out[chosen] == 4).sum()
        kept += (out[chosen] == tokens[chosen]).sum()
    assert 0.76 < as_mask / masked < 0.84
    assert 0.08 < kept / masked < 0.13  # 10% unchanged (+ random draws of the same id)


def test_bert_cn_wwm_shows_chinese_pieces_as_characters_and_t5_always_masks(tokenizer):
    ids = {t: i for i, t in enumerate(VOCAB)}
    tokens = np.asarray([2, ids["中"], ids["##国"], ids["the"], ids["##s"], ids["人"], 3])
    candidates = np.array([0, 1, 1, 1, 1, 1, 0], bool)
    cn = WholeWordMasking("t", "bert-cn-wwm", tokenizer, 4, len(VOCAB))
    out, labels = cn(tokens, candidates, 7, 1e-9, np.random.default_rng(1))  # one word masked
    chosen = labels != -100
    shown = tokens.copy()
    shown[2] = ids["国"]  # ##国 is shown as 国; ##s (not Chinese) stays
    np.testing.assert_array_equal(out[~chosen], shown[~chosen])
    np.testing.assert_array_equal(labels[chosen], tokens[chosen])  # labels keep ##国
    t5 = WholeWordMasking("t", "t5", tokenizer, 4, len(VOCAB))
    out, labels = t5(tokens, candidates, 7, 0.5, np.random.default_rng(2))
    assert (out[labels != -100] == 4).all()
    with pytest.raises(ValueError, match="masking_style must be one of"):
        WholeWordMasking("t", "span", tokenizer, 4, len(VOCAB))


def test_bert_dataset_masking_style_masks_whole_words(tokenizer, tmp_path):
    rng = np.random.default_rng(3)
    prefix = write_indexed(tmp_path / "docs", [sample_tokens(rng)[1:-1] for _ in range(40)])
    ds = BertDataset(
        "b", tokenizer, prefix, max_seq_length=48, binary_head=False, masking_style="bert"
    )
    for i in range(len(ds)):
        s = ds[i]
        chosen = s["loss_mask"].bool()
        for pos in torch.nonzero(s["input_ids"] >= 0).flatten().tolist()[1:]:
            original = s["lm_labels"][pos] if chosen[pos] else s["input_ids"][pos]
            if original >= 13 and pos > 1:
                assert chosen[pos] == chosen[pos - 1]


def test_pack_sentences_takes_a_budget_per_run():
    """RoBERTa's short_seq_prob draws each run's budget; a run closes past its own budget."""
    budgets = iter([10, 4, 10])
    rows = pack_sentences([3, 3, 3, 3, 3], [True, False, False, True, False], lambda: next(budgets))
    # run 1: 3+1, +3 = 7, +3 = 10 (fits 10); run 2: budget 4: 3+1; run 3: rest
    assert rows.tolist() == [[0, 3], [3, 4], [4, 5]]


def test_tokenizer_extra_special_tokens_and_chinese_wwm(tokenizer, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    tok = BertTokenizer(
        str(vocab), bos_token="[BOS]", eos_token="[EOS]", additional_special_tokens=["<x_0>"]
    )
    assert [tok.bos_token_id, tok.eos_token_id, *tok.additional_special_tokens_ids] == [
        len(VOCAB),
        len(VOCAB) + 1,
        len(VOCAB) + 2,
    ]  # appended to the vocab, as LiBai's add_special_tokens
    assert tok.encode("the [BOS] fox <x_0>") == [5, len(VOCAB), 6, len(VOCAB) + 2]
    wwm = BertTokenizer(str(vocab), do_chinese_wwm=True)
    assert wwm.encode("the fox") == tok.encode("the fox")  # no Chinese: no jieba needed
    if not HAS_JIEBA:
        with pytest.raises(ImportError, match="pip install jieba"):
            wwm.encode("the 中国人")
    wwm._segment = lambda text: {"中国人": ["中国", "人"]}[text]  # a segmenter in jieba's place
    ids = {t: i for i, t in enumerate(VOCAB)}
    assert wwm.encode("the 中国人", add_special_tokens=True) == [
        2,
        ids["the"],
        ids["中"],
        ids["##国"],
        ids["人"],
        3,
    ]


@pytest.mark.skipif(HAS_JIEBA, reason="checks the message shown without jieba")
def test_preprocess_do_chinese_wwm_without_jieba_says_how_to_install(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import preprocess_data
    finally:
        sys.path.pop(0)
    (tmp_path / "in.jsonl").write_text('{"text": "中国人"}\n')
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    argv = ["--input", str(tmp_path / "in.jsonl"), "--tokenizer-name", "BertTokenizer"]
    argv += ["--vocab-file", str(tmp_path / "vocab.txt"), "--output-prefix", str(tmp_path / "o")]
    assert preprocess_data.main([*argv, "--do-chinese-wwm", "--log-interval", "2"]) == 1
    assert "pip install jieba" in capsys.readouterr().err
    assert not list(tmp_path.glob("o*"))


def test_evaluators_read_libai_batch_names():
    """PPL counts LiBai's loss_mask tokens; accuracy reads ns_labels when there are no labels."""
    ppl = PPLEvaluator()
    batches = [(2.0, torch.tensor([[1, 0, 1], [0, 0, 1]])), (1.0, torch.tensor([[1, 0, 0]]))]
    for loss, mask in batches:
        ppl.process(
            {"loss_mask": mask, "lm_labels": torch.zeros_like(mask)},
            {"lm_loss": torch.tensor(loss)},
        )
    assert ppl.evaluate()["ppl"] == pytest.approx(math.exp((2.0 * 3 + 1.0 * 1) / 4))
    acc = ClsEvaluator(topk=(1,))
    acc.reset()
    logits = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]])
    acc.process({"ns_labels": torch.tensor([1, 1, 1])}, {"logits": logits})
    assert acc.evaluate()["Acc@1"] == pytest.approx(200 / 3)
