"""The language-model datasets (BERT, RoBERTa, LiBai's T5, GPT, GLUE, SFT) on tiny hand-made
corpora, each checked against Megatron's / LiBai's rule written out here: Megatron's pair
trimming, the next-sentence coin, the sentence-run index, the number of masked-LM
predictions, GPT's epoch count, the legacy ``data_impl`` reader, GLUE's columns and
longest-first truncation, and SFT's prompt label masking -- all computed by hand."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from zoo_data import write_sentences

from libai import dist
from libai.data.data_utils import MMapIndexedDatasetBuilder, get_indexed_dataset
from libai.data.data_utils.indexed_dataset import make_builder
from libai.data.datasets import BertDataset, LiBaiT5Dataset, RobertaDataset, SFTDataset
from libai.data.datasets.bert_dataset import truncated_lengths
from libai.data.datasets.glue import glue_dataset_class
from libai.data.datasets.gpt_dataset import GPT2Dataset, _num_epochs
from libai.data.datasets.gpt_split import GPTDataset
from libai.data.datasets.lm_utils import document_token_sizes, mask_tokens, read_document

IGNORE = -100


@pytest.fixture(scope="module", autouse=True)
def single_process_mesh():
    dist.setup_dist_util({})


@dataclass
class MaskedLMIds:
    """The ids a BERT / RoBERTa dataset reads; ``get_vocab`` for ``masking_style`` (no
    ``##`` pieces: every token is a whole word)."""

    cls: int = 0
    sep: int = 1
    pad: int = 2
    mask: int = 3
    vocab_size: int = 20

    def get_vocab(self) -> dict[str, int]:
        return {f"w{i}": i for i in range(self.vocab_size)}


def unmasked(sample) -> list[int]:
    labels = sample["lm_labels"]
    return torch.where(labels != IGNORE, labels, sample["input_ids"]).tolist()


# ---- BERT ----------------------------------------------------------------------------------
def test_truncated_lengths_is_megatrons_one_token_at_a_time_trim():
    """Megatron's ``truncate_seq_pair``: while A + B is too long, drop one token from the
    longer segment, from B on ties -- written here as that loop, for every small case (an
    even excess on equal lengths splits evenly: (5, 5) -> 8 tokens is (4, 4))."""
    for len_a in range(13):
        for len_b in range(13):
            for max_tokens in range(21):
                a, b = len_a, len_b
                while a + b > max_tokens:
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                assert truncated_lengths(len_a, len_b, max_tokens) == (a, b), (len_a, len_b)


class _FixedCoin:
    """A sample generator whose scalar ``random()`` is ``coin`` (arrays and every other
    draw come from the real generator)."""

    def __init__(self, rng, coin: float):
        self._rng, self._coin = rng, coin

    def random(self, size=None):
        return self._coin if size is None else self._rng.random(size)

    def __getattr__(self, name):
        return getattr(self._rng, name)


@pytest.mark.parametrize("coin, swapped", [(0.5, False), (float(np.nextafter(0.5, 0.0)), True)])
def test_bert_next_sentence_swap_is_coin_strictly_below_one_half(tmp_path, coin, swapped):
    """Megatron's ``get_a_and_b_segments``: ``if rng.random() < 0.5`` swap A and B
    (``ns_labels = 1``). A draw of exactly 0.5 keeps the order; the largest draw below 0.5
    swaps. Two-sentence documents: A is sentence 0 and B sentence 1 (no trimming)."""
    ids = MaskedLMIds()
    docs = [[[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]]
    prefix = write_sentences(tmp_path / "nsp", docs)

    class CoinBert(BertDataset):
        def sample_rng(self, idx):
            return _FixedCoin(super().sample_rng(idx), coin)

    ds = CoinBert("nsp", ids, data_prefix=prefix, max_seq_length=16, short_seq_prob=0.0)
    for i in range(len(ds)):
        s = ds[i]
        first = int(ds.samples_mapping[i][0])
        a, b = docs[first // 2]
        if swapped:
            a, b = b, a
        n = int(s["attention_mask"].sum())
        assert unmasked(s)[:n] == [ids.cls, *a, ids.sep, *b, ids.sep]
        assert int(s["ns_labels"]) == int(swapped)


def test_bert_mapping_runs_have_two_sentences_at_least(tmp_path):
    """Megatron's ``build_mapping`` with ``binary_head``: a document needs >= 2 sentences
    (fewer: skipped); a run ends once it reaches the target length with >= 2 sentences and
    more than one sentence left, or at the document's end. Hand-computed, target
    ``max_seq_length - 3`` (``short_seq_prob=0``)."""
    ids = MaskedLMIds()
    # sentences 0-1 | 2-3 | 4 (alone, skipped) | 5-7
    docs = [[[5, 6], [7]], [[8], [9, 10]], [[11, 12]], [[5], [6], [7]]]
    prefix = write_sentences(tmp_path / "a", docs)
    ds = BertDataset("b", ids, data_prefix=prefix, max_seq_length=32, short_seq_prob=0.0)
    rows = sorted(map(tuple, ds.samples_mapping.tolist()))
    assert rows == [(0, 2, 29), (2, 4, 29), (5, 8, 29)]

    # target 8 - 3 = 5 tokens: 3 + 3 >= 5 after two sentences with two left -> cut there
    four = [[[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]]]
    prefix = write_sentences(tmp_path / "b", four)
    ds = BertDataset("b", ids, data_prefix=prefix, max_seq_length=8, short_seq_prob=0.0)
    assert sorted(map(tuple, ds.samples_mapping.tolist())) == [(0, 2, 5), (2, 4, 5)]


def test_bert_mapping_without_short_runs_draws_no_lengths(tmp_path):
    """``short_seq_prob=0`` draws no random target lengths, so the epoch is the runs in
    document order (all of target ``max_seq_length - 3``) shuffled by the seed's generator
    alone: ``runs[default_rng(seed).permutation(n)]``."""
    ids = MaskedLMIds()
    docs = [[[5 + d, 6], [7, 8 + d]] for d in range(9)]
    prefix = write_sentences(tmp_path / "c", docs)
    ds = BertDataset("b", ids, data_prefix=prefix, max_seq_length=16, short_seq_prob=0.0, seed=7)
    runs = np.asarray([(2 * d, 2 * d + 2, 13) for d in range(9)], dtype=np.int64)
    expected = runs[np.random.default_rng(7).permutation(9)]
    np.testing.assert_array_equal(ds.samples_mapping, expected)


# ---- masked-LM helpers ---------------------------------------------------------------------
def test_mask_tokens_caps_predictions_at_max_predictions():
    """Megatron: ``num_to_predict = min(max_predictions_per_seq, max(1, round(n * p)))``:
    20 candidates at p = 0.5 with a cap of 3 predict exactly 3; a cap of 0 still predicts 1."""
    tokens = np.arange(100, 122)
    candidates = np.ones(22, dtype=bool)
    candidates[[0, -1]] = False
    for cap, expected in ((3, 3), (0, 1), (None, None)):
        out, labels = mask_tokens(tokens, candidates, 0.5, 7, 50, np.random.default_rng(1), cap)
        chosen = np.flatnonzero(labels != IGNORE)
        if expected is None:
            assert len(chosen) in (10, 11)  # int(0.5 * 20 + u), u in [0, 1)
        else:
            assert len(chosen) == expected
        np.testing.assert_array_equal(labels[chosen], tokens[chosen])
        assert not set(chosen) & {0, 21}


def test_mask_tokens_accepts_narrow_token_dtypes():
    """Token ids read from a small-dtype corpus (here uint8) are ids like any other: a
    ``[MASK]`` id of 300 and random ids up to the vocabulary size 1000 are written as such
    (no overflow, no wrap-around); unchosen positions are untouched."""
    tokens = np.arange(10, 110, dtype=np.uint8)
    candidates = np.ones(100, dtype=bool)
    out, labels = mask_tokens(tokens, candidates, 0.5, 300, 1000, np.random.default_rng(0))
    chosen = labels != IGNORE
    np.testing.assert_array_equal(labels[chosen], tokens[chosen].astype(np.int64))
    np.testing.assert_array_equal(out[~chosen], tokens[~chosen].astype(np.int64))
    assert (out[chosen] == 300).sum() >= 30  # 80% of ~50 predictions
    assert out.min() >= 0 and out.max() < 1000


def test_document_sizes_and_reading_an_empty_document(tmp_path):
    """``document_token_sizes`` is the int64 sum of each document's sentence sizes; an empty
    document (no sentence) reads as an empty integer array, so concatenating the documents'
    tokens keeps integer ids."""
    prefix = str(tmp_path / "docs")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in ([[1, 2], [3]], [], [[4, 5, 6]], [[7], [8], [9, 10]]):
        for sentence in doc:
            builder.add_item(np.asarray(sentence))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    ix = get_indexed_dataset(prefix)
    sizes = document_token_sizes(ix)
    assert sizes.dtype == np.int64
    assert sizes.tolist() == [3, 0, 3, 4]
    assert len(read_document(ix, 1)) == 0
    assert np.issubdtype(read_document(ix, 1).dtype, np.integer)
    joined = np.concatenate([read_document(ix, d) for d in range(4)])
    assert np.issubdtype(joined.dtype, np.integer)
    assert joined.tolist() == list(range(1, 11))


# ---- RoBERTa -------------------------------------------------------------------------------
def test_roberta_masking_style_predicts_at_least_one_token(tmp_path):
    """LiBai's whole-word masking predicts ``min(p * (max_seq_length - 2), max(1, round(p *
    len(tokens))))`` tokens: a sample ``<s> x </s>`` (one candidate) at p = 0.15 with
    max_seq_length 16 gets exactly one prediction, on ``x``."""
    ids = MaskedLMIds()
    prefix = write_sentences(tmp_path / "one", [[[7]]])
    ds = RobertaDataset("r", ids, data_prefix=prefix, max_seq_length=16, masking_style="bert")
    s = ds[0]
    assert unmasked(s)[:3] == [ids.cls, 7, ids.sep]
    assert s["loss_mask"].tolist() == [0, 1] + [0] * 14
    assert int(s["lm_labels"][1]) == 7


def test_roberta_smallest_sample_length_is_three(tmp_path):
    """``max_seq_length`` must be >= 3 (``<s>``, one token, ``</s>``): 3 is accepted and
    gives ``<s> x </s>``; 2 is refused."""
    ids = MaskedLMIds()
    prefix = write_sentences(tmp_path / "one", [[[7]]])
    ds = RobertaDataset("r", ids, data_prefix=prefix, max_seq_length=3)
    s = ds[0]
    assert unmasked(s) == [ids.cls, 7, ids.sep] and s["loss_mask"].tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="max_seq_length must be >= 3"):
        RobertaDataset("r", ids, data_prefix=prefix, max_seq_length=2)


def test_roberta_short_seq_prob_one_packs_every_run_short(tmp_path):
    """``short_seq_prob`` is a probability in [0, 1]: 1.0 is accepted and every run gets a
    random budget in [2, 15] (max_seq_length 16); with 1-token documents (2 tokens each with
    their ``</s>``) a run holds ``max(1, budget // 2)`` documents, so sample lengths
    ``1 + 2 * docs`` vary and are odd. Above 1 is refused."""
    ids = MaskedLMIds()
    prefix = write_sentences(tmp_path / "many", [[[5 + d % 10]] for d in range(200)])
    ds = RobertaDataset("r", ids, data_prefix=prefix, max_seq_length=16, short_seq_prob=1.0)
    lengths = {int(ds[i]["attention_mask"].sum()) for i in range(len(ds))}
    assert len(lengths) > 3 and all(n % 2 == 1 and 3 <= n <= 15 for n in lengths)
    full = RobertaDataset("r", ids, data_prefix=prefix, max_seq_length=16, short_seq_prob=0.0)
    assert len(ds) > len(full) == -(-200 // 7)  # 7 documents per full run
    with pytest.raises(ValueError, match="short_seq_prob must be in"):
        RobertaDataset("r", ids, data_prefix=prefix, short_seq_prob=1.01)


def test_roberta_for_split_keeps_max_seq_length(tmp_path):
    """The loader builder's per-split copy keeps the sample length (and the other options)."""
    ids = MaskedLMIds()
    prefix = write_sentences(tmp_path / "many", [[[5 + d % 10, 6]] for d in range(20)])
    ds = RobertaDataset("r", ids, data_prefix=prefix, max_seq_length=12, mask_lm_prob=0.3)
    part = ds.for_split("r/train", ds.indexed_dataset, np.arange(10), None)
    assert (part.max_seq_length, part.mask_lm_prob) == (12, 0.3)
    assert part[0]["input_ids"].shape == (12,)


# ---- LiBai's T5 ----------------------------------------------------------------------------
def test_libai_t5_default_name_and_for_split_keeps_masked_lm_prob(tmp_path):
    """LiBai's T5 dataset is named ``"t5"`` by default (errors name it so), and its per-split
    copy keeps ``masked_lm_prob`` and the decoder length."""
    from libai_t5_data import SPECIAL, build_t5_corpus

    from libai.tokenizer import BertTokenizer

    vocab, prefix = build_t5_corpus(tmp_path / "t5", documents=20)
    tok = BertTokenizer(vocab, do_lower_case=True, **SPECIAL)
    ds = LiBaiT5Dataset(tokenizer=tok, data_prefix=prefix, masked_lm_prob=0.3, max_seq_length=32)
    assert ds.name == "t5"
    with pytest.raises(ValueError, match="LiBaiT5Dataset 't5': mask_lm_prob"):
        LiBaiT5Dataset(tokenizer=tok, data_prefix=prefix, masked_lm_prob=1.5)
    part = ds.for_split("t5/train", ds.indexed_dataset, np.arange(10), None)
    assert (part.mask_lm_prob, part.max_seq_length, part.max_seq_length_dec) == (0.3, 32, 128)


# ---- GPT -----------------------------------------------------------------------------------
def test_gpt_epochs_count_the_one_token_overlap(tmp_path):
    """Megatron: ``e`` epochs of ``T`` tokens give ``(e * T - 1) // seq`` samples (samples
    share one token). One 10-token document, seq 5: one epoch gives 1 sample, so 2 samples
    need 2 epochs; the samples are tokens [0, 5] and [5, 10] of the doubled stream."""
    for tokens, seq, n in ((10, 5, 2), (10, 5, 1), (11, 5, 2), (12, 5, 5), (7, 3, 4)):
        epochs = 1
        while (epochs * tokens - 1) // seq < n:
            epochs += 1
        assert _num_epochs(tokens, seq, n) == epochs
    prefix = write_sentences(tmp_path / "gpt", [[list(range(10, 20))]])
    ds = GPT2Dataset("g", None, prefix, max_seq_length=5, num_samples=2)
    stream = list(range(10, 20)) * 2
    expected = sorted(stream[5 * k : 5 * k + 6] for k in range(2))
    got = sorted(ds[i]["input_ids"].tolist() + ds[i]["labels"][-1:].tolist() for i in range(2))
    assert len(ds) == 2 and got == expected


def test_fleetx_gpt_dataset_reads_the_data_impl_it_is_given(tmp_path):
    """``GPTDataset(data_impl="lazy")`` opens Megatron's legacy ``TNTIDX`` files (which the
    mmap reader refuses): one 13-token document, seq 4 -> samples [0, 4], [4, 8], [8, 12]."""
    prefix = str(tmp_path / "legacy")
    builder = make_builder(prefix + ".bin", impl="lazy")
    builder.add_item(np.arange(13))
    builder.end_document()
    builder.finalize(prefix + ".idx")
    ds = GPTDataset(data_prefix=prefix, split=[1, 0, 0], max_seq_length=4, data_impl="lazy")
    got = sorted(ds[i]["input_ids"].tolist() + ds[i]["labels"][-1:].tolist() for i in range(3))
    assert len(ds) == 3 and got == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9, 10, 11, 12]]


# ---- GLUE ----------------------------------------------------------------------------------
class WordTokenizer:
    """Whitespace words -> ids from a fixed table; eos 0 pads."""

    eos_token_id = 0
    vocab = {w: i for i, w in enumerate("w1 w2 w3 w4 w5 w6 w7 p1 p2 p3 h1 h2".split(), 1)}

    def encode(self, text: str) -> list[int]:
        return [self.vocab[w] for w in text.split()]


def test_glue_single_and_pair_tasks_and_unlabeled_test_split(tmp_path):
    """GLUE's files as FleetX reads them: header skipped; SST-2 text in column 0 and label
    in 1, its test file text in column 1 and no label; RTE's pair in columns 1-2, label
    names in 3. Tokens right-padded with eos to max_length; a pair is trimmed one token at
    a time from the longer text."""
    (tmp_path / "train.tsv").write_text("sentence\tlabel\nw1 w2\t1\nw3 w4 w5 w6 w7\t0\n")
    (tmp_path / "test.tsv").write_text("index\tsentence\n0\tw2 w1 w3\n")
    rte = tmp_path / "rte"
    rte.mkdir()
    (rte / "dev.tsv").write_text(
        "index\tsentence1\tsentence2\tlabel\n0\tp1 p2 p3\th1 h2\tnot_entailment\n"
    )
    tok = WordTokenizer()
    w = tok.vocab
    sst2 = glue_dataset_class("SST2")
    train = sst2(str(tmp_path), "train", max_length=4, tokenizer=tok)
    assert len(train) == 2
    assert train[0]["input_ids"].tolist() == [w["w1"], w["w2"], 0, 0]
    assert train[0]["labels"].item() == 1 and train[0]["labels"].dtype == torch.long
    assert train[1]["input_ids"].tolist() == [w["w3"], w["w4"], w["w5"], w["w6"]]
    assert train[1]["labels"].item() == 0
    test = sst2(str(tmp_path), "test", max_length=4, tokenizer=tok)
    assert set(test[0]) == {"input_ids"}
    assert test[0]["input_ids"].tolist() == [w["w2"], w["w1"], w["w3"], 0]

    dev = glue_dataset_class("RTE")(str(rte), "dev", max_length=4, tokenizer=tok)
    ids = [tok.vocab[x] for x in ("p1", "p2", "h1", "h2")]
    assert dev[0]["input_ids"].tolist() == ids and dev[0]["labels"].item() == 1


# ---- SFT -----------------------------------------------------------------------------------
class SFTWords:
    """Whitespace words -> fixed ids; ``eos`` 1, ``pad`` 0 and a ``bos`` attribute only (no
    ``bos_token_id``)."""

    eos, pad, bos = 1, 0, 2
    ids = {"Q": 10, "add": 11, "A": 12, "five": 13}

    def encode(self, text: str):
        return [self.ids[w] for w in text.split()]


class SFTWordsU16(SFTWords):
    """The same ids, returned as a uint16 array (a compact tokenizer output)."""

    def encode(self, text: str):
        return np.asarray(super().encode(text), dtype=np.uint16)


def _sft_file(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"instruction": "add", "output": "five"}) + "\n")
    return path


def test_sft_add_bos_reads_tokenizer_bos_and_masks_the_prompt(tmp_path):
    """``add_bos=True`` puts ``tokenizer.bos`` before the prompt: ``[bos] Q add A | five
    [eos]`` with labels -100 on ``[bos]`` and the prompt, the response and eos learned, then
    padding (pad id, label -100, attention 0)."""
    ds = SFTDataset(
        _sft_file(tmp_path),
        SFTWords(),
        max_seq_length=8,
        prompt_template_no_input="Q {instruction} A",
        add_bos=True,
    )
    s = ds[0]
    assert s["input_ids"].tolist() == [2, 10, 11, 12, 13, 1, 0, 0]
    assert s["labels"].tolist() == [IGNORE] * 4 + [13, 1] + [IGNORE] * 2
    assert s["attention_mask"].tolist() == [1] * 6 + [0] * 2


def test_sft_prompt_labels_with_narrow_token_dtype(tmp_path):
    """A tokenizer returning uint16 ids: the prompt's labels are still -100 (not wrapped)
    and the ids unchanged: ``Q add A five`` -> labels ``-100 x3, five``."""
    ds = SFTDataset(
        _sft_file(tmp_path),
        SFTWordsU16(),
        max_seq_length=6,
        prompt_template_no_input="Q {instruction} A",
        add_eos=False,
    )
    s = ds[0]
    assert s["input_ids"].tolist() == [10, 11, 12, 13, 0, 0]
    assert s["labels"].tolist() == [IGNORE] * 3 + [13, IGNORE, IGNORE]
