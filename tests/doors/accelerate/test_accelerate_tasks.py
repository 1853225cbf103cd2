"""The black-box CLI's tasks: tensors, label alignment, answer positions, masking, metrics.

Tokenizers are built here, offline: a hand-written WordPiece vocabulary (so every token
position below can be worked out by hand) and a tiny byte-level BPE without a pad token.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import default_collate

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

from libai.accelerate.tasks import (  # noqa: E402
    IGNORE_INDEX,
    TASKS,
    check_columns,
    get_task,
    iob2_spans,
)

WORDS = (
    "the paris is in france john lives new york where does live what capital of city a big "
    "small cat dog sat on mat hello world good bad movie great i like it not"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + WORDS + ["##son", "##s", ".", "?", ","]
CLS, SEP, PAD = 2, 3, 0


def ids(*tokens):
    return [VOCAB.index(t) for t in tokens]


@pytest.fixture(scope="module")
def bert_tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    tok = transformers.BertTokenizer(vocab=str(path))  # transformers 5: vocab=, not vocab_file=
    assert len(tok) == len(VOCAB) and tok.is_fast  # the vocabulary really was read
    assert tok("john johnson")["input_ids"] == [CLS, *ids("john", "john", "##son"), SEP]
    return tok


@pytest.fixture(scope="module")
def bpe_tok():
    """A GPT-2 style byte-level BPE: no pad, no CLS / SEP, no token_type_ids."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    corpus = [" ".join(WORDS[i : i + 6]) for i in range(len(WORDS))] * 4
    bpe.train_from_iterator(
        corpus, vocab_size=300, min_frequency=1, special_tokens=["<eos>"], show_progress=False
    )
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<eos>")
    assert len(tok) > 250 and tok.pad_token is None
    return tok


def make_args(**kw):
    return SimpleNamespace(seq_length=kw.pop("seq_length", 16), **kw)


def one_hot(index: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(index, n).float() * 5


def batches(dataset, size):
    items = [dataset[i] for i in range(len(dataset))]
    return [default_collate(items[i : i + size]) for i in range(0, len(items), size)]


def tiny(config_cls, **kw):
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return config_cls(**{**common, **kw})


# ---- registry and errors -------------------------------------------------------------------------
def test_registry_and_unknown_task():
    names = {
        "sequence_classification",
        "token_classification",
        "question_answering",
        "masked_lm",
        "causal_lm",
        "seq2seq_lm",
        "pretraining",
    }
    assert set(TASKS) == names
    for name in names:
        task = get_task(name)
        assert task is TASKS[name] and task.name == name and task.metrics
        assert hasattr(transformers, task.auto_model)
    with pytest.raises(ValueError, match="unknown task 'ner'.*sequence_classification"):
        get_task("ner")


def test_missing_column_message(bert_tok):
    ds = datasets.Dataset.from_dict({"sentence": ["the cat"], "label": [0]})
    with pytest.raises(ValueError) as err:
        check_columns(ds, ["sentence", "labels"], "train.csv")
    message = str(err.value)
    assert "'labels'" in message and "train.csv" in message and "['sentence', 'label']" in message
    valid = datasets.Dataset.from_dict({"text": ["the cat"], "label": [0]})
    args = make_args(text_columns=["sentence"], validation_path="dev.jsonl")
    with pytest.raises(ValueError, match=r"'sentence' not found in dev.jsonl.*\['text', 'label'\]"):
        get_task("sequence_classification").prepare(ds, valid, bert_tok, args)


def test_a_text_column_that_is_not_text_names_its_file_and_row(bert_tok):
    train = datasets.Dataset.from_dict({"sentence": ["the cat", "a dog"], "label": [0, 1]})
    valid = datasets.Dataset.from_dict({"sentence": ["the cat", None], "label": [0, 1]})
    args = make_args(text_columns="sentence", validation_path="dev.jsonl")
    with pytest.raises(ValueError, match=r"^dev.jsonl: column 'sentence' row 1 is not text: None"):
        get_task("sequence_classification").prepare(train, valid, bert_tok, args)


# ---- sequence classification ----------------------------------------------------------------
def test_sequence_classification_tensors_and_labels(bert_tok):
    task = get_task("sequence_classification")
    pairs = {"a": ["the cat sat", "hello world", "good movie"], "b": ["on the mat", "hi", "bad"]}
    train = datasets.Dataset.from_dict({**pairs, "label": ["pos", "neg", "pos"]})
    valid = datasets.Dataset.from_dict({**pairs, "label": ["neutral", "neg", "pos"]})
    args = make_args(seq_length=8, text_columns="a,b", label_column="label")
    prep = task.prepare(train, valid, bert_tok, args)
    # strings: sorted over train and validation
    assert prep.model_kwargs == {
        "num_labels": 3,
        "id2label": {0: "neg", 1: "neutral", 2: "pos"},
        "label2id": {"neg": 0, "neutral": 1, "pos": 2},
        "problem_type": "single_label_classification",
    }
    want = bert_tok(pairs["a"], pairs["b"], truncation=True, max_length=8, padding="max_length")
    for i in range(3):
        item = prep.train[i]
        assert set(item) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
        assert all(
            v.shape == (8,) and v.dtype == torch.long for k, v in item.items() if k != "labels"
        )
        assert item["input_ids"].tolist() == want["input_ids"][i]
        assert item["token_type_ids"].tolist() == want["token_type_ids"][i]
    assert prep.train[0]["input_ids"].tolist() == [
        CLS,
        *ids("the", "cat"),
        SEP,
        *ids("on", "the", "mat"),
        SEP,
    ]  # longest_first: 5 places for 3 + 3 tokens, the first text is cut
    assert [prep.train[i]["labels"].item() for i in range(3)] == [2, 0, 2]
    assert [prep.valid[i]["labels"].item() for i in range(3)] == [1, 0, 2]

    # a ClassLabel gives names and ids; plain ints stay as they are
    features = datasets.Features(
        {"a": datasets.Value("string"), "label": datasets.ClassLabel(names=["no", "yes"])}
    )
    cl = datasets.Dataset.from_dict({"a": ["the cat", "a dog"], "label": [1, 0]}, features=features)
    prep = task.prepare(cl, None, bert_tok, make_args(text_columns=["a"]))
    assert prep.valid is None and prep.model_kwargs["id2label"] == {0: "no", 1: "yes"}
    assert [prep.train[i]["labels"].item() for i in range(2)] == [1, 0]
    ints = datasets.Dataset.from_dict({"a": ["the cat", "a dog"], "label": [3, 0]})
    prep = task.prepare(ints, None, bert_tok, make_args(text_columns=["a"]))
    assert prep.model_kwargs["num_labels"] == 4 and prep.model_kwargs["id2label"][3] == "LABEL_3"
    assert [prep.train[i]["labels"].item() for i in range(2)] == [3, 0]
    one = datasets.Dataset.from_dict({"a": ["the cat", "a dog"], "label": ["x", "x"]})
    with pytest.raises(ValueError, match="one class only"):
        task.prepare(one, None, bert_tok, make_args(text_columns=["a"]))
    # train's integer ids beside validation's names: no rule maps one onto the other
    names = datasets.Dataset.from_dict({"a": ["the cat", "a dog"], "label": ["x", "y"]})
    with pytest.raises(ValueError, match="column 'label' mixes class names and integer ids"):
        task.prepare(ints, names, bert_tok, make_args(text_columns=["a"]))
    scores = datasets.Dataset.from_dict({"a": ["the cat", "a dog"], "label": [0.5, 1.0]})
    with pytest.raises(ValueError, match=r"regression is not a task here\), found 0\.5"):
        task.prepare(scores, None, bert_tok, make_args(text_columns=["a"]))


def test_sequence_classification_metrics():
    task = get_task("sequence_classification")
    # binary: F1 of class 1. tp=2 fp=1 fn=1 -> 2/3; accuracy 4/6; two batches add up
    labels, preds = torch.tensor([1, 0, 1, 1, 0, 0]), torch.tensor([1, 1, 0, 1, 0, 0])
    sums: dict = {}
    for lo, hi in ((0, 2), (2, 6)):
        task.update(
            sums, {"labels": labels[lo:hi]}, {"loss": 0.0, "logits": one_hot(preds[lo:hi], 2)}
        )
    assert task.compute(sums) == pytest.approx({"accuracy": 4 / 6, "f1": 2 / 3})
    # macro over the classes seen: class 0: 2/3, class 1: 0, class 2: 4/5; class 3 unseen
    labels, preds = torch.tensor([0, 1, 2, 2, 0]), torch.tensor([0, 2, 2, 2, 1])
    sums = {}
    task.update(sums, {"labels": labels}, {"loss": 0.0, "logits": one_hot(preds, 4)})
    assert task.compute(sums) == pytest.approx({"accuracy": 3 / 5, "f1": (2 / 3 + 0 + 4 / 5) / 3})


def test_sequence_classification_without_pad_token(bpe_tok):
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe_tok.backend_tokenizer, eos_token="<eos>"
    )
    train = datasets.Dataset.from_dict({"sentence": ["the cat sat", "hello"], "label": [0, 1]})
    prep = get_task("sequence_classification").prepare(train, None, tok, make_args(seq_length=6))
    assert tok.pad_token == "<eos>" and prep.model_kwargs["pad_token_id"] == tok.eos_token_id
    item = prep.train[1]
    assert set(item) == {"input_ids", "attention_mask", "labels"}
    assert item["input_ids"].shape == (6,) and item["input_ids"][-1] == tok.eos_token_id


# ---- token classification ---------------------------------------------------------------------
TAGS = ["B-LOC", "B-PER", "I-PER", "O"]  # sorted: the ids of string tags


def test_token_classification_alignment(bert_tok):
    task = get_task("token_classification")
    rows = {
        "tokens": [["john", "johnson", "lives", "in", "paris"]],
        "ner_tags": [["B-PER", "I-PER", "O", "O", "B-LOC"]],
    }
    prep = task.prepare(datasets.Dataset.from_dict(rows), None, bert_tok, make_args(seq_length=10))
    assert prep.model_kwargs["id2label"] == dict(enumerate(TAGS))
    assert task.metrics == ("precision", "recall", "f1", "accuracy")
    item = prep.train[0]
    # [CLS] john john ##son lives in paris [SEP] [PAD] [PAD]: ##son and specials get -100
    assert item["input_ids"].tolist() == [
        CLS,
        *ids("john", "john", "##son", "lives", "in", "paris"),
        SEP,
        PAD,
        PAD,
    ]
    assert item["labels"].tolist() == [-100, 1, 2, -100, 3, 3, 0, -100, -100, -100]
    assert item["token_type_ids"].shape == item["attention_mask"].shape == (10,)
    # cut by seq_length: the words past the cut are simply gone
    prep = task.prepare(datasets.Dataset.from_dict(rows), None, bert_tok, make_args(seq_length=6))
    assert prep.train[0]["labels"].tolist() == [-100, 1, 2, -100, 3, -100]

    # ClassLabel sequences keep their names and ids; integer tags are not IOB2: accuracy only
    features = datasets.Features(
        {
            "tokens": datasets.List(datasets.Value("string")),
            "ner_tags": datasets.List(datasets.ClassLabel(names=["O", "B-PER", "I-PER"])),
        }
    )
    rows = {"tokens": [["john", "johnson", "lives"]], "ner_tags": [[1, 2, 0]]}
    cl = datasets.Dataset.from_dict(rows, features=features)
    prep = task.prepare(cl, None, bert_tok, make_args(seq_length=8))
    assert prep.model_kwargs["label2id"] == {"O": 0, "B-PER": 1, "I-PER": 2}
    assert prep.train[0]["labels"].tolist()[:6] == [-100, 1, 2, -100, 0, -100]
    ints = datasets.Dataset.from_dict({"words": [["the", "cat"]], "tags": [[0, 2]]})
    args = make_args(seq_length=8, tokens_column="words", label_column="tags")
    prep = task.prepare(ints, None, bert_tok, args)
    assert task.metrics == ("accuracy",) and prep.model_kwargs["num_labels"] == 3


def test_iob2_spans_strict():
    tags = ["I-PER", "I-PER", "O", "B-LOC", "I-PER", "B-PER", "I-PER", "B-PER"]
    assert iob2_spans(tags) == [("LOC", 3, 3), ("PER", 5, 6), ("PER", 7, 7)]


def test_token_classification_metrics(bert_tok):
    task = get_task("token_classification")
    rows = {"tokens": [["the", "cat"]], "ner_tags": [["O", "B-PER"]]}
    task.prepare(datasets.Dataset.from_dict(rows), None, bert_tok, make_args(seq_length=8))
    names = ["B-LOC", "B-PER", "I-PER", "O", "B-ORG", "I-ORG"]
    task.label_names = names  # as if prepared on these tags
    n = {name: i for i, name in enumerate(names)}
    gold = ["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "I-ORG"]
    pred = ["B-PER", "I-PER", "O", "B-ORG", "O", "B-ORG", "O"]  # right, wrong type, partial
    # interleave unlabelled sub-token positions whose (wrong) predictions must not count
    labels, logits_ids = [], []
    for g, p in zip(gold, pred):
        labels += [n[g], IGNORE_INDEX]
        logits_ids += [n[p], n["B-LOC"]]
    labels, logits_ids = torch.tensor([labels]), torch.tensor([logits_ids])
    sums: dict = {}
    task.update(sums, {"labels": labels}, {"loss": 0.0, "logits": one_hot(logits_ids, 6)})
    # second batch: one sentence, one correct entity, one missed
    task.update(
        sums,
        {"labels": torch.tensor([[n["B-LOC"], n["O"], n["B-PER"]]])},
        {"loss": 0.0, "logits": one_hot(torch.tensor([[n["B-LOC"], n["O"], n["O"]]]), 6)},
    )
    # entities: gold 3 + 2, predicted 3 + 1, true 1 + 1; tokens 7 + 3, correct 5 + 2
    precision, recall = 2 / 4, 2 / 5
    assert task.compute(sums) == pytest.approx(
        {
            "precision": precision,
            "recall": recall,
            "f1": 2 * precision * recall / (precision + recall),
            "accuracy": 7 / 10,
        }
    )


# ---- question answering -----------------------------------------------------------------------
QUESTION = " where does john live ?"  # the leading space is stripped, as run_qa does
CONTEXT = "john lives in new york ."
# [CLS] where does john live ? [SEP] john lives in new york . [SEP]
#   0     1     2    3    4   5   6    7    8    9  10  11  12  13


def qa_rows(answers):
    return datasets.Dataset.from_dict(
        {
            "question": [QUESTION] * len(answers),
            "context": [c for c, _ in answers],
            "answers": [{"text": [t], "answer_start": [c.index(t)]} for c, t in answers],
        }
    )


def test_question_answering_positions(bert_tok):
    task = get_task("question_answering")
    rows = qa_rows(
        [
            (CONTEXT, "new york"),
            (CONTEXT, "john"),  # the first "john" of the context, not the question's
            ("john lives in new york", "york"),  # the last context token
            ("johnson lives in paris", "johnson"),  # two sub-tokens
        ]
    )
    prep = task.prepare(rows, None, bert_tok, make_args(seq_length=16))
    assert prep.train[0]["input_ids"].tolist()[:14] == [
        CLS,
        *ids("where", "does", "john", "live", "?"),
        SEP,
        *ids("john", "lives", "in", "new", "york", "."),
        SEP,
    ]
    spans = [
        (prep.train[i]["start_positions"].item(), prep.train[i]["end_positions"].item())
        for i in range(4)
    ]
    assert spans == [(10, 11), (7, 7), (11, 11), (7, 8)]
    assert all(v.shape == (16,) for k, v in prep.train[0].items() if not k.endswith("positions"))
    # cut off: 11 tokens keep "john lives in" only; 12 keep "new" but not "york": (0, 0)
    for seq_length in (11, 12):
        prep = task.prepare(
            qa_rows([(CONTEXT, "new york")]), None, bert_tok, make_args(seq_length=seq_length)
        )
        item = prep.train[0]
        assert (item["start_positions"].item(), item["end_positions"].item()) == (0, 0)
        assert item["input_ids"][-1] == SEP and item["input_ids"].shape == (seq_length,)
    # an empty answer list (unanswerable) -> (0, 0); a question longer than seq_length works
    rows = datasets.Dataset.from_dict(
        {
            "question": ["where", "where does john live ? " * 4],
            "context": [CONTEXT, CONTEXT],
            "answers": [{"text": [], "answer_start": []}, {"text": ["john"], "answer_start": [0]}],
        }
    )
    prep = task.prepare(rows, None, bert_tok, make_args(seq_length=12))
    assert prep.train[0]["start_positions"].item() == prep.train[0]["end_positions"].item() == 0
    assert prep.train[1]["input_ids"].shape == (12,)


def test_question_answering_metrics(bert_tok):
    task = get_task("question_answering")
    valid = qa_rows([(CONTEXT, "new york")] * 3 + [(CONTEXT, "in new york")])
    prep = task.prepare(valid, valid, bert_tok, make_args(seq_length=16))
    batch = default_collate([prep.valid[i] for i in range(4)])
    assert batch["start_positions"].tolist() == [10, 10, 10, 9]

    def logits(peaks):  # one row per (position: score) dict
        out = torch.zeros(len(peaks), 16)
        for row, peak in enumerate(peaks):
            for pos, score in peak.items():
                out[row, pos] = score
        return out

    start = logits([{10: 5}, {11: 5}, {3: 9, 10: 4}, {10: 5}])
    end = logits([{11: 5}, {12: 5}, {4: 9, 11: 4}, {10: 5}])
    # row 0: exact (10, 11). row 1: (11, 12) vs (10, 11): overlap 1 of 2 -> F1 1/2.
    # row 2: the best pair (3, 4) is in the question; the best valid one is (10, 11).
    # row 3: (10, 10) vs gold (9, 11): precision 1, recall 1/3 -> F1 1/2.
    sums: dict = {}
    task.update(sums, batch, {"loss": 0.0, "start_logits": start, "end_logits": end})
    assert task.compute(sums) == pytest.approx({"exact_match": 50.0, "f1": 75.0})
    # gold (0, 0) (answer cut off) scores 0 against any span; the context heuristic for rows
    # prepare never saw gives the same context range
    assert task._context_span(batch["input_ids"][0]) == (7, 12)
    task.context_spans.clear()
    assert task._context_span(batch["input_ids"][0]) == (7, 12)
    sums = {}
    batch["start_positions"][:] = 0
    batch["end_positions"][:] = 0
    task.update(sums, batch, {"loss": 0.0, "start_logits": start, "end_logits": end})
    assert task.compute(sums) == {"exact_match": 0.0, "f1": 0.0}


def test_question_answering_answer_length_limit_is_run_qa_default(bert_tok):
    """Spans longer than ``max_answer_length`` tokens are never predicted; the default is 30
    (run_qa's ``--max_answer_length``; its rule: skip when ``end - start + 1 > 30``)."""
    rows = datasets.Dataset.from_dict(
        {
            "question": ["where"],
            "context": [" ".join(["the"] * 40)],
            "answers": [{"text": ["the"], "answer_start": [0]}],
        }
    )
    # [CLS] where [SEP] the x 40 (positions 3..42) [SEP]
    start, end = torch.zeros(1, 48), torch.zeros(1, 48)
    start[0, 5] = 9.0
    end[0, 35], end[0, 34] = 9.0, 8.0  # the best pair (5, 35) is 31 tokens long

    def predicted(args):
        task = get_task("question_answering")
        prep = task.prepare(rows, rows, bert_tok, args)
        batch = default_collate([prep.valid[0]])
        batch["start_positions"][:], batch["end_positions"][:] = 5, 34
        sums: dict = {}
        task.update(sums, batch, {"loss": 0.0, "start_logits": start, "end_logits": end})
        return task.compute(sums)["exact_match"]

    assert predicted(make_args(seq_length=48)) == 100.0  # (5, 34): 30 tokens
    assert predicted(make_args(seq_length=48, max_answer_length=31)) == 0.0  # (5, 35)


@pytest.mark.parametrize("name", sorted(set(TASKS) - {"pretraining"}))
def test_every_task_names_the_file_of_a_missing_column_or_an_empty_split(bert_tok, name):
    """The error names the file the user gave (``--data-path`` / ``--validation-path``), not
    a generic 'the training data'."""
    task = get_task(name)
    wrong = datasets.Dataset.from_dict({"unrelated": ["the cat"]})
    args = make_args(
        data_path="corpus/train.jsonl", validation_path="corpus/dev.jsonl", text_columns="text"
    )
    with pytest.raises(ValueError, match="not found in corpus/train.jsonl; columns found"):
        task.prepare(wrong, None, bert_tok, args)
    empty = wrong.select([])
    with pytest.raises(ValueError, match="^corpus/dev.jsonl has no rows"):
        task.prepare(wrong, empty, bert_tok, args)


# ---- language modelling -----------------------------------------------------------------------
def lm_corpus(n=60):
    g = torch.Generator().manual_seed(0)
    return [
        " ".join(WORDS[i] for i in torch.randint(5, len(WORDS), (7,), generator=g).tolist())
        for _ in range(n)
    ]


def test_masked_lm_blocks_and_masking(bert_tok):
    task = get_task("masked_lm")
    texts = lm_corpus()
    train = datasets.Dataset.from_dict({"text": texts + ["", "   "]})  # blanks are skipped
    args = make_args(seq_length=32, seed=7)
    prep = task.prepare(train, None, bert_tok, args)
    total = 60 * 9  # 7 words + [CLS] + [SEP] each
    assert len(prep.train) == total // 32  # the remainder is dropped
    first = prep.train.tensors["input_ids"].reshape(-1)
    assert first[:9].tolist() == bert_tok(texts[0])["input_ids"]
    chosen = masked = 0
    for i in range(len(prep.train)):
        item = prep.train[i]
        again = prep.train[i]
        assert all(torch.equal(item[k], again[k]) for k in item)  # deterministic
        assert set(item) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
        original = prep.train.tensors["input_ids"][i]
        picked = item["labels"] != IGNORE_INDEX
        assert torch.equal(item["labels"][picked], original[picked])
        assert torch.equal(item["input_ids"][~picked], original[~picked])
        assert not picked[torch.isin(original, torch.tensor([CLS, SEP]))].any()
        chosen += int(picked.sum())
        masked += int((item["input_ids"][picked] == bert_tok.mask_token_id).sum())
    non_special = len(prep.train) * 32 - int(
        torch.isin(prep.train.tensors["input_ids"], torch.tensor([CLS, SEP])).sum()
    )
    assert 0.10 < chosen / non_special < 0.20
    assert 0.65 < masked / chosen < 0.95
    # the same masks from a fresh prepare (another rank, another run); other seed or epoch differ
    again = task.prepare(train, None, bert_tok, args).train
    assert torch.equal(again[3]["labels"], prep.train[3]["labels"])
    other = task.prepare(train, None, bert_tok, make_args(seq_length=32, seed=8)).train
    assert not torch.equal(other[3]["labels"], prep.train[3]["labels"])
    again.set_epoch(1)
    assert not torch.equal(again[3]["labels"], prep.train[3]["labels"])
    # mlm_probability=1: every token that is not special is picked (80/10/10 as before)
    every = task.prepare(train, None, bert_tok, make_args(seq_length=32, seed=7, mlm_probability=1))
    for i in range(len(every.train)):
        original = every.train.tensors["input_ids"][i]
        special = torch.isin(original, torch.tensor([CLS, SEP]))
        assert torch.equal(every.train[i]["labels"] != IGNORE_INDEX, ~special)
    with pytest.raises(ValueError, match="fewer than one block"):
        task.prepare(train.select(range(2)), None, bert_tok, args)


def test_perplexity_weighting():
    task = get_task("masked_lm")
    labels_a = torch.full((2, 8), IGNORE_INDEX)
    labels_a[0, :3] = 1  # 3 predicted tokens
    labels_b = torch.full((1, 8), IGNORE_INDEX)
    labels_b[0, :5] = 1  # 5 predicted tokens
    sums: dict = {}
    task.update(sums, {"labels": labels_a}, {"loss": torch.tensor(2.0)})
    task.update(sums, {"labels": labels_b}, {"loss": torch.tensor(1.0)})
    task.update(
        sums, {"labels": torch.full((1, 8), IGNORE_INDEX)}, {"loss": torch.tensor(math.nan)}
    )
    assert task.compute(sums)["perplexity"] == pytest.approx(math.exp((2.0 * 3 + 1.0 * 5) / 8))
    sums = {}  # causal: seq_length - 1 predicted tokens per sample
    causal = get_task("causal_lm")
    causal.update(sums, {"labels": torch.ones(1, 8, dtype=torch.long)}, {"loss": torch.tensor(1.0)})
    causal.update(sums, {"labels": torch.ones(3, 8, dtype=torch.long)}, {"loss": torch.tensor(3.0)})
    assert sums["tokens"] == 28
    assert causal.compute(sums)["perplexity"] == pytest.approx(math.exp((7 + 63) / 28))


def test_seq2seq_tensors(bert_tok):
    task = get_task("seq2seq_lm")
    train = datasets.Dataset.from_dict(
        {"source": ["the cat sat on the mat", "hello"], "target": ["a cat", "hello world good"]}
    )
    prep = task.prepare(train, None, bert_tok, make_args(seq_length=10, target_length=5))
    item = prep.train[0]
    assert set(item) == {"input_ids", "attention_mask", "labels"}
    assert item["input_ids"].shape == (10,) and item["labels"].shape == (5,)
    assert item["labels"].tolist() == [CLS, *ids("a", "cat"), SEP, IGNORE_INDEX]
    assert prep.train[1]["labels"].tolist() == [CLS, *ids("hello", "world", "good"), SEP]
    prep = task.prepare(train, None, bert_tok, make_args(seq_length=10))
    assert prep.train[0]["labels"].shape == (10,)  # target_length defaults to seq_length


# ---- every task with a real tiny transformers model ------------------------------------------------
def reference_lm_loss(name, model, dataset) -> float:
    """Cross-entropy per predicted token over the whole set, from one forward's logits:
    labels != -100, shifted by one for a causal LM."""
    whole = default_collate([dataset[i] for i in range(len(dataset))])
    model.eval()
    with torch.no_grad():
        logits = model(
            **{k: v for k, v in whole.items() if k != "labels"}
            | (
                {"decoder_input_ids": model._shift_right(whole["labels"].clamp(min=0))}
                if name == "seq2seq_lm"
                else {}
            )
        ).logits
    labels = whole["labels"]
    if name == "causal_lm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    keep = labels != IGNORE_INDEX
    losses = torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum")
    return float(losses) / int(keep.sum())


def run_eval(task, model, dataset, size):
    model.eval()
    sums: dict = {}
    with torch.no_grad():
        for batch in batches(dataset, size):
            task.update(sums, batch, model(**batch))
    return task.compute(sums)


def test_real_models_sequence_and_token_classification(bert_tok):
    torch.manual_seed(0)
    task = get_task("sequence_classification")
    rows = {"sentence": ["the cat sat", "a good movie", "bad", "i like it"], "label": [0, 1, 2, 1]}
    data = datasets.Dataset.from_dict(rows)
    prep = task.prepare(data, data, bert_tok, make_args(seq_length=8))
    config = tiny(transformers.BertConfig, vocab_size=len(bert_tok), **prep.model_kwargs)
    model = transformers.BertForSequenceClassification(config)
    metrics = run_eval(task, model, prep.valid, 3)  # batches of 3 and 1
    # the reference: one forward of all rows, accuracy and sklearn's macro F1 written out
    whole = default_collate([prep.valid[i] for i in range(len(prep.valid))])
    with torch.no_grad():
        preds = model(**whole).logits.argmax(-1)
    gold = whole["labels"]
    f1s = []
    for c in set(preds.tolist()) | set(gold.tolist()):
        tp = int(((preds == c) & (gold == c)).sum())
        f1s.append(2 * tp / (int((preds == c).sum()) + int((gold == c).sum())))
    assert metrics == pytest.approx(
        {"accuracy": float((preds == gold).float().mean()), "f1": sum(f1s) / len(f1s)}
    )

    task = get_task("token_classification")
    rows = {
        "tokens": [["john", "lives", "in", "paris"], ["the", "cat"], ["johnson", "is", "big"]],
        "ner_tags": [["B-PER", "O", "O", "B-LOC"], ["O", "O"], ["B-PER", "O", "O"]],
    }
    data = datasets.Dataset.from_dict(rows)
    prep = task.prepare(data, data, bert_tok, make_args(seq_length=8))
    config = tiny(transformers.BertConfig, vocab_size=len(bert_tok), **prep.model_kwargs)
    model = transformers.BertForTokenClassification(config)
    metrics = run_eval(task, model, prep.valid, 2)
    assert set(metrics) == set(task.metrics) == {"precision", "recall", "f1", "accuracy"}
    # the reference: one forward; word-level tags (the labelled first sub-tokens); entities
    # as seqeval's strict IOB2 finds them, here by a regular expression over the tag string
    whole = default_collate([prep.valid[i] for i in range(len(prep.valid))])
    with torch.no_grad():
        preds = model(**whole).logits.argmax(-1)
    keep = whole["labels"] != IGNORE_INDEX
    names = task.label_names

    def entities(rows):
        found = set()
        for r, row in enumerate(rows):
            text = "".join(f"{names[t]} " for t in row)
            for m in re.finditer(r"B-(\w+) (?:I-\1 )*", text):
                found.add((r, m.start(), m.group(0)))
        return found

    p_rows = [preds[r][keep[r]].tolist() for r in range(len(preds))]
    g_rows = [whole["labels"][r][keep[r]].tolist() for r in range(len(preds))]
    predicted, gold = entities(p_rows), entities(g_rows)
    assert len(gold) == 3  # PER, LOC; PER
    precision = len(predicted & gold) / len(predicted) if predicted else 0.0
    recall = len(predicted & gold) / len(gold)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = float((preds[keep] == whole["labels"][keep]).float().mean())
    want = {"precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy}
    assert metrics == pytest.approx(want)


def test_real_models_question_answering_and_lms(bert_tok, bpe_tok):
    torch.manual_seed(0)
    task = get_task("question_answering")
    data = qa_rows([(CONTEXT, "new york"), (CONTEXT, "john"), ("john lives in paris", "paris")])
    prep = task.prepare(data, data, bert_tok, make_args(seq_length=16))
    config = tiny(transformers.BertConfig, vocab_size=len(bert_tok))
    model = transformers.BertForQuestionAnswering(config)
    metrics = run_eval(task, model, prep.valid, 2)
    # the reference: every span inside the context (segment 1 without [SEP]) searched, the
    # best start + end score predicted; SQuAD's exact match and token-overlap F1, in percent
    whole = default_collate([prep.valid[i] for i in range(len(prep.valid))])
    with torch.no_grad():
        out = model(**whole)
    em = f1 = 0.0
    for r in range(len(whole["input_ids"])):
        context = (whole["token_type_ids"][r] == 1) & (whole["input_ids"][r] != SEP)
        where = context.nonzero().reshape(-1).tolist()
        start, end = out.start_logits[r], out.end_logits[r]
        spans = [(a, b) for a in where for b in where if a <= b]
        pred = max(spans, key=lambda ab: float(start[ab[0]] + end[ab[1]]))
        g = (int(whole["start_positions"][r]), int(whole["end_positions"][r]))
        overlap = len(set(range(pred[0], pred[1] + 1)) & set(range(g[0], g[1] + 1)))
        em += float(pred == g)
        if overlap:
            precision, recall = overlap / (pred[1] - pred[0] + 1), overlap / (g[1] - g[0] + 1)
            f1 += 2 * precision * recall / (precision + recall)
    n = len(whole["input_ids"])
    assert metrics == pytest.approx({"exact_match": 100 * em / n, "f1": 100 * f1 / n})

    # perplexity: two batches of different label counts give the one-batch value
    texts = datasets.Dataset.from_dict({"text": lm_corpus(12)})
    cases = [
        (
            "masked_lm",
            bert_tok,
            transformers.BertForMaskedLM,
            tiny(transformers.BertConfig, vocab_size=len(bert_tok)),
        ),
        (
            "causal_lm",
            bpe_tok,
            transformers.GPT2LMHeadModel,
            transformers.GPT2Config(
                vocab_size=len(bpe_tok), n_embd=32, n_layer=2, n_head=2, n_positions=64
            ),
        ),
    ]
    for name, tok, model_cls, config in cases:
        task = get_task(name)
        prep = task.prepare(texts, texts, tok, make_args(seq_length=16, seed=3))
        assert len(prep.valid) >= 4 and prep.valid[0]["input_ids"].shape == (16,)
        model = model_cls(config)
        split = run_eval(task, model, prep.valid, 3)["perplexity"]
        whole = run_eval(task, model, prep.valid, len(prep.valid))["perplexity"]
        assert split == pytest.approx(whole, rel=1e-5)
        assert whole == pytest.approx(math.exp(reference_lm_loss(name, model, prep.valid)))

    task = get_task("seq2seq_lm")
    data = datasets.Dataset.from_dict(
        {
            "source": ["the cat sat on the mat", "hello", "a big dog"],
            "target": ["a cat", "hello world good", "dog"],
        }
    )
    prep = task.prepare(data, data, bert_tok, make_args(seq_length=10, target_length=6))
    config = transformers.T5Config(
        vocab_size=len(bert_tok),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=SEP,
    )
    model = transformers.T5ForConditionalGeneration(config)
    split = run_eval(task, model, prep.valid, 2)["perplexity"]
    whole = run_eval(task, model, prep.valid, 3)["perplexity"]
    assert split == pytest.approx(whole, rel=1e-5)
    assert whole == pytest.approx(math.exp(reference_lm_loss("seq2seq_lm", model, prep.valid)))
