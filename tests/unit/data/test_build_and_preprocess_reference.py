"""Loader builders, blending indices, indexed-dataset writers, preprocessing, the sample corpus
and the sentence splitter, each checked against an independent reference: batch / split
arithmetic written out here, plain torch / numpy on the raw files, hand-derived token counts.
Single process, CPU only; tiny data in tmp_path."""

from __future__ import annotations

import json
import logging
import struct
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bpe_helpers import write_hand_bpe, write_indexed

from libai import dist
from libai.config import LazyCall
from libai.data import SingleRoundSampler, build_train_valid_test_datasets
from libai.data.build import MixupLoader, build_nlp_test_loader, trivial_batch_collator
from libai.data.data_utils.dataset_utils import build_blending_indices
from libai.data.data_utils.indexed_dataset import MMapIndexedDatasetBuilder
from libai.data.data_utils.legacy_indexed import IndexedDataset, IndexedDatasetBuilder
from libai.data.preprocess import preprocess_jsonl, tokenizer_args
from libai.data.sample_corpus import _build, split_documents
from libai.data.sentence_split import split_sentences


@pytest.fixture(scope="module", autouse=True)
def single_process_mesh():
    dist.setup_dist_util({})


class _Records:
    """A sized dataset of ``{"x": i}`` samples."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor(int(i))}


class _SplitRecorder:
    """A ready-made dataset object (not a LazyCall) that builds its splits with ``for_split``
    and records what it was given, as BertDataset / T5Dataset objects are split."""

    name = "rec"

    def __init__(self, indexed_dataset=None, data_prefix=None):
        self.indexed_dataset = indexed_dataset
        self.data_prefix = data_prefix

    def for_split(self, name, indexed_dataset, documents, max_num_samples):
        return SimpleNamespace(
            name=name,
            indexed=indexed_dataset,
            documents=documents,
            num=max_num_samples,
        )


class _Split(list):
    """What ``_SplitRecorder.for_split`` returns when a blend needs lengths."""


class _SizedRecorder(_SplitRecorder):
    def for_split(self, name, indexed_dataset, documents, max_num_samples):
        out = _Split(range(max_num_samples))
        out.documents, out.indexed = documents, indexed_dataset
        return out


# ---- build.py ----------------------------------------------------------------------------------
def test_a_dataset_object_without_indexed_dataset_opens_its_data_prefix(tmp_path):
    """A dataset object whose ``indexed_dataset`` is None is opened from its ``data_prefix``:
    the split gets the files' sequences (the token lists written here) and the documents of
    the hand-computed split 8/1/1 of 10 documents: [0, 8), [8, 9), [9, 10)."""
    docs = [[i, i + 1, i + 2] for i in range(10)]
    prefix = write_indexed(tmp_path / "ds", docs)
    train, valid, test = build_train_valid_test_datasets(
        _SplitRecorder(data_prefix=prefix), [[8, 1, 1]]
    )
    assert len(train.indexed) == 10
    assert [train.indexed[i].tolist() for i in range(10)] == docs
    assert train.documents.tolist() == list(range(8))
    assert valid.documents.tolist() == [8]
    assert test.documents.tolist() == [9]


def test_one_flat_split_applies_to_every_dataset_of_a_blend():
    """A single split ``[8, 1, 1]`` with two datasets of 10 and 20 units is used for both:
    train documents [0, 8) and [0, 16) (round(0.8 * n)), and 10 train samples blended 1:1
    ask each dataset for ceil(10 * 0.5 * 1.005) = 6 samples (Megatron's 0.5% margin)."""
    a = _SizedRecorder(indexed_dataset=list(range(10)))
    b = _SizedRecorder(indexed_dataset=list(range(20)))
    train, valid, test = build_train_valid_test_datasets(
        [a, b], [8, 1, 1], weights=[1, 1], train_val_test_num_samples=[10, 0, 0]
    )
    assert valid is None and test is None
    assert len(train) == 10
    assert [d.documents.tolist() for d in train.datasets] == [list(range(8)), list(range(16))]
    assert [len(d) for d in train.datasets] == [6, 6]


def test_trivial_batch_collator_stacks_a_batch_of_one():
    """A one-sample batch of dicts becomes ``{key: [1, ...]}`` (torch.stack of one tensor)."""
    out = trivial_batch_collator([{"a": torch.tensor([1, 2]), "b": 3}])
    assert torch.equal(out["a"], torch.tensor([[1, 2]]))
    assert torch.equal(out["b"], torch.tensor([3]))


def test_test_loader_default_seed_is_zero_for_a_shuffling_sampler():
    """A LazyCall ``SingleRoundSampler(shuffle=True)`` gets the loader's default seed 0: the
    one pass is ``torch.randperm(10)`` under ``manual_seed(0)`` (plain torch)."""
    loader = build_nlp_test_loader(
        _Records(10), 4, sampler=LazyCall(SingleRoundSampler)(shuffle=True)
    )
    got = torch.cat([b["x"] for b in loader]).tolist()
    want = torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
    assert got == want


def test_test_loader_shards_over_the_data_parallel_size(monkeypatch):
    """Data-parallel rank 1 of 2 reads the second contiguous half of 10 samples, [5, 10), in
    micro-batches of 2 (the last one short): [[5, 6], [7, 8], [9]]."""
    monkeypatch.setattr(dist, "get_data_parallel_size", lambda: 2)
    monkeypatch.setattr(dist, "get_data_parallel_rank", lambda: 1)
    loader = build_nlp_test_loader(_Records(10), 2)
    assert [b["x"].tolist() for b in loader] == [[5, 6], [7, 8], [9]]


def test_test_loader_uses_the_given_collate_fn():
    """``collate_fn`` replaces the default collator: batches are what it returns."""
    loader = build_nlp_test_loader(_Records(5), 2, collate_fn=lambda b: ("mine", len(b)))
    assert list(loader) == [("mine", 2), ("mine", 2), ("mine", 1)]


def test_mixup_loader_forwards_other_attributes_to_the_wrapped_loader():
    """``MixupLoader`` exposes the wrapped loader's attributes (``dataset``, ``batch_size``)."""
    data = _Records(4)
    inner = torch.utils.data.DataLoader(data, batch_size=2)
    wrapped = MixupLoader(inner, lambda x, y: (x, y))
    assert wrapped.dataset is data
    assert wrapped.batch_size == 2
    with pytest.raises(AttributeError):
        wrapped.no_such_attribute  # noqa: B018


# ---- dataset_utils / indexed datasets ----------------------------------------------------------
def test_blending_indices_are_int64_and_follow_the_greedy_rule():
    """Weights 1:1 over 4 samples, by hand (error = w * max(i, 1) - count, argmax, ties to the
    first): datasets [0, 1, 0, 1], sample indices [0, 0, 1, 1]; both int64 (Megatron's)."""
    dataset_index, sample_index = build_blending_indices([1, 1], 4)
    assert dataset_index.tolist() == [0, 1, 0, 1]
    assert sample_index.tolist() == [0, 0, 1, 1]
    assert dataset_index.dtype == np.int64 and sample_index.dtype == np.int64


def test_float_builder_takes_integer_items(tmp_path):
    """A float32 builder stores integer items as float32 (no integer range check applies):
    the raw ``.bin`` read by numpy is [1., 2., 3.] and the ``.idx`` dtype code is 7."""
    builder = MMapIndexedDatasetBuilder(str(tmp_path / "f.bin"), dtype=np.float32)
    builder.add_item(np.array([1, 2, 3], dtype=np.int64))
    builder.end_document()
    builder.finalize(str(tmp_path / "f.idx"))
    assert np.fromfile(tmp_path / "f.bin", dtype=np.float32).tolist() == [1.0, 2.0, 3.0]
    idx = (tmp_path / "f.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<B", idx[17:18]) == (7,)


def test_legacy_reader_rejects_the_index_one_past_the_end(tmp_path):
    """Items 0..2 of a 3-item TNTIDX dataset read back (lists written here); item 3 raises the
    reader's own IndexError naming the item count."""
    items = [[1, 2], [3], [4, 5, 6]]
    builder = IndexedDatasetBuilder(str(tmp_path / "l.bin"))
    for item in items:
        builder.add_item(item)
        builder.end_document()
    builder.finalize(str(tmp_path / "l.idx"))
    ds = IndexedDataset(str(tmp_path / "l"))
    assert [ds.get(i).tolist() for i in range(3)] == items
    with pytest.raises(IndexError, match="out of range for 3 items"):
        ds.get(3)


# ---- preprocess --------------------------------------------------------------------------------
def test_tokenizer_args_keeps_the_options_a_tokenizer_takes():
    """BertTokenizer takes ``do_lower_case``: it is passed on with the vocab file."""
    assert tokenizer_args("BertTokenizer", "v.txt", do_lower_case=False) == {
        "vocab_file": "v.txt",
        "do_lower_case": False,
    }
    with pytest.raises(ValueError, match="does not apply"):
        tokenizer_args("GPT2Tokenizer", "v", "m", do_lower_case=False)


def test_preprocess_logs_the_token_count_of_all_sentences(tmp_path, caplog):
    """With split_sentences, "hello world\\nhello" is 2 sentences of 2 + 1 tokens in the hand
    vocab ('hello', 'Ġworld' single tokens): the summary line counts 3 tokens, which is also
    the raw ``.bin`` size over uint16's 2 bytes."""
    vocab, merges = write_hand_bpe(tmp_path / "bpe")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(json.dumps({"text": "hello world\nhello"}) + "\n")
    with caplog.at_level(logging.INFO, logger="libai.data.preprocess"):
        prefixes = preprocess_jsonl(
            jsonl,
            str(tmp_path / "out"),
            vocab,
            merges,
            split_sentences=True,
            workers=1,
            progress=False,
        )
    raw = np.fromfile(prefixes["text"] + ".bin", dtype=np.uint16)
    assert raw.size == 3
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tokenized")]
    assert len(summary) == 1 and "1 documents, 3 tokens" in summary[0]


# ---- sample corpus / sentence split ------------------------------------------------------------
def test_split_documents_cuts_at_class_lines():
    """Past ``target_chars``, a top-level or method-level ``class`` line starts a document."""
    source = "x = 1\ny = 2\nclass A:\n    pass\n    class B:\n        pass\n"
    assert split_documents(source, target_chars=5) == [
        "x = 1\ny = 2\n",
        "class A:\n    pass\n",
        "    class B:\n        pass\n",
    ]


def test_sample_build_reports_its_own_duration_and_writes_its_marker(tmp_path):
    """``build_seconds`` is the build's duration (within the wall time measured around the
    call), and the marker file holds the returned info as JSON."""
    data_dir = tmp_path / "sample"
    data_dir.mkdir()
    t0 = time.perf_counter()
    info = _build(str(data_dir), 100_000, 300, 1)
    wall = time.perf_counter() - t0
    assert 0 <= info["build_seconds"] <= wall + 0.01
    marker = (data_dir / "sample_dataset.json").read_text()
    assert json.loads(marker) == info


def test_split_sentences_keeps_abbreviations_and_initials():
    """ "Mr." and an initial ("J.") do not end a sentence; "home." before "He" does."""
    assert split_sentences("Mr. J. Smith went home. He slept.") == [
        "Mr. J. Smith went home.",
        "He slept.",
    ]
