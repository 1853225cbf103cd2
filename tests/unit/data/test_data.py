"""Indexed datasets, GPT samples, split strings, resumable samplers, loaders, preprocessing and
the built-in sample dataset. Single process; tiny data built in tmp_path."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from bpe_helpers import SAMPLE_TEXTS, train_tiny_bpe, write_indexed

from libai import dist
from libai.config import LazyCall, LazyConfig, instantiate
from libai.data import (
    CyclicSampler,
    GPT2Dataset,
    SingleRoundSampler,
    build_nlp_train_val_test_loader,
    build_train_valid_test_datasets,
    get_indexed_dataset,
    trivial_batch_collator,
)
from libai.data.data_utils import (
    MMapIndexedDataset,
    MMapIndexedDatasetBuilder,
    get_train_valid_test_split_,
    parse_splits,
)
from libai.data.datasets.gpt_dataset import build_sample_idx
from libai.tokenizer import GPT2Tokenizer

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module", autouse=True)
def single_process_mesh():
    dist.setup_dist_util({})


def random_docs(n: int, seed: int = 0, low: int = 1, high: int = 40, vocab: int = 1000):
    rng = np.random.RandomState(seed)
    return [rng.randint(0, vocab, size=rng.randint(low, high)).tolist() for _ in range(n)]


# ---- indexed dataset -----------------------------------------------------------------------------
def test_builder_reader_round_trip_and_megatron_byte_layout(tmp_path):
    docs = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [65000, 0]]
    prefix = write_indexed(tmp_path / "ds", docs, dtype=np.uint16)
    ds = MMapIndexedDataset(prefix)
    assert len(ds) == 4
    assert [ds[i].tolist() for i in range(4)] == docs
    assert ds.sizes.tolist() == [3, 1, 5, 2]
    assert ds.doc_idx.tolist() == [0, 1, 2, 3, 4]
    assert ds.pointers.tolist() == [0, 6, 8, 18]  # byte offsets, 2 bytes per uint16
    assert ds.dtype == np.uint16
    assert ds.get(2, offset=1, length=3).tolist() == [6, 7, 8]
    assert ds.get(2, offset=3).tolist() == [8, 9]
    assert [a.tolist() for a in ds[1:3]] == [[4], [5, 6, 7, 8, 9]]
    assert os.path.getsize(prefix + ".bin") == 11 * 2

    raw = open(prefix + ".idx", "rb").read()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, n, d = struct.unpack("<QBQQ", raw[9:34])
    assert (version, code, n, d) == (1, 8, 4, 5)  # dtype code 8 = uint16
    body = raw[34:]
    assert np.frombuffer(body[:16], np.int32).tolist() == [3, 1, 5, 2]
    assert np.frombuffer(body[16:48], np.int64).tolist() == [0, 6, 8, 18]
    assert np.frombuffer(body[48:], np.int64).tolist() == [0, 1, 2, 3, 4]

    clone = pickle.loads(pickle.dumps(ds))  # DataLoader workers re-open by path
    assert clone[2].tolist() == docs[2]
    with pytest.raises(ValueError, match="do not fit"):
        MMapIndexedDatasetBuilder(str(tmp_path / "x.bin"), dtype=np.uint16).add_item([70000])


def test_multi_sequence_documents_and_merge(tmp_path):
    b = MMapIndexedDatasetBuilder(str(tmp_path / "a.bin"), dtype=np.int32)
    b.add_item(torch.tensor([1, 2]))
    b.add_item(np.array([3]))
    b.end_document()
    b.add_item([100000])
    b.end_document()
    b.finalize(str(tmp_path / "a.idx"))
    write_indexed(tmp_path / "b", [[7, 8, 9], [10]], dtype=np.int32)

    m = MMapIndexedDatasetBuilder(str(tmp_path / "m.bin"), dtype=np.int32)
    m.merge_file_(str(tmp_path / "a"))
    m.merge_file_(str(tmp_path / "b"))
    m.finalize(str(tmp_path / "m.idx"))
    merged = MMapIndexedDataset(str(tmp_path / "m"))
    assert [merged[i].tolist() for i in range(len(merged))] == [
        [1, 2],
        [3],
        [100000],
        [7, 8, 9],
        [10],
    ]
    assert merged.doc_idx.tolist() == [0, 2, 3, 4, 5]
    write_indexed(tmp_path / "c", [[1]], dtype=np.uint16)
    other = MMapIndexedDatasetBuilder(str(tmp_path / "n.bin"), dtype=np.int32)
    with pytest.raises(ValueError, match="dtype uint16"):
        other.merge_file_(str(tmp_path / "c"))
    other.close()


def test_missing_prefix_names_both_files(tmp_path):
    prefix = str(tmp_path / "nothing_text_document")
    with pytest.raises(FileNotFoundError) as e:
        get_indexed_dataset(prefix)
    msg = str(e.value)
    assert prefix + ".idx" in msg and prefix + ".bin" in msg and "preprocess_data.py" in msg
    write_indexed(tmp_path / "half", [[1, 2]])
    os.remove(tmp_path / "half.bin")
    with pytest.raises(FileNotFoundError, match=r"half\.bin does not exist"):
        get_indexed_dataset(str(tmp_path / "half"))


def test_truncated_bin_and_corrupt_idx(tmp_path):
    prefix = write_indexed(tmp_path / "ds", random_docs(20))
    size = os.path.getsize(prefix + ".bin")
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(ValueError) as e:
        MMapIndexedDataset(prefix)
    msg = str(e.value)
    assert "truncated" in msg and prefix + ".bin" in msg and prefix + ".idx" in msg
    assert f"ending at byte {size}" in msg

    prefix = write_indexed(tmp_path / "ds2", random_docs(5))
    raw = open(prefix + ".idx", "rb").read()
    open(prefix + ".idx", "wb").write(raw[:-8])
    with pytest.raises(ValueError, match="index file is truncated or corrupt"):
        MMapIndexedDataset(prefix)
    open(prefix + ".idx", "wb").write(b"NOTANIDX" + raw[8:])
    with pytest.raises(ValueError, match="not a Megatron mmap index"):
        MMapIndexedDataset(prefix)
    with pytest.raises(ValueError, match=r"is not a b'TNTIDX.*\(lazy / cached\) dataset"):
        get_indexed_dataset(prefix, data_impl="lazy")  # an mmap (here corrupt) file
    with pytest.raises(ValueError, match="data_impl='fast' is not supported"):
        get_indexed_dataset(prefix, data_impl="fast")


# ---- GPT samples ------------------------------------------------------------------------------
def megatron_build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    """Line-by-line port of Megatron's C++ helpers.build_sample_idx, as the reference."""
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = np.zeros((num_samples + 1, 2), dtype=np.int64)
    sample_index, doc_idx_index, doc_offset = 0, 0, 0
    sample_idx[0] = (0, 0)
    sample_index += 1
    while sample_index <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            doc_length = sizes[doc_idx[doc_idx_index]] - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        sample_idx[sample_index] = (doc_idx_index, doc_offset)
        sample_index += 1
    return sample_idx


@pytest.mark.parametrize("seq_length", [1, 3, 7, 16, 50])
def test_sample_idx_equals_megatron_helper(seq_length):
    rng = np.random.RandomState(seq_length)
    sizes = rng.randint(0, 12, size=40).astype(np.int32)  # includes empty documents
    sizes[0] = 5
    doc_idx = np.tile(np.arange(40), 3)
    rng.shuffle(doc_idx)
    tokens = int(sizes.sum())
    ours = build_sample_idx(sizes, doc_idx, seq_length, 3, tokens)
    ref = megatron_build_sample_idx(sizes, doc_idx, seq_length, 3, tokens)
    # boundaries may name an empty document where Megatron names the next one: same tokens
    starts = np.concatenate([[0], np.cumsum(sizes[doc_idx])])
    assert np.array_equal(starts[ours[:, 0]] + ours[:, 1], starts[ref[:, 0]] + ref[:, 1])
    assert len(ours) == len(ref)


@pytest.fixture()
def corpus(tmp_path):
    docs = random_docs(60, seed=1)
    return docs, get_indexed_dataset(write_indexed(tmp_path / "corpus", docs))


def test_gpt_samples_span_documents_with_shifted_labels(corpus):
    docs, indexed = corpus
    ds = GPT2Dataset("t", indexed_dataset=indexed, max_seq_length=16, seed=7)
    stream = np.concatenate([np.asarray(docs[d]) for d in ds.doc_idx])
    total = sum(len(d) for d in docs)
    assert len(ds) == (total - 1) // 16  # one epoch
    spans = 0
    for i in range(len(ds)):
        sample = ds[i]
        assert sample["input_ids"].dtype == torch.long and sample["input_ids"].shape == (16,)
        assert torch.equal(sample["input_ids"][1:], sample["labels"][:-1])
        j = int(ds.shuffle_idx[i])
        expected = stream[j * 16 : j * 16 + 17]
        assert sample["input_ids"].tolist() == expected[:-1].tolist()
        assert sample["labels"].tolist() == expected[1:].tolist()
        spans += int(ds.sample_idx[j][0] != ds.sample_idx[j + 1][0])
    assert spans > len(ds) // 2  # most 17-token samples cross a document boundary


def test_gpt_dataset_is_seeded_and_repeats_epochs(corpus):
    _, indexed = corpus
    a = GPT2Dataset("a", indexed_dataset=indexed, max_seq_length=8, max_num_samples=500, seed=3)
    b = GPT2Dataset("b", indexed_dataset=indexed, max_seq_length=8, max_num_samples=500, seed=3)
    c = GPT2Dataset("c", indexed_dataset=indexed, max_seq_length=8, max_num_samples=500, seed=4)
    assert len(a) == 500  # more than one epoch (about 140 samples each)
    assert all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(0, 500, 7))
    assert any(not torch.equal(a[i]["input_ids"], c[i]["input_ids"]) for i in range(20))
    assert np.bincount(a.doc_idx).min() == np.bincount(a.doc_idx).max()  # whole epochs


def test_empty_or_too_small_split_is_an_error(corpus):
    _, indexed = corpus
    with pytest.raises(ValueError, match="not enough for one sample"):
        GPT2Dataset("tiny", indexed_dataset=indexed, max_seq_length=10_000)
    with pytest.raises(ValueError, match="0 documents hold 0 tokens"):
        GPT2Dataset("none", indexed_dataset=indexed, max_seq_length=8, documents=[], num_samples=4)


def test_split_parsing():
    assert get_train_valid_test_split_(1000, "949,50,1") == [0, 949, 999, 1000]
    assert get_train_valid_test_split_(1000, [949.0, 50.0, 1.0]) == [0, 949, 999, 1000]
    assert get_train_valid_test_split_(10, "98,2") == [0, 10, 10, 10]
    assert get_train_valid_test_split_(100, "8/1/1") == [0, 80, 90, 100]
    assert get_train_valid_test_split_(7, "1,1,1") == [0, 3, 5, 7]
    assert parse_splits("1") == [1.0, 0.0, 0.0]
    for bad in ("a,b", "0,0,0", "-1,2", "1,2,3,4"):
        with pytest.raises(ValueError, match="split"):
            parse_splits(bad)


def test_train_valid_test_datasets_use_disjoint_documents(corpus):
    _, indexed = corpus
    cfg = LazyCall(GPT2Dataset)(name="gpt", indexed_dataset=indexed, max_seq_length=8, seed=1)
    train, valid, test = build_train_valid_test_datasets(
        [cfg], [[8.0, 1.0, 1.0]], [1.0], [40, 10, 0]
    )
    assert (len(train), len(valid), test) == (40, 10, None)
    assert train.documents.tolist() == list(range(48))
    assert valid.documents.tolist() == list(range(48, 54))
    assert set(np.unique(valid.doc_idx)) <= set(range(48, 54))
    # an empty valid/test split gives no dataset (and a warning); an empty train split raises
    assert build_train_valid_test_datasets([cfg], ["98,2,0"], [1.0], [4, 4, 4])[2] is None
    with pytest.raises(ValueError, match="train split of dataset 0 is empty"):
        build_train_valid_test_datasets([cfg], ["0,1,1"], [1.0], [4, 4, 4])
    with pytest.raises(ValueError, match="one split"):
        build_train_valid_test_datasets([cfg], [[1, 1, 1], [1, 1, 1]], [1.0], None)


def test_blended_datasets_follow_weights(tmp_path):
    ix1 = get_indexed_dataset(write_indexed(tmp_path / "a", random_docs(30, seed=2)))
    ix2 = get_indexed_dataset(write_indexed(tmp_path / "b", random_docs(30, seed=3)))
    cfgs = [
        LazyCall(GPT2Dataset)(name=n, indexed_dataset=ix, max_seq_length=4, seed=1)
        for n, ix in (("a", ix1), ("b", ix2))
    ]
    train, valid, test = build_train_valid_test_datasets(
        cfgs, [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], [3.0, 1.0], [400, 8, 2]
    )
    assert isinstance(valid, GPT2Dataset) and valid.name == "b/valid"  # a has no valid share
    assert len(valid) == 8 and test is None
    assert len(train) == 400
    assert np.bincount(train.dataset_index).tolist() == [300, 100]
    assert train[5]["input_ids"].shape == (4,)


# ---- samplers ---------------------------------------------------------------------------------
def take(sampler, n):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


def test_cyclic_sampler_shards_over_data_parallel_ranks():
    data = list(range(50))
    ranks = [
        take(CyclicSampler(data, 3, True, 0, r, 2, seed=5), 20)  # 20 steps = 2.5 epochs
        for r in range(2)
    ]
    single = take(CyclicSampler(data, 6, True, 0, 0, 1, seed=5), 20)
    for step in range(20):
        a, b = ranks[0][step], ranks[1][step]
        assert len(a) == len(b) == 3 and not set(a) & set(b)
        assert a + b == single[step]  # same global batch as one rank with micro 6
    epoch0 = [i for step in range(8) for r in range(2) for i in ranks[r][step]]
    assert len(set(epoch0)) == 48  # an epoch = 8 steps of 6, no repeats
    epoch1 = [i for step in range(8, 16) for i in ranks[0][step] + ranks[1][step]]
    assert epoch0 != epoch1  # reshuffled with seed + epoch


@pytest.mark.parametrize("consumed_steps", [1, 7, 8, 13])
def test_cyclic_sampler_resumes_from_consumed_samples(consumed_steps):
    data = list(range(50))
    for rank in range(2):
        full = take(CyclicSampler(data, 3, True, 0, rank, 2, seed=9), 24)
        resumed = CyclicSampler(data, 3, True, consumed_steps * 6, rank, 2, seed=9)
        assert take(resumed, 24 - consumed_steps) == full[consumed_steps:]
        assert resumed.consumed_samples == 24 * 6
    sampler = CyclicSampler(data, 3, True, 0, 0, 2, seed=9)
    first = take(sampler, 5)
    assert take(sampler, 3) == take(CyclicSampler(data, 3, True, 30, 0, 2, seed=9), 3)
    assert first[0] != take(sampler, 1)[0]
    with pytest.raises(ValueError, match="multiple of"):
        CyclicSampler(data, 3, True, 7, 0, 2)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        CyclicSampler(list(range(5)), 3, True, 0, 0, 2)
    with pytest.raises(ValueError, match="data_parallel_rank=2"):
        CyclicSampler(data, 3, True, 0, 2, 2)


def test_single_round_sampler_covers_every_sample_once():
    data = list(range(23))
    seen = []
    for rank in range(3):
        s = SingleRoundSampler(data, 4, data_parallel_rank=rank, data_parallel_size=3)
        batches = list(s)
        assert len(batches) == len(s)
        seen += [i for b in batches for i in b]
    assert sorted(seen) == data
    s = SingleRoundSampler(data, 4, shuffle=True, seed=1, drop_last=True)
    assert len(list(s)) == len(s) == 5 and all(len(b) == 4 for b in s)


# ---- loaders ----------------------------------------------------------------------------------
def test_collate_stacks_dict_samples():
    batch = trivial_batch_collator(
        [{"input_ids": torch.arange(3), "labels": torch.arange(3) + 1}] * 2
    )
    assert batch["input_ids"].shape == (2, 3) and batch["labels"][1].tolist() == [1, 2, 3]


def test_train_val_test_loaders_from_lazy_configs_resume(tmp_path):
    prefix = write_indexed(tmp_path / "corpus", random_docs(600, seed=4))
    dataset = [
        LazyCall(GPT2Dataset)(
            name="gpt-2",
            data_prefix=prefix,
            indexed_dataset=LazyCall(get_indexed_dataset)(data_prefix=prefix, skip_warmup=True),
            max_seq_length=12,
            seed=1234,
        )
    ]
    kwargs = dict(
        dataset=dataset,
        splits=[[949.0, 50.0, 1.0]],
        weights=[1.0],
        train_val_test_num_samples=[64, 16, 4],
        train_batch_size=4,
        test_batch_size=2,
        seed=3,
    )
    train, valid, test = build_nlp_train_val_test_loader(**kwargs)
    assert (len(train.dataset), len(valid.dataset), len(test.dataset)) == (64, 16, 4)
    batches = [b for _, b in zip(range(20), train)]  # 20 > 16 steps: wraps into epoch 2
    assert set(batches[0]) == {"input_ids", "labels"}
    assert batches[0]["input_ids"].shape == (4, 12) and batches[0]["labels"].dtype == torch.long
    assert len(list(valid)) == 8 and len(list(test)) == 2
    resumed, _, _ = build_nlp_train_val_test_loader(**kwargs, consumed_samples=6 * 4)
    for ref, got in zip(batches[6:], resumed):
        assert torch.equal(ref["input_ids"], got["input_ids"])
        assert torch.equal(ref["labels"], got["labels"])


def test_data_config_file_builds_loaders(tmp_path):
    prefix = write_indexed(tmp_path / "corpus_text_document", random_docs(300, seed=5))
    vocab, merges = train_tiny_bpe(tmp_path)
    cfg = LazyConfig.load(str(REPO / "configs/common/data/gpt_dataset.py"))
    LazyConfig.apply_overrides(
        cfg,
        [
            f"tokenization.tokenizer.vocab_file={vocab}",
            f"tokenization.tokenizer.merges_file={merges}",
            f"dataloader.train.dataset.0.data_prefix={prefix}",
            "dataloader.train.dataset.0.max_seq_length=16",
        ],
    )
    assert cfg.dataloader.train.dataset[0].indexed_dataset.data_prefix == prefix
    assert isinstance(instantiate(cfg.tokenization.tokenizer), GPT2Tokenizer)
    train, valid, test = instantiate(
        cfg.dataloader.train,
        dataset=cfg.dataloader.train.dataset,  # keep the dataset configs lazy
        train_val_test_num_samples=[32, 8, 2],
        train_batch_size=2,
        test_batch_size=2,
    )
    first = next(iter(train))
    assert first["input_ids"].shape == (2, 16)
    # the validation split: the 8 samples asked for, in batches of 2, inputs shifted by one
    assert len(valid.dataset) == 8 and len(list(valid)) == 4
    for batch in valid:
        assert batch["input_ids"].shape == (2, 16)
        assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    assert test is None  # 1/1000 of 300 documents is no document: no test split (a warning)
    # a fully recursive instantiate (datasets built first) gives the same batches
    train2, _, _ = instantiate(
        cfg.dataloader.train,
        train_val_test_num_samples=[32, 8, 2],
        train_batch_size=2,
        test_batch_size=2,
    )
    assert torch.equal(first["labels"], next(iter(train2))["labels"])


# ---- preprocessing ----------------------------------------------------------------------------
def run_preprocess(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "tools/preprocess_data.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_tiny_bpe(tmp_path_factory.mktemp("bpe"))


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def test_preprocess_data_end_to_end(tmp_path, bpe):
    texts = SAMPLE_TEXTS + [""]  # an empty text gives no document
    rows = [{"text": t, "meta": i} for i, t in enumerate(texts)]
    jsonl = write_jsonl(tmp_path / "in.jsonl", rows)
    common = ["--input", jsonl, "--json-keys", "text", "--tokenizer-name", "GPT2Tokenizer"]
    common += ["--vocab-file", bpe[0], "--merges-file", bpe[1], "--append-eod"]
    out = run_preprocess(*common, "--output-prefix", tmp_path / "out" / "p", "--workers", "2")
    assert out.returncode == 0, out.stderr
    assert "tokenizing" in out.stderr  # the progress bar
    prefix = str(tmp_path / "out" / "p_text_document")
    assert os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")
    ds = MMapIndexedDataset(prefix)
    tok = GPT2Tokenizer(*bpe)
    assert len(ds) == len(SAMPLE_TEXTS) and ds.dtype == np.uint16
    for i, text in enumerate(SAMPLE_TEXTS):
        assert ds[i].tolist() == tok.encode(text) + [tok.eod]
    one = run_preprocess(*common, "--output-prefix", tmp_path / "one", "--workers", "1")
    assert one.returncode == 0, one.stderr
    for ext in (".bin", ".idx"):  # the same bytes whatever the number of workers
        assert (
            open(prefix + ext, "rb").read()
            == open(f"{tmp_path}/one_text_document{ext}", "rb").read()
        )


def load_preprocess_main():
    spec = importlib.util.spec_from_file_location(
        "preprocess_data", REPO / "tools/preprocess_data.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_preprocess_data_bad_input(tmp_path, bpe, capsys):
    main = load_preprocess_main()
    jsonl = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}, {"body": "b"}, {"text": "c"}])
    base = ["--json-keys", "text", "--tokenizer-name", "GPT2Tokenizer"]
    base += ["--output-prefix", str(tmp_path / "o")]

    def fails(input_file, vocab, merges, message):
        args = [
            "--input",
            str(input_file),
            "--vocab-file",
            str(vocab),
            "--merges-file",
            str(merges),
        ]
        assert main(args + base) == 1
        err = capsys.readouterr().err
        assert message in err, err

    fails(tmp_path / "missing.jsonl", *bpe, "missing.jsonl does not exist")
    fails(jsonl, tmp_path / "v.json", bpe[1], "v.json does not exist")
    fails(jsonl, bpe[0], tmp_path / "m.txt", "m.txt does not exist")
    fails(jsonl, *bpe, "in.jsonl:2: JSON key 'text' is missing from this line (its keys: ['body'])")
    assert not list(tmp_path.glob("o_*"))  # nothing half-written is left behind
    with pytest.raises(SystemExit):  # GPT-2 BPE needs merges
        main(["--input", jsonl, "--vocab-file", bpe[0]] + base)


# ---- the built-in sample dataset --------------------------------------------------------------
def test_sample_dataset_builds_once_and_concurrently(tmp_path, monkeypatch):
    from libai.data import sample_corpus

    builds = []
    real_build = sample_corpus._build

    def counting_build(*args, **kwargs):
        builds.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(sample_corpus, "_build", counting_build)
    data_dir = tmp_path / "sample"
    results = []

    def call():
        results.append(
            sample_corpus.ensure_sample_dataset(data_dir, max_bytes=200_000, vocab_size=1000)
        )

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(results) == 2 and results[0] == results[1]
    paths = results[0]
    info = json.load(open(data_dir / "sample_dataset.json"))
    assert info["vocab_size"] == 1000 and info["documents"] > 50 and info["tokens"] > 40_000
    tok = GPT2Tokenizer(paths["vocab_file"], paths["merges_file"])
    ds = MMapIndexedDataset(paths["data_prefix"])
    assert len(ds) == info["documents"] and ds[0][-1] == tok.eod
    first_doc = json.loads(open(paths["corpus"]).readline())["text"]
    assert tok.decode(ds[0][:-1]) == first_doc
    mtime = os.path.getmtime(paths["data_prefix"] + ".bin")
    assert sample_corpus.ensure_sample_dataset(data_dir) == paths  # reused, not rebuilt
    assert len(builds) == 1 and os.path.getmtime(paths["data_prefix"] + ".bin") == mtime

    # a config asks for the sample dataset with ${libai_sample:...}, never by file names: then
    # it is built in the cache directory only (resolved when used, so the environment applies)
    cache = tmp_path / "cache"
    monkeypatch.setenv("LIBAI_SAMPLE_DATA_DIR", str(cache))
    monkeypatch.setattr(
        sample_corpus,
        "ensure_sample_dataset",
        lambda d, workers=1: builds.append(d) or sample_corpus.sample_dataset_paths(d),
    )
    cfg = LazyConfig.load(str(REPO / "configs/common/data/gpt_dataset.py"))
    assert cfg.tokenization.tokenizer.vocab_file == str(cache / "gpt2-vocab.json")
    assert cfg.dataloader.train.dataset[0].indexed_dataset.data_prefix == str(
        cache / "stdlib_text_document"
    )
    assert sample_corpus.prepare_sample_data(cfg)["data_dir"] == str(cache)
    assert builds[-1] == str(cache)
    # the user's own files, named like the sample's: nothing is built, anywhere
    other = tmp_path / "other"
    mine = [
        f"tokenization.tokenizer.vocab_file={other}/gpt2-vocab.json",
        f"tokenization.tokenizer.merges_file={other}/gpt2-merges.txt",
        f"dataloader.train.dataset.0.data_prefix={other}/stdlib_text_document",
    ]
    del builds[:]
    assert sample_corpus.prepare_sample_data(LazyConfig.apply_overrides(cfg, mine)) is None
    assert builds == [] and not other.exists()
    # only the data is the user's: the sample vocabulary is still asked for, built in the cache
    cfg = LazyConfig.load(str(REPO / "configs/common/data/gpt_dataset.py"))
    LazyConfig.apply_overrides(cfg, mine[2:])
    assert sample_corpus.prepare_sample_data(cfg)["data_dir"] == str(cache)
    assert builds == [str(cache)] and not other.exists()


def libai_reader():
    """LiBai's own indexed_dataset.py (tests/fixtures/libai, unmodified); its one OneFlow name,
    ``flow.utils.data.Dataset``, stood in for by ``object`` while it is imported."""
    import types

    stand_in = types.ModuleType("oneflow")
    stand_in.utils = types.SimpleNamespace(data=types.SimpleNamespace(Dataset=object))
    path = REPO / "tests/fixtures/libai/libai/data/data_utils/indexed_dataset.py"
    spec = importlib.util.spec_from_file_location("libai_own_indexed_dataset", path)
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("oneflow")
    sys.modules["oneflow"] = stand_in
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["oneflow"]
        else:
            sys.modules["oneflow"] = saved
    return module


@pytest.mark.parametrize("impl", ["mmap", "lazy", "cached"])
def test_preprocess_with_libai_flags_reads_in_libai_own_reader(tmp_path, bpe, impl):
    """LiBai's documented command (--dataset-impl mmap|lazy|cached, --log-interval): the
    files read the same token ids in LiBai's own reader and in ours (data_impl, or infer)."""
    from libai.data.data_utils import make_dataset

    jsonl = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in SAMPLE_TEXTS])
    out = run_preprocess(
        *["--input", jsonl, "--json-keys", "text", "--tokenizer-name", "GPT2Tokenizer"],
        *["--vocab-file", bpe[0], "--merges-file", bpe[1], "--append-eod", "--no-progress"],
        *["--output-prefix", tmp_path / "p", "--dataset-impl", impl, "--log-interval", "8"],
    )
    assert out.returncode == 0, out.stderr
    assert "processed 8 documents" in out.stderr
    prefix = str(tmp_path / "p_text_document")
    tok = GPT2Tokenizer(*bpe)
    want = [tok.encode(text) + [tok.eod] for text in SAMPLE_TEXTS]
    theirs = libai_reader()
    reader = {
        "mmap": theirs.MMapIndexedDataset,
        "lazy": theirs.IndexedDataset,
        "cached": theirs.IndexedCachedDataset,
    }[impl](prefix)
    if impl == "cached":
        reader.prefetch(range(len(want)))
    assert theirs.infer_dataset_impl(prefix) == ("mmap" if impl == "mmap" else "cached")
    assert [reader[i].tolist() for i in range(len(reader))] == want
    assert list(reader.doc_idx) == list(range(len(want) + 1))
    for data_impl in (impl, "infer"):
        ours = make_dataset(prefix, data_impl)
        assert [ours[i].tolist() for i in range(len(ours))] == want
        assert ours.get(3, 1, 2).tolist() == want[3][1:3]
