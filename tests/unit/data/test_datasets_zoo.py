"""BERT / RoBERTa / T5 pretraining datasets, SFT records, image folders, their loaders and
data configs. Tiny vocabularies are trained here with `tokenizers`; indexed datasets are
written with MMapIndexedDatasetBuilder into tmp dirs."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from zoo_data import write_sentences

from libai import dist
from libai.config import LazyCall, LazyConfig, instantiate
from libai.data import (
    BertDataset,
    ImageFolderDataset,
    RobertaDataset,
    SFTDataset,
    T5Dataset,
    build_image_test_loader,
    build_image_train_loader,
    build_nlp_train_loader,
    build_nlp_train_val_test_loader,
    build_train_valid_test_datasets,
    get_indexed_dataset,
)
from libai.data.datasets.t5_dataset import (
    random_spans_noise_mask,
    resolve_sentinel_ids,
    t5_input_target_lengths,
)
from libai.data.transforms import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ToTensor,
    build_image_transform,
)

REPO = Path(__file__).resolve().parents[3]
IGNORE = -100

_WORDS = (
    "the quick brown fox jumps over a lazy dog while model training reads language data "
    "from many documents and every sentence ends here attention layers learn to predict"
).split()
_rng = random.Random(0)
SENTENCES = [
    " ".join(_rng.choice(_WORDS) for _ in range(_rng.randint(4, 14))) + "." for _ in range(120)
]


@pytest.fixture(scope="module", autouse=True)
def single_process_mesh():
    dist.setup_dist_util({})


# ---- tokenizers and corpora -------------------------------------------------------------------
@dataclass
class MaskedLMIds:
    """The token ids a BERT / RoBERTa dataset reads from a tokenizer."""

    cls: int
    sep: int
    mask: int
    pad: int
    vocab_size: int


@dataclass
class T5Ids:
    eos: int
    pad: int
    vocab_size: int
    sentinel_ids: list = field(default_factory=list)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    """A tiny WordPiece trained on SENTENCES: (tokenizers.Tokenizer, vocab dir)."""
    from tokenizers import BertWordPieceTokenizer

    out = tmp_path_factory.mktemp("wordpiece")
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(
        SENTENCES,
        vocab_size=120,
        min_frequency=1,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False,
    )
    tok.save_model(str(out))
    return tok, out


@pytest.fixture(scope="module")
def bert_ids(wordpiece):
    tok = wordpiece[0]
    return MaskedLMIds(
        cls=tok.token_to_id("[CLS]"),
        sep=tok.token_to_id("[SEP]"),
        mask=tok.token_to_id("[MASK]"),
        pad=tok.token_to_id("[PAD]"),
        vocab_size=tok.get_vocab_size(),
    )


def make_docs(tok, num_docs: int, seed: int, min_sent: int = 2, max_sent: int = 7):
    """Documents as lists of sentences (lists of token ids of SENTENCES)."""
    rng = random.Random(seed)
    encoded = [tok.encode(s, add_special_tokens=False).ids for s in SENTENCES]
    return [
        [rng.choice(encoded) for _ in range(rng.randint(min_sent, max_sent))]
        for _ in range(num_docs)
    ]


@pytest.fixture(scope="module")
def bert_corpus(wordpiece, tmp_path_factory):
    docs = make_docs(wordpiece[0], 80, seed=1) + [[[5, 6, 7]]]  # + a one-sentence document
    prefix = write_sentences(tmp_path_factory.mktemp("bert") / "corpus_text_sentence", docs)
    return docs, prefix, get_indexed_dataset(prefix)


def find(haystack: list, needle: list) -> int:
    """Start of ``needle`` in ``haystack`` (-1 if absent)."""
    n = len(needle)
    for i in range(len(haystack) - n + 1):
        if haystack[i : i + n] == needle:
            return i
    return -1


def unmasked(sample) -> torch.Tensor:
    """The input with the original token put back at every predicted position."""
    labels = sample["lm_labels"]
    return torch.where(labels != IGNORE, labels, sample["input_ids"])


def check_masked_lm_padding(sample, seq: int, pad: int) -> int:
    """Shapes, dtypes and the padding contract; returns the number of real tokens."""
    for key in ("input_ids", "attention_mask", "tokentype_ids", "lm_labels", "loss_mask"):
        assert sample[key].shape == (seq,) and sample[key].dtype == torch.long, key
    n = int(sample["attention_mask"].sum())
    assert sample["attention_mask"][:n].eq(1).all() and sample["attention_mask"][n:].eq(0).all()
    assert sample["input_ids"][n:].eq(pad).all() and sample["lm_labels"][n:].eq(IGNORE).all()
    assert torch.equal(sample["loss_mask"], (sample["lm_labels"] != IGNORE).long())
    return n


# ---- BERT ---------------------------------------------------------------------------------------
def test_bert_sample_layout_nsp_and_masking(bert_corpus, bert_ids):
    docs, _, indexed = bert_corpus
    ds = BertDataset("bert", bert_ids, indexed_dataset=indexed, max_seq_length=48, seed=3)
    assert ds.samples_mapping[:, 1].max() <= len(indexed) - 1  # the 1-sentence doc is skipped
    masked = real = kept = replaced_by_mask = 0
    labels = []
    for i in range(len(ds)):
        s = ds[i]
        assert set(s) == {
            "input_ids",
            "attention_mask",
            "tokentype_ids",
            "lm_labels",
            "loss_mask",
            "ns_labels",
        }
        n = check_masked_lm_padding(s, 48, bert_ids.pad)
        assert s["ns_labels"].shape == () and s["ns_labels"].dtype == torch.long
        tt = s["tokentype_ids"]
        len_a = int((tt[:n] == 0).sum()) - 2  # [CLS] A [SEP]
        assert tt[: len_a + 2].eq(0).all() and tt[len_a + 2 : n].eq(1).all() and tt[n:].eq(0).all()
        orig = unmasked(s).tolist()
        assert orig[0] == bert_ids.cls and orig[len_a + 1] == bert_ids.sep
        assert orig[n - 1] == bert_ids.sep and n - len_a - 3 >= 1
        # no loss on [CLS] / [SEP]; they are never corrupted
        assert s["loss_mask"][[0, len_a + 1, n - 1]].eq(0).all()
        specials = [bert_ids.cls, bert_ids.sep, bert_ids.sep]
        assert s["input_ids"][[0, len_a + 1, n - 1]].tolist() == specials
        # A and B are (trimmed) runs of this sample's sentences; ns_labels 1 = swapped order
        first, last, _ = ds.samples_mapping[i]
        sentences = [indexed.get(int(k)).tolist() for k in range(first, last)]
        a, b = orig[1 : len_a + 1], orig[len_a + 2 : n - 1]
        label = int(s["ns_labels"])
        labels.append(label)
        head, tail = (a, b) if label == 0 else (b, a)
        assert any(  # head is cut from the first k sentences, tail from the rest
            find(sum(sentences[:k], []), head) >= 0 and find(sum(sentences[k:], []), tail) >= 0
            for k in range(1, len(sentences))
        )
        lm = s["loss_mask"].bool()
        masked += int(lm.sum())
        real += n - 3
        replaced_by_mask += int((s["input_ids"][lm] == bert_ids.mask).sum())
        kept += int((s["input_ids"][lm] == s["lm_labels"][lm]).sum())
    assert 0.13 < masked / real < 0.17, masked / real
    assert 0.74 < replaced_by_mask / masked < 0.86
    assert 0.05 < kept / masked < 0.16  # 10% unchanged (+ random draws of the same id)
    assert 0.35 < np.mean(labels) < 0.65 and set(labels) == {0, 1}


def test_bert_is_seeded_epochs_and_no_binary_head(bert_corpus, bert_ids):
    _, _, indexed = bert_corpus
    kw = dict(indexed_dataset=indexed, max_seq_length=48)
    a = BertDataset("a", bert_ids, **kw, seed=5, num_samples=300)
    b = BertDataset("b", bert_ids, **kw, seed=5, max_num_samples=300)
    c = BertDataset("c", bert_ids, **kw, seed=6, num_samples=300)
    assert len(a) == 300 > len(BertDataset("one", bert_ids, **kw, seed=5))  # > 1 epoch
    for i in (0, 17, 299):
        assert all(torch.equal(a[i][k], b[i][k]) for k in a[i])
        assert all(torch.equal(a[i][k], a[i][k]) for k in a[i])  # re-reading gives the same
    assert any(not torch.equal(a[i]["input_ids"], c[i]["input_ids"]) for i in range(10))

    single = BertDataset("s", bert_ids, **kw, seed=5, binary_head=False)
    s = single[0]
    assert "ns_labels" not in s and s["tokentype_ids"].eq(0).all()
    n = check_masked_lm_padding(s, 48, bert_ids.pad)
    orig = unmasked(s).tolist()
    assert orig[0] == bert_ids.cls and orig[n - 1] == bert_ids.sep
    assert bert_ids.sep not in orig[1 : n - 1]
    # binary_head=False also uses single-sentence documents
    assert single.samples_mapping[:, 1].max() == len(indexed)


def test_bert_errors(bert_corpus, bert_ids, tmp_path):
    _, _, indexed = bert_corpus
    no_mask = MaskedLMIds(1, 2, None, 0, 100)
    with pytest.raises(ValueError, match="has no `mask` token id"):
        BertDataset("x", no_mask, indexed_dataset=indexed)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        BertDataset("x", None, indexed_dataset=indexed)
    with pytest.raises(ValueError, match="max_seq_length must be >= 5"):
        BertDataset("x", bert_ids, indexed_dataset=indexed, max_seq_length=4)
    # one sequence per document (no --split-sentences): no sentence pairs
    prefix = write_sentences(tmp_path / "docs", [[[1, 2, 3, 4]] for _ in range(5)])
    ds = BertDataset("flat", bert_ids, data_prefix=prefix, max_seq_length=16)
    with pytest.raises(ValueError, match="--split-sentences"):
        len(ds)
    with pytest.raises(ValueError, match=r"document indices must be in \[0, 5\)"):
        BertDataset("x", bert_ids, data_prefix=prefix, documents=[7])


def test_bert_loaders_split_by_document(bert_corpus, bert_ids):
    docs, prefix, indexed = bert_corpus
    cfg = LazyCall(BertDataset)(
        name="bert",
        tokenizer=LazyCall(MaskedLMIds)(**asdict(bert_ids)),  # (a dataclass would become a dict)
        data_prefix=prefix,
        indexed_dataset=LazyCall(get_indexed_dataset)(data_prefix=prefix, skip_warmup=True),
        max_seq_length=32,
        seed=1,
    )
    train, valid, test = build_train_valid_test_datasets([cfg], [[8.0, 2.0, 0.0]], [1.0], None)
    n_docs = len(docs)
    assert len(indexed.doc_idx) - 1 == n_docs and len(indexed) > n_docs
    assert train.documents.tolist() == list(range(65)) and test is None
    assert valid.documents.tolist() == list(range(65, n_docs)) and valid.name == "bert/valid"
    first_valid_sentence = int(indexed.doc_idx[65])
    assert train.samples_mapping[:, 1].max() <= first_valid_sentence
    assert valid.samples_mapping[:, 0].min() >= first_valid_sentence

    loaders = build_nlp_train_val_test_loader(
        dataset=[cfg],
        splits=[[8.0, 2.0, 0.0]],
        weights=[1.0],
        train_val_test_num_samples=[64, 8, 0],
        train_batch_size=4,
        test_batch_size=2,
    )
    batch = next(iter(loaders[0]))
    assert batch["input_ids"].shape == (4, 32) and batch["ns_labels"].shape == (4,)
    assert len(loaders[0].dataset) == 64 and len(loaders[1].dataset) == 8 and loaders[2] is None
    # datasets built first (a fully recursive instantiate, as the trainer does) split alike
    built = instantiate(cfg)
    again = build_train_valid_test_datasets([built], [[8.0, 2.0, 0.0]], [1.0], [64, 8, 0])
    assert np.array_equal(again[0].samples_mapping, loaders[0].dataset.samples_mapping)
    assert torch.equal(again[1][3]["input_ids"], loaders[1].dataset[3]["input_ids"])


# ---- RoBERTa --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def roberta_ids(bert_ids):
    # RoBERTa's roles on the same vocabulary: <s> = cls, </s> = sep
    return bert_ids


def test_roberta_full_sentence_packing_and_masking(bert_corpus, roberta_ids):
    docs, _, indexed = bert_corpus
    seq = 40
    ds = RobertaDataset("roberta", roberta_ids, indexed_dataset=indexed, max_seq_length=seq)
    # one epoch covers every sentence exactly once, in runs of whole sentences
    covered = np.concatenate([ds.stream[a:b] for a, b in ds.samples_mapping])
    assert sorted(covered.tolist()) == list(range(len(indexed)))
    masked = real = crossing = 0
    for i in range(len(ds)):
        s = ds[i]
        assert set(s) == {"input_ids", "attention_mask", "tokentype_ids", "lm_labels", "loss_mask"}
        n = check_masked_lm_padding(s, seq, roberta_ids.pad)
        assert s["tokentype_ids"].eq(0).all()
        segments = ds.get_segments(i)
        expected = [roberta_ids.cls]
        for seg in segments:
            expected += seg.tolist() + [roberta_ids.sep]
        assert unmasked(s)[:n].tolist() == expected
        crossing += len(segments) > 1
        masked += int(s["loss_mask"].sum())
        real += n - 1 - len(segments)
        specials = [0] + list(np.cumsum([len(g) + 1 for g in segments]))
        assert s["loss_mask"][specials].eq(0).all()
    assert crossing > len(ds) // 10  # packing crosses document boundaries
    assert 0.13 < masked / real < 0.17, masked / real
    # packing is tight: a run is closed only when the next sentence does not fit
    sizes = np.asarray(indexed.sizes)
    starts = set(ds.samples_mapping[:, 0].tolist())
    for start, end in ds.samples_mapping:
        if end in starts:
            cost = (
                1
                + int(sizes[ds.stream[start:end]].sum())
                + int(ds.stream_new_doc[start + 1 : end].sum() + 1)
            )
            nxt = int(sizes[ds.stream[end]]) + int(ds.stream_new_doc[end])
            assert cost <= seq < cost + nxt


def test_roberta_seeded_and_new_masks_each_epoch(bert_corpus, roberta_ids):
    _, _, indexed = bert_corpus
    a = RobertaDataset("a", roberta_ids, indexed_dataset=indexed, max_seq_length=40, seed=2)
    b = RobertaDataset("b", roberta_ids, indexed_dataset=indexed, max_seq_length=40, seed=2)
    c = RobertaDataset("c", roberta_ids, indexed_dataset=indexed, max_seq_length=40, seed=9)
    assert torch.equal(a[4]["input_ids"], b[4]["input_ids"])
    assert any(not torch.equal(a[i]["input_ids"], c[i]["input_ids"]) for i in range(5))
    one_epoch = len(a)
    two = RobertaDataset(
        "two", roberta_ids, indexed_dataset=indexed, max_seq_length=40, num_samples=2 * one_epoch
    )
    assert len(two) == 2 * one_epoch
    # the second epoch packs the documents in a new order (so its samples and masks are new)
    assert not np.array_equal(two.stream[: len(indexed)], two.stream[len(indexed) :])
    # an over-long sentence is cut to fit
    long = RobertaDataset("long", roberta_ids, indexed_dataset=indexed, max_seq_length=8)
    for i in range(len(long)):
        assert int(long[i]["attention_mask"].sum()) <= 8


# ---- T5 -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def t5_ids():
    # sentinels above the data ids, <extra_id_0> highest (T5's order)
    return T5Ids(eos=1, pad=0, vocab_size=1100, sentinel_ids=list(range(1099, 999, -1)))


@pytest.fixture(scope="module")
def t5_corpus(tmp_path_factory):
    rng = np.random.RandomState(0)
    docs = [
        [rng.randint(2, 900, size=rng.randint(3, 20)).tolist() for _ in range(rng.randint(1, 5))]
        for _ in range(60)
    ]
    prefix = write_sentences(tmp_path_factory.mktemp("t5") / "corpus", docs)
    return docs, get_indexed_dataset(prefix)


def split_on_sentinels(ids: list, sentinels: set) -> tuple[list, list]:
    """(sentinels in order, the runs of tokens after each sentinel / before the first)."""
    order, runs = [], [[]]
    for t in ids:
        if t in sentinels:
            order.append(t)
            runs.append([])
        else:
            runs[-1].append(t)
    return order, runs


def test_t5_span_corruption_reconstructs_the_text(t5_corpus, t5_ids):
    docs, indexed = t5_corpus
    enc_len, dec_len = 48, 16
    ds = T5Dataset(
        "t5",
        t5_ids,
        indexed_dataset=indexed,
        max_seq_length=enc_len,
        max_seq_length_dec=dec_len,
        seed=4,
    )
    tokens_length, inputs_length, targets_length = t5_input_target_lengths(enc_len, 0.15, 3.0)
    assert ds.tokens_length == tokens_length and inputs_length <= enc_len
    assert targets_length <= dec_len
    sentinels = set(t5_ids.sentinel_ids)
    # chunks are consecutive pieces of the shuffled documents laid end to end
    stream = np.concatenate([np.concatenate(docs[d]) for d in ds.doc_order])
    noise_total = 0
    for i in range(len(ds)):
        s = ds[i]
        assert set(s) == {
            "encoder_input_ids",
            "decoder_input_ids",
            "encoder_attn_mask",
            "decoder_attn_mask",
            "lm_labels",
            "loss_mask",
        }
        for key in ("encoder_input_ids", "encoder_attn_mask"):
            assert s[key].shape == (enc_len,) and s[key].dtype == torch.long
        for key in ("decoder_input_ids", "decoder_attn_mask", "lm_labels", "loss_mask"):
            assert s[key].shape == (dec_len,) and s[key].dtype == torch.long
        j = int(ds.samples_mapping[i])
        original = ds.get_tokens(i).tolist()
        assert original == stream[j * tokens_length : (j + 1) * tokens_length].tolist()

        n_enc = int(s["encoder_attn_mask"].sum())
        n_dec = int(s["decoder_attn_mask"].sum())
        assert n_enc == inputs_length and n_dec == targets_length
        enc = s["encoder_input_ids"].tolist()
        labels = s["lm_labels"].tolist()
        assert enc[n_enc - 1] == t5_ids.eos and set(enc[n_enc:]) <= {t5_ids.pad}
        assert labels[n_dec - 1] == t5_ids.eos and set(labels[n_dec:]) <= {IGNORE}
        assert s["loss_mask"].tolist() == [1] * n_dec + [0] * (dec_len - n_dec)
        assert s["decoder_input_ids"].tolist() == [t5_ids.pad] + labels[: n_dec - 1] + [
            t5_ids.pad
        ] * (dec_len - n_dec)
        # the same sentinels, in order <extra_id_0>, <extra_id_1>, ..., in both
        enc_order, kept = split_on_sentinels(enc[: n_enc - 1], sentinels)
        dec_order, spans = split_on_sentinels(labels[: n_dec - 1], sentinels)
        assert enc_order == dec_order == t5_ids.sentinel_ids[: len(enc_order)]
        assert labels[0] == t5_ids.sentinel_ids[0] and spans[0] == []
        # fill each sentinel of the encoder input with its span: the original text
        rebuilt = kept[0]
        for k in range(len(enc_order)):
            rebuilt = rebuilt + spans[k + 1] + kept[k + 1]
        assert rebuilt == original
        noise_total += sum(len(sp) for sp in spans)
    assert noise_total / (len(ds) * tokens_length) == pytest.approx(0.15, abs=0.01)
    # seeded
    again = T5Dataset(
        "t5",
        t5_ids,
        indexed_dataset=indexed,
        max_seq_length=enc_len,
        max_seq_length_dec=dec_len,
        seed=4,
    )
    assert torch.equal(again[3]["encoder_input_ids"], ds[3]["encoder_input_ids"])


def test_t5_noise_mask_statistics():
    rng = np.random.default_rng(0)
    masks = [random_spans_noise_mask(200, 0.15, 3.0, rng) for _ in range(50)]
    for m in masks:
        assert m.sum() == 30 and not m[0] and m[-1]  # kept text first, noise last
        starts = m & ~np.concatenate([[False], m[:-1]])
        assert starts.sum() == 10  # 30 noise tokens / mean span 3
    assert any(not np.array_equal(masks[0], m) for m in masks[1:])


def test_t5_sentinel_sources_and_errors(t5_corpus, t5_ids):
    _, indexed = t5_corpus

    @dataclass
    class HFStyle:
        eos: int = 1
        pad: int = 0
        additional_special_tokens: tuple = ("<extra_id_1>", "<x>", "<extra_id_0>")
        additional_special_tokens_ids: tuple = (998, 5, 999)

    assert resolve_sentinel_ids(HFStyle()) == [999, 998]
    by_index = resolve_sentinel_ids(None, lambda k: 500 - k)  # a callable is kept as given
    assert [by_index(k) for k in range(3)] == [500, 499, 498]
    assert resolve_sentinel_ids(HFStyle(), [7, 8]) == [7, 8]  # the dataset's own list wins
    ds = T5Dataset(
        "t",
        t5_ids,
        indexed_dataset=indexed,
        max_seq_length=24,
        max_seq_length_dec=16,
        sentinel_ids=lambda k: 2000 + k,
    )
    assert ds.sentinel_ids.tolist() == [2000 + k for k in range(ds.num_spans)]
    with pytest.raises(ValueError, match="only 2 sentinel ids"):
        T5Dataset("t", HFStyle(), indexed_dataset=indexed, max_seq_length=48)
    with pytest.raises(ValueError, match="no sentinel ids"):
        T5Dataset("t", T5Ids(1, 0, 10, None), indexed_dataset=indexed, max_seq_length=48)
    with pytest.raises(ValueError, match="set max_seq_length_dec >= 22"):
        T5Dataset("t", t5_ids, indexed_dataset=indexed, max_seq_length=96, max_seq_length_dec=8)
    with pytest.raises(ValueError, match="not enough for one chunk"):
        len(
            T5Dataset(
                "t",
                t5_ids,
                indexed_dataset=indexed,
                max_seq_length=4096,
                max_seq_length_dec=1024,
                sentinel_ids=lambda k: 5000 + k,
            )
        )


def test_t5_loader(t5_corpus, t5_ids):
    _, indexed = t5_corpus
    cfg = LazyCall(T5Dataset)(
        name="t5",
        tokenizer=LazyCall(T5Ids)(**asdict(t5_ids)),
        indexed_dataset=indexed,
        max_seq_length=32,
        max_seq_length_dec=16,
    )
    train, valid, _ = build_nlp_train_val_test_loader(
        dataset=[cfg],
        splits=[[9.0, 1.0, 0.0]],
        weights=[1.0],
        train_val_test_num_samples=[40, 4, 0],
        train_batch_size=4,
    )
    batch = next(iter(train))
    assert batch["encoder_input_ids"].shape == (4, 32) and batch["lm_labels"].shape == (4, 16)
    assert len(valid.dataset) == 4 and set(valid.dataset.documents.tolist()) == set(range(54, 60))


# ---- SFT ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_tokenizer(tmp_path_factory):
    from bpe_helpers import train_tiny_bpe

    from libai.tokenizer import GPT2Tokenizer

    return GPT2Tokenizer(*train_tiny_bpe(tmp_path_factory.mktemp("bpe")))


def write_jsonl(path, rows) -> str:
    with open(path, "w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def test_sft_prompt_masking_is_exact(tmp_path, gpt_tokenizer):
    tok = gpt_tokenizer
    rows = [
        {"instruction": "Say hello.", "input": "", "output": "hello world"},
        {"prompt": "Greet", "input": "Bob", "response": "hello Bob!"},
        {"instruction": "Long one.", "output": "def hello(world): return world " * 60},
    ]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    seq = 256
    ds = SFTDataset(path, tok, max_seq_length=seq)
    assert len(ds) == 3
    eos = tok.eos
    for i, (prompt, response) in enumerate(
        [
            (ds.prompt_template_no_input.format(instruction="Say hello."), "hello world"),
            (ds.prompt_template.format(instruction="Greet", input="Bob"), "hello Bob!"),
        ]
    ):
        assert "### Response:" in prompt
        p, r = tok.encode(prompt), tok.encode(response) + [eos]
        s = ds[i]
        assert set(s) == {"input_ids", "attention_mask", "labels"}
        assert all(v.shape == (seq,) and v.dtype == torch.long for v in s.values())
        n = len(p) + len(r)
        assert n <= seq
        assert s["input_ids"][:n].tolist() == p + r
        assert s["labels"].tolist() == [IGNORE] * len(p) + r + [IGNORE] * (seq - n)
        assert s["attention_mask"].tolist() == [1] * n + [0] * (seq - n)
        assert s["input_ids"][n:].eq(eos).all()  # GPT-2 has no pad: padded with eos
    long = ds[2]  # cut at max_seq_length: all real, the response part learned
    assert long["attention_mask"].all() and (long["labels"] != IGNORE).sum() > 0
    assert long["labels"][-1] != IGNORE

    custom = SFTDataset(
        write_jsonl(tmp_path / "c.jsonl", [{"q": "Hi", "a": "hello"}]),
        tok,
        max_seq_length=16,
        prompt_template="Q: {instruction}\nA: ",
        prompt_template_no_input=None,
        instruction_key="q",
        output_key="a",
        add_eos=False,
    )
    p = tok.encode("Q: Hi\nA: ")
    assert custom[0]["labels"].tolist()[: len(p) + 1] == [IGNORE] * len(p) + tok.encode("hello")[:1]


def test_sft_bad_input(tmp_path, gpt_tokenizer):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl does not exist"):
        SFTDataset(missing, gpt_tokenizer)
    good = {"instruction": "a", "output": "b"}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, "", "{not json"])
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not valid JSON"):
        SFTDataset(path, gpt_tokenizer)
    path = write_jsonl(tmp_path / "field.jsonl", [good, {"instruction": "a", "answer": "b"}])
    with pytest.raises(ValueError, match=r"field\.jsonl:2: missing field 'output' or 'response'"):
        SFTDataset(path, gpt_tokenizer)
    path = write_jsonl(tmp_path / "type.jsonl", [{"instruction": 3, "output": "b"}])
    with pytest.raises(ValueError, match=r"type\.jsonl:1: field 'instruction' holds int"):
        SFTDataset(path, gpt_tokenizer)
    path = write_jsonl(tmp_path / "list.jsonl", [[1, 2]])
    with pytest.raises(ValueError, match="expected a JSON object"):
        SFTDataset(path, gpt_tokenizer)
    ok = write_jsonl(tmp_path / "ok.jsonl", [good])
    with pytest.raises(ValueError, match=r"unknown placeholders \['question'\]"):
        SFTDataset(ok, gpt_tokenizer, prompt_template="{question}")


def test_sft_train_loader_as_the_trainer_calls_it(tmp_path, gpt_tokenizer):
    rows = [{"instruction": f"Say {i}.", "output": "hello " * (i % 4 + 1)} for i in range(10)]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    cfg = LazyCall(build_nlp_train_loader)(
        dataset=[LazyCall(SFTDataset)(data_path=path, tokenizer=gpt_tokenizer, max_seq_length=32)],
        valid_dataset=LazyCall(SFTDataset)(
            data_path=path, tokenizer=gpt_tokenizer, max_seq_length=32
        ),
    )
    train, valid, test = instantiate(
        cfg,
        train_batch_size=4,
        test_batch_size=5,
        train_val_test_num_samples=[100, 10, 10],
        consumed_samples=0,
        seed=1,
    )
    batch = next(iter(train))
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 32) and test is None
    assert [b["input_ids"].shape[0] for b in valid] == [5, 5]


# ---- images ---------------------------------------------------------------------------------
COLORS = {"bird": (255, 0, 0), "cat": (0, 128, 255), "dog": (40, 200, 90)}


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    rng = np.random.RandomState(0)
    for name, color in COLORS.items():
        (root / name / "sub").mkdir(parents=True)
        for k, (w, h) in enumerate([(40, 30), (30, 52)]):
            Image.new("RGB", (w, h), color).save(root / name / f"solid{k}.png")
        noise = rng.randint(0, 256, size=(48, 64, 3)).astype(np.uint8)
        Image.fromarray(noise).save(root / name / "sub" / "noise.PNG")
        (root / name / "notes.txt").write_text("not an image")
    return root


def test_image_folder_labels_shapes_and_normalization(image_root):
    ds = ImageFolderDataset(image_root, train=False, image_size=32)
    assert ds.classes == ["bird", "cat", "dog"] and len(ds) == 9
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD).view(3, 1, 1)
    for i, (path, label) in enumerate(ds.samples):
        s = ds[i]
        assert set(s) == {"images", "labels"}
        assert s["images"].shape == (3, 32, 32) and s["images"].dtype == torch.float32
        assert s["labels"].shape == () and s["labels"].dtype == torch.long
        name = Path(path).relative_to(image_root).parts[0]
        assert int(s["labels"]) == ds.classes.index(name) == label
        assert s["images"].min() >= float(((0 - mean) / std).min()) - 1e-5
        assert s["images"].max() <= float(((1 - mean) / std).max()) + 1e-5
        if "solid" in path:
            expected = torch.tensor(COLORS[name], dtype=torch.float32).view(3, 1, 1) / 255 - mean
            assert torch.allclose(s["images"], (expected / std).expand(3, 32, 32), atol=1e-5)
    train = ImageFolderDataset(image_root, train=True, image_size=24, seed=7)
    assert train[2]["images"].shape == (3, 24, 24)


def test_image_augmentation_is_seeded_per_read(image_root):
    noise = [i for i, (p, _) in enumerate(ImageFolderDataset(image_root).samples) if "noise" in p]
    a = ImageFolderDataset(image_root, train=True, image_size=16, seed=1)
    b = ImageFolderDataset(image_root, train=True, image_size=16, seed=1)
    c = ImageFolderDataset(image_root, train=True, image_size=16, seed=2)
    i = noise[0]
    first = a[i]["images"]
    assert torch.equal(first, b[i]["images"])
    assert not torch.equal(first, a[i]["images"])  # the next read (epoch) is a new crop
    assert not torch.equal(first, c[i]["images"])
    eval_ds = ImageFolderDataset(image_root, train=False, image_size=16)
    assert torch.equal(eval_ds[i]["images"], eval_ds[i]["images"])


def test_transforms():
    rng = np.random.default_rng(0)
    crop = RandomResizedCrop(16)
    for _ in range(200):
        top, left, h, w = crop.get_params(100, 60, rng)
        assert 0 <= top <= 60 - h and 0 <= left <= 100 - w
        assert 0.08 * 6000 * 0.9 <= h * w <= 6000
        assert 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1
    image = Image.fromarray(np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3))
    flipped = RandomHorizontalFlip(p=1.0)(image, rng)
    assert np.array_equal(np.asarray(flipped), np.asarray(image)[:, ::-1])
    assert RandomHorizontalFlip(p=0.0)(image, rng) is image
    assert Resize(8)(image).size == (12, 8)  # shorter side 8, aspect kept
    assert CenterCrop(4)(Resize(8)(image)).size == (4, 4)
    t = ToTensor()(image)
    assert t.shape == (3, 4, 6) and t.dtype == torch.float32 and float(t.max()) <= 1.0
    assert t[:, 0, 1].tolist() == pytest.approx([3 / 255, 4 / 255, 5 / 255])
    pipeline = build_image_transform(train=False, image_size=16)
    assert [type(s).__name__ for s in pipeline.transforms] == [
        "Resize",
        "CenterCrop",
        "ToTensor",
        "Normalize",
    ]
    assert pipeline.transforms[0].size == 18  # int(16 / 0.875)
    assert Compose([lambda im: im.rotate(90, expand=True)])(image).size == (4, 6)


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ImageFolderDataset(tmp_path / "missing")
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "flat" / "x.png")
    with pytest.raises(ValueError, match="no class sub-folders"):
        ImageFolderDataset(tmp_path / "flat")
    (tmp_path / "empty" / "a").mkdir(parents=True)
    (tmp_path / "empty" / "a" / "readme.txt").write_text("x")
    with pytest.raises(ValueError, match="has no images"):
        ImageFolderDataset(tmp_path / "empty")
    (tmp_path / "empty" / "b").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "empty" / "b" / "x.jpg")
    with pytest.raises(ValueError, match=r"class folder\(s\) \['a'\]"):
        ImageFolderDataset(tmp_path / "empty")


def test_image_loaders_and_config(image_root):
    cfg = LazyConfig.load(str(REPO / "configs/common/data/imagenet.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            f"dataloader.train.dataset.0.root={image_root}",
            f"dataloader.train.valid_dataset.root={image_root}",
            f"dataloader.test.0.dataset.root={image_root}",
            "dataloader.train.dataset.0.image_size=32",
            "dataloader.train.valid_dataset.image_size=32",
            "dataloader.test.0.dataset.image_size=32",
            "dataloader.train.num_workers=0",
            "dataloader.test.0.num_workers=0",
        ],
    )
    train, valid, test = instantiate(  # as DefaultTrainer.build_train_loader calls it
        cfg.dataloader.train,
        train_batch_size=4,
        test_batch_size=3,
        train_val_test_num_samples=[100, 9, 9],
        consumed_samples=0,
        seed=0,
    )
    batch = next(iter(train))
    assert batch["images"].shape == (4, 3, 32, 32) and batch["labels"].shape == (4,)
    assert test is None and sum(len(b["labels"]) for b in valid) == 9
    test_loader = instantiate(cfg.dataloader.test[0], test_batch_size=5)
    labels = torch.cat([b["labels"] for b in test_loader])
    assert labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]

    def mixup(images, labels):
        return images.flip(0), torch.nn.functional.one_hot(labels, 3).float()

    ds = ImageFolderDataset(image_root, image_size=16)
    loader, _, _ = build_image_train_loader([ds], 2, mixup_func=mixup, seed=3)
    assert next(iter(loader))["labels"].shape == (2, 3)
    assert len(build_image_test_loader(ds, 4)) == 3


# ---- data configs with the real tokenizers ----------------------------------------------------
def test_bert_config_with_bert_tokenizer(wordpiece, bert_corpus):
    from libai.tokenizer import BertTokenizer

    _, vocab_dir = wordpiece
    _, prefix, _ = bert_corpus
    cfg = LazyConfig.load(str(REPO / "configs/common/data/bert_dataset.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            f"tokenization.tokenizer.vocab_file={vocab_dir / 'vocab.txt'}",
            f"dataloader.train.dataset.0.data_prefix={prefix}",
            "dataloader.train.dataset.0.max_seq_length=32",
            "dataloader.train.num_workers=0",
        ],
    )
    tokenizer = instantiate(cfg.tokenization.tokenizer)
    assert isinstance(tokenizer, BertTokenizer)
    train, valid, test = instantiate(
        cfg.dataloader.train,
        train_val_test_num_samples=[16, 4, 0],
        train_batch_size=2,
        test_batch_size=2,
    )
    batch = next(iter(train))
    assert batch["input_ids"].shape == (2, 32) and batch["input_ids"][:, 0].eq(tokenizer.cls).all()
    assert test is None
    assert len(valid.dataset) == 4 and len(list(valid)) == 2  # the 4 samples asked for


def test_roberta_and_t5_configs_with_their_tokenizers(tmp_path, bert_corpus):
    import sentencepiece as spm
    from tokenizers import ByteLevelBPETokenizer

    _, prefix, _ = bert_corpus
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        SENTENCES,
        vocab_size=300,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    bpe.save_model(str(tmp_path))
    cfg = LazyConfig.load(str(REPO / "configs/common/data/roberta_dataset.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            f"tokenization.tokenizer.vocab_file={tmp_path / 'vocab.json'}",
            f"tokenization.tokenizer.merges_file={tmp_path / 'merges.txt'}",
            f"dataloader.train.dataset.0.data_prefix={prefix}",
            "dataloader.train.dataset.0.max_seq_length=32",
            "dataloader.train.num_workers=0",
        ],
    )
    train, _, _ = instantiate(
        cfg.dataloader.train, train_val_test_num_samples=[8, 2, 0], train_batch_size=2
    )
    tok = instantiate(cfg.tokenization.tokenizer)
    assert next(iter(train))["input_ids"][:, 0].eq(tok.cls).all()

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES),
        model_prefix=str(tmp_path / "spiece"),
        model_type="unigram",
        vocab_size=60,
        hard_vocab_limit=False,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    cfg = LazyConfig.load(str(REPO / "configs/common/data/t5_dataset.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            f"tokenization.tokenizer.vocab_file={tmp_path / 'spiece.model'}",
            f"dataloader.train.dataset.0.data_prefix={prefix}",
            "dataloader.train.dataset.0.max_seq_length=32",
            "dataloader.train.dataset.0.max_seq_length_dec=16",
            "dataloader.train.num_workers=0",
        ],
    )
    tok = instantiate(cfg.tokenization.tokenizer)
    train, _, _ = instantiate(
        cfg.dataloader.train, train_val_test_num_samples=[8, 2, 0], train_batch_size=2
    )
    batch = next(iter(train))
    assert batch["lm_labels"][:, 0].eq(tok.sentinel_token_ids[0]).all()
    assert batch["decoder_input_ids"][:, 0].eq(tok.pad).all()


def test_sft_config_with_json_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        SENTENCES,
        trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "</s>", "<pad>"]),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    rows = [{"instruction": "Repeat.", "input": s, "output": s} for s in SENTENCES[:6]]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    cfg = LazyConfig.load(str(REPO / "configs/common/data/sft_dataset.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            f"tokenization.tokenizer.tokenizer_file={tmp_path / 'tokenizer.json'}",
            "tokenization.tokenizer.eos_token='</s>'",
            "tokenization.tokenizer.pad_token='<pad>'",
            f"dataloader.train.dataset.0.data_path={path}",
            "dataloader.train.dataset.0.max_seq_length=64",
        ],
    )
    train, _, _ = instantiate(
        cfg.dataloader.train, train_batch_size=3, train_val_test_num_samples=[30, 0, 0]
    )
    batch = next(iter(train))
    assert batch["input_ids"].shape == (3, 64)
    pad = tok.token_to_id("<pad>")
    assert batch["input_ids"][batch["attention_mask"] == 0].eq(pad).all()
    assert batch["labels"][batch["attention_mask"] == 0].eq(IGNORE).all()
