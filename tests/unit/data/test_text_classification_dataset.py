"""TextClassificationDataset: same ids / masks / type ids as transformers, labels, formats, errors.

Tiny WordPiece and byte-level BPE vocabularies are trained here, offline.
"""

from __future__ import annotations

import csv
import json
import pickle
import random

import pytest
import torch

from libai.data import TextClassificationDataset
from libai.inference.tokenizer_loading import PretrainedJsonTokenizer
from libai.tokenizer import BertTokenizer, RobertaTokenizer, T5Tokenizer

transformers = pytest.importorskip("transformers")

_WORDS = "the quick brown fox jumps over lazy dog hello world Paris café naïve running".split()
_rng = random.Random(0)
CORPUS = [" ".join(_rng.choice(_WORDS) for _ in range(10)) + "." for _ in range(200)]
# sentences of many lengths: pairs where neither, one or both must be cut, ties included
SENTENCES = [" ".join(_rng.choice(_WORDS) for _ in range(n)) for n in (1, 3, 5, 9, 9, 14, 30)]
SENTENCES += ["Hello, world! naïve café", "unknownzzz ж 你好"]
PAIRS = [(a, b) for a in SENTENCES for b in SENTENCES]
MAX_LEN = 16


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from tokenizers import BertWordPieceTokenizer

    out = tmp_path_factory.mktemp("bert")
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece.train_from_iterator(
        CORPUS, vocab_size=120, min_frequency=1, special_tokens=specials, show_progress=False
    )
    wordpiece.save_model(str(out))
    return out


@pytest.fixture(scope="module")
def roberta_files(tmp_path_factory):
    from tokenizers import ByteLevelBPETokenizer

    out = tmp_path_factory.mktemp("roberta")
    bpe = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator(
        CORPUS, vocab_size=300, min_frequency=2, special_tokens=specials, show_progress=False
    )
    bpe.save_model(str(out))
    return str(out / "vocab.json"), str(out / "merges.txt")


@pytest.fixture(scope="module")
def tokenizers(bert_dir, roberta_files):
    """``name -> (libai tokenizer, transformers tokenizer)`` on the same vocabulary files."""
    vocab = str(bert_dir / "vocab.txt")
    # transformers 5: `vocab=` / `merges=`; `vocab_file=` / `merges_file=` are silently ignored
    hf_bert = transformers.BertTokenizer(vocab=vocab)
    hf_roberta = transformers.RobertaTokenizer(vocab=roberta_files[0], merges=roberta_files[1])
    assert len(hf_bert) == len(BertTokenizer(vocab)) > 100  # the vocab really was read
    assert len(hf_roberta) == len(RobertaTokenizer(*roberta_files)) > 250
    hf_dir = bert_dir.parent / (bert_dir.name + "_hf")
    hf_bert.save_pretrained(hf_dir)  # tokenizer.json + tokenizer_config.json
    return {
        "bert": (BertTokenizer(vocab), hf_bert),
        "roberta": (RobertaTokenizer(*roberta_files), hf_roberta),
        "bert_json": (PretrainedJsonTokenizer(str(hf_dir)), hf_bert),
    }


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_table(path, rows, delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)
    return path


# ---- same tensors as transformers ------------------------------------------------------------
@pytest.mark.parametrize("name", ["bert", "roberta", "bert_json"])
@pytest.mark.parametrize("pair", [False, True])
def test_matches_transformers(tmp_path, tokenizers, name, pair):
    tok, hf = tokenizers[name]
    rows = PAIRS if pair else [(s,) for s in SENTENCES]
    columns = ["sentence1", "sentence2"][: len(rows[0])]
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{**dict(zip(columns, r)), "label": i % 3} for i, r in enumerate(rows)],
    )
    for max_len in (MAX_LEN - 1, MAX_LEN):  # odd and even room left for the texts
        ds = TextClassificationDataset(
            path, tok, text_columns=",".join(columns), max_seq_length=max_len
        )
        assert len(ds) == len(rows) and ds.num_labels == 3 and ds.label_map is None
        cut = 0
        for i, texts in enumerate(rows):
            want = hf(
                *texts,
                truncation=True,
                max_length=max_len,
                padding="max_length",
                return_token_type_ids=True,
            )
            sample = ds[i]
            assert sample["input_ids"].tolist() == want["input_ids"], texts
            assert sample["attention_mask"].tolist() == want["attention_mask"], texts
            assert sample["tokentype_ids"].tolist() == want["token_type_ids"], texts
            assert sample["labels"].item() == i % 3 and sample["labels"].dtype == torch.long
            assert all(v.shape == (max_len,) for k, v in sample.items() if k != "labels")
            cut += len(hf(*texts)["input_ids"]) > max_len
        assert cut > (20 if pair else 0)  # truncation was exercised (pairs: also equal lengths)
    ids = ds[len(rows) - 1]["input_ids"].tolist()
    if name == "roberta":  # <s> a </s></s> b </s>, all type ids 0
        assert ids[0] == tok.cls and (not pair or ids.count(tok.sep) == 3)
        assert not any(ds[i]["tokentype_ids"].any() for i in range(len(ds)))
    else:  # [CLS] a [SEP] b [SEP], type ids 0 then 1
        assert ids[0] == tok.cls and ids.count(tok.sep) == 1 + pair
        assert any(ds[i]["tokentype_ids"].any() for i in range(len(ds))) == pair


def test_pair_truncation_longest_first(tmp_path, tokenizers):
    """Equal lengths and an odd budget: the second text keeps the extra token (the
    `tokenizers` library's longest-first, which transformers 5 uses)."""
    tok, _ = tokenizers["bert"]
    first, second, short = (
        "the quick brown fox jumps over",
        "lazy dog hello world paris running",
        "x",
    )
    a, b, c = tok.encode(first), tok.encode(second), tok.encode(short)
    assert len(a) == len(b) == 6 and len(c) == 1
    rows = [{"a": first, "b": second, "label": 0}, {"a": short, "b": second, "label": 0}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)

    def ids(max_len, i=0):
        ds = TextClassificationDataset(path, tok, ("a", "b"), max_seq_length=max_len)
        return ds[i]["input_ids"].tolist()

    assert ids(8) == [tok.cls, *a[:2], tok.sep, *b[:3], tok.sep]  # room for 5: 2 + 3
    assert ids(12) == [tok.cls, *a[:4], tok.sep, *b[:5], tok.sep]  # room for 9: 4 + 5
    assert ids(7, 1) == [tok.cls, *c, tok.sep, *b[:3], tok.sep]  # only the longer one is cut


def test_tokenizer_left_untouched_and_pickles(tmp_path, tokenizers):
    tok, _ = tokenizers["bert"]
    path = write_jsonl(tmp_path / "d.jsonl", [{"sentence": SENTENCES[-3], "label": 1}])
    before = tok.encode(SENTENCES[-3], add_special_tokens=True)
    ds = TextClassificationDataset(path, tok, max_seq_length=8)
    assert tok.encode(SENTENCES[-3], add_special_tokens=True) == before  # not truncated/padded
    assert len(before) > 8 and ds[0]["attention_mask"].sum() == 8
    clone = pickle.loads(pickle.dumps(ds))
    assert all(torch.equal(clone[0][k], v) for k, v in ds[0].items())
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=1)))
    assert batch["input_ids"].shape == (1, 8) and batch["labels"].shape == (1,)


def test_sample_encoder_on_new_texts(tmp_path, tokenizers):
    """The dataset's ``encoder`` gives new texts (inference) exactly the samples' encoding."""
    from libai.data.datasets.text_classification import SampleEncoder

    tok, hf = tokenizers["bert"]
    rows = [{"a": a, "b": b, "label": 0} for a, b in PAIRS[:20]]
    ds = TextClassificationDataset(write_jsonl(tmp_path / "p.jsonl", rows), tok, "a,b", "label", 12)
    assert ds.encoder.pair and ds.encoder.max_seq_length == 12
    encoder = SampleEncoder(tok, 12, pair=True)
    for i, (a, b) in enumerate(PAIRS[:20]):
        got = encoder(a, b)
        assert all(torch.equal(got[k], ds[i][k]) for k in got), (a, b)
        want = hf(a, b, truncation=True, max_length=12, padding="max_length")
        assert got["input_ids"].tolist() == want["input_ids"]
    with pytest.raises(ValueError, match=r"takes two texts \(a pair\), got 1"):
        encoder("only one")
    with pytest.raises(ValueError, match="takes one text, got 2"):
        SampleEncoder(tok, 12)("a", "b")


def test_pad_id_without_a_pad_role(tmp_path, tokenizers):
    """A bare tokenizer.json (no pad role) pads as its own padding settings say, else with 0."""
    from tokenizers import Tokenizer

    from libai.tokenizer import JsonTokenizer

    roberta, _ = tokenizers["roberta"]
    backend = Tokenizer.from_str(roberta._tokenizer.to_str())
    backend.save(str(tmp_path / "plain.json"))
    backend.enable_padding(pad_id=roberta.pad, pad_token="<pad>")
    backend.save(str(tmp_path / "padded.json"))
    path = write_jsonl(tmp_path / "d.jsonl", [{"sentence": "hello", "label": 0}])
    for name, pad in (("plain", 0), ("padded", roberta.pad)):
        tok = JsonTokenizer(tmp_path / f"{name}.json")
        assert tok.pad_token_id is None
        sample = TextClassificationDataset(path, tok, max_seq_length=10)[0]
        n = int(sample["attention_mask"].sum())
        ids = roberta.encode("hello", add_special_tokens=True)
        assert sample["input_ids"].tolist() == ids + [pad] * (10 - len(ids)) and n == len(ids)


def test_built_from_a_config(tmp_path, bert_dir):
    from libai.config import LazyCall, instantiate

    path = write_table(tmp_path / "d.csv", [["a", "b", "y"], ["x", "y z", "no"], ["p", "q", "yes"]])
    cfg = LazyCall(TextClassificationDataset)(
        data_path=str(path),
        tokenizer=LazyCall(BertTokenizer)(vocab_file=str(bert_dir / "vocab.txt")),
        text_columns=["a", "b"],
        label_column="y",
        max_seq_length=12,
        label_map={"yes": 1, "no": 0},
    )
    ds = instantiate(cfg)
    assert ds.text_columns == ("a", "b") and ds.num_labels == 2 and ds.labels == [0, 1]


# ---- labels ------------------------------------------------------------------------------------
def labels_of(tmp_path, tokenizer, labels, **kwargs):
    rows = [["sentence", "label"]] + [[f"text {i}", v] for i, v in enumerate(labels)]
    ds = TextClassificationDataset(write_table(tmp_path / "l.csv", rows), tokenizer, **kwargs)
    return ds, [ds[i]["labels"] for i in range(len(ds))]


def test_labels(tmp_path, tokenizers):
    tok, _ = tokenizers["bert"]
    ds, out = labels_of(tmp_path, tok, ["neutral", "entailment", "contradiction", "neutral"])
    assert ds.label_map == {"contradiction": 0, "entailment": 1, "neutral": 2}
    assert ds.num_labels == 3 and [t.item() for t in out] == [2, 1, 0, 2]
    ds, out = labels_of(tmp_path, tok, ["0", "4", " 1 "])
    assert ds.label_map is None and ds.num_labels == 5 and [t.item() for t in out] == [0, 4, 1]
    assert all(t.dtype == torch.long for t in out)
    ds, out = labels_of(tmp_path, tok, ["3.800", "0", "5.0", "-1.5"])  # STS-B: regression
    assert ds.num_labels == 1 and ds.label_map is None
    assert [t.item() for t in out] == pytest.approx([3.8, 0.0, 5.0, -1.5])
    assert all(t.dtype == torch.float32 and t.dim() == 0 for t in out)
    explicit = {"entailment": 0, "not_entailment": 1}
    ds, out = labels_of(tmp_path, tok, ["not_entailment", "entailment"], label_map=explicit)
    assert ds.label_map == explicit and ds.num_labels == 2 and [t.item() for t in out] == [1, 0]
    ds, out = labels_of(tmp_path, tok, ["b", "c"], label_map=["c", "b", "a"])  # index = id
    assert ds.num_labels == 3 and [t.item() for t in out] == [1, 0]
    ds, out = labels_of(tmp_path, tok, ["1", "0"], label_map={0: 1, 1: 0})  # YAML int keys
    assert [t.item() for t in out] == [0, 1]
    # JSON labels keep their type: ints, floats, strings
    path = write_jsonl(
        tmp_path / "j.jsonl", [{"sentence": "a", "label": 0.5}, {"sentence": "b", "label": 2}]
    )
    ds = TextClassificationDataset(path, tok)
    assert ds.num_labels == 1 and ds[1]["labels"].item() == 2.0


# ---- formats -----------------------------------------------------------------------------------
def test_formats_agree(tmp_path, tokenizers):
    tok, _ = tokenizers["bert"]
    rows = [('Hello, "quoted" world', "b one", "yes"), ("x y", "tab-free, comma", "no")]
    header = ("premise", "hypothesis", "label")
    paths = {
        "csv": write_table(tmp_path / "d.csv", [header, *rows]),
        "json": write_jsonl(tmp_path / "d.jsonl", [dict(zip(header, r)) for r in rows]),
    }
    # GLUE TSVs: no quoting, a lone quote is text
    tsv = "\n".join("\t".join(r) for r in [header, *rows]) + "\n"
    (tmp_path / "d.tsv").write_text(tsv)
    paths["tsv"] = tmp_path / "d.tsv"
    (tmp_path / "d.txt").write_text(tsv.split("\n", 1)[1])  # headerless, named by position
    (tmp_path / "a.json").write_text(json.dumps([dict(zip(header, r)) for r in rows]))
    paths["array"] = tmp_path / "a.json"
    columns = ["premise", "hypothesis"]
    datasets = {
        k: TextClassificationDataset(p, tok, columns, max_seq_length=24) for k, p in paths.items()
    }
    datasets["headerless"] = TextClassificationDataset(
        tmp_path / "d.txt", tok, "0, 1", 2, 24, file_format="tsv", has_header=False
    )
    ref = datasets["csv"]
    assert ref.label_map == {"no": 0, "yes": 1} and ref.texts[0] == list(rows[0][:2])
    for name, ds in datasets.items():
        assert ds.texts == ref.texts and ds.labels == ref.labels, name
        assert all(torch.equal(ds[1][k], v) for k, v in ref[1].items()), name


# ---- errors ------------------------------------------------------------------------------------
CSV = "sentence,label\ngood,1\n"
ERRORS = [  # (file name, its text, constructor arguments, error, message)
    ("empty.csv", "", {}, ValueError, "empty.csv is empty"),
    ("head.csv", "sentence,label\n\n", {}, ValueError, "head.csv is empty"),
    ("blank.jsonl", "\n  \n", {}, ValueError, "blank.jsonl is empty"),
    ("d.parquet", "x", {}, ValueError, "unknown data format '.parquet'"),
    ("c.csv", CSV, {"text_columns": "text"}, ValueError,
     r"c.csv, row 1 \(line 2\): no column 'text'; the columns found are \['label', 'sentence'\]"),
    ("c.csv", CSV, {"label_column": "y"}, ValueError, r"no column 'y'; the columns found are"),
    ("c.jsonl", '{"s1": "a", "label": 0}\n', {"text_columns": "s1,s2"}, ValueError,
     r"c.jsonl, line 1: no column 's2'; the columns found are \['label', 's1'\]"),
    ("t.csv", CSV + ",0\n", {}, ValueError, r"t.csv, row 2 \(line 3\), column 'sentence': empty"),
    ("t.tsv", "sentence\tlabel\na\t1\n  \t0\n", {}, ValueError,
     r"t.tsv, row 2 \(line 3\), column 'sentence': empty"),
    ("p.jsonl", '{"s1": "a", "s2": "b", "label": 0}\n{"s1": "a", "s2": null, "label": 0}\n',
     {"text_columns": ("s1", "s2")}, ValueError, r"p.jsonl, line 2, column 's2': empty .*None"),
    ("nan.jsonl", '{"sentence": NaN, "label": 0}\n', {}, ValueError,
     r"nan.jsonl, line 1, column 'sentence': empty .*nan"),
    ("l.csv", CSV + "b, \n", {}, ValueError, r"l.csv, row 2 \(line 3\), column 'label': label ' '"),
    ("l.jsonl", '{"sentence": "a", "label": [1]}\n', {}, ValueError,
     r"l.jsonl, line 1, column 'label': label \[1\] is empty or not a string or number"),
    ("mix.csv", CSV + "b,1\nc,one\n", {}, ValueError,
     r"mix.csv, row 3 \(line 4\), column 'label': label 'one' is not a number like '1' "
     r"\(.*mix.csv, row 1 \(line 2\)\); give a label_map"),
    ("nanl.csv", "sentence,label\na,0.5\nb,nan\n", {}, ValueError,
     r"nanl.csv, row 2 .*label 'nan' is not a number like '0.5'"),
    ("m.csv", "sentence,label\na,pos\nb,neg\n", {"label_map": {"pos": 0}}, ValueError,
     r"m.csv, row 2 \(line 3\), column 'label': label 'neg' is not in label_map \['pos'\]"),
    ("m.csv", CSV, {"label_map": {"pos": "positive"}}, ValueError, "label_map must be a dict"),
    ("n.csv", "sentence,label\na,-1\n", {}, ValueError, r"n.csv, row 1 .*label '-1' is negative"),
    ("f.csv", "sentence,label\na,1,extra\n", {}, ValueError,
     r"f.csv, row 1 \(line 2\): 3 fields, but the header has 2"),
    ("bad.jsonl", '{"sentence": "a", "label": 0}\n{oops\n', {}, ValueError,
     r"bad.jsonl, line 2: not valid JSON"),
    ("arr.json", '[{"sentence": "a", "label": 0}, 3]', {}, ValueError,
     r"arr.json, record 2: expected a JSON object, got int"),
    ("c.csv", CSV, {"text_columns": "a,b,c"}, ValueError, "one column or two"),
    ("c.csv", CSV, {"max_seq_length": 2}, ValueError, "must exceed the 2 special tokens"),
]  # fmt: skip


@pytest.mark.parametrize("name, text, kwargs, exc, match", ERRORS)
def test_errors(tmp_path, tokenizers, name, text, kwargs, exc, match):
    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(exc, match=match):
        TextClassificationDataset(tmp_path / name, tokenizers["bert"][0], **kwargs)


def test_missing_file_and_unsupported_tokenizer(tmp_path, tokenizers):
    with pytest.raises(FileNotFoundError, match=r"not found: .*nope\.csv"):
        TextClassificationDataset(tmp_path / "nope.csv", tokenizers["bert"][0])
    (tmp_path / "c.csv").write_text(CSV)
    with pytest.raises(ValueError, match="built on the `tokenizers` library.*T5Tokenizer"):
        TextClassificationDataset(tmp_path / "c.csv", T5Tokenizer.__new__(T5Tokenizer))
