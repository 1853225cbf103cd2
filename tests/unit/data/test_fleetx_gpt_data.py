"""FleetX's GPT corpus format (``_ids.npy`` + ``_idx.npz``) gives FleetX's own samples:
compared with FleetX's index functions and sample methods, run from its gpt_dataset.py
(tests/fixtures/fleetx), on a tiny corpus written as FleetX's preprocess_data.py writes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fleetx_reference import fleetx_samples, write_fleetx_corpus

from libai.data.datasets.fleetx_gpt import FleetXGPTDataset, gpt_collate_fn
from libai.data.datasets.gpt_split import GPTDataset
from libai.fleetx.yaml_loaders import COLLATORS, resolve_name


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """60 items of 3..40 tokens (ids < 1000), one corpus prefix in a directory."""
    rng = np.random.RandomState(7)
    docs = [list(rng.randint(1, 1000, size=rng.randint(3, 41))) for _ in range(60)]
    root = tmp_path_factory.mktemp("fleetx_corpus")
    write_fleetx_corpus(str(root / "openwebtext_gpt2"), docs)
    return root


CASES = [
    # (split, max_seq_len, num_samples, mode, seed): one epoch, several epochs (the last
    # shuffled apart), the valid and test splits
    ([949, 50, 1], 16, 20, "Train", 1234),
    ([8, 1, 1], 32, 300, "Train", 42),
    ([6, 3, 1], 8, 10, "Eval", 1024),
    ([6, 3, 1], 8, 40, "Test", 5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[3]}-{c[1]}-{c[2]}")
def test_samples_equal_fleetx_gpt_dataset(corpus, case):
    split, seq, num, mode, seed = case
    ours = GPTDataset(  # the YAML's keys: name GPTDataset, input_dir, split, max_seq_len
        input_dir=str(corpus), split=split, max_seq_len=seq, num_samples=num, mode=mode, seed=seed
    )
    assert isinstance(ours, FleetXGPTDataset)
    ref = fleetx_samples(str(corpus / "openwebtext_gpt2"), split, seq, num, mode, seed)
    if case[1] == 32:
        assert ref.num_epochs > 1  # the multi-epoch path is exercised
    assert len(ours) == num <= len(ref)  # FleetX serves the rest of its last epoch too
    for i in range(num):
        a, b = ours[i], ref[i]
        assert len(a) == len(b) == (2 if mode == "Test" else 4)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and np.array_equal(x, y), (i, x, y)


def test_gpt_collate_fn_by_its_yaml_name(corpus):
    collate = resolve_name("gpt_collate_fn", COLLATORS, "Data.Train.loader.collate_fn")
    assert collate is gpt_collate_fn
    data = FleetXGPTDataset(str(corpus), [949, 50, 1], 16, 8, "Train", 1)
    batch = collate([data[i] for i in range(3)])
    assert list(batch) == ["input_ids", "position_ids", "labels", "loss_mask"]
    for j, key in enumerate(batch):
        expected = torch.as_tensor(np.stack([data[i][j] for i in range(3)]))
        assert torch.equal(batch[key], expected)
    assert batch["input_ids"].shape == (3, 16) and batch["input_ids"].dtype == torch.int64


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"holds no <prefix>_idx.npz"):
        FleetXGPTDataset(str(tmp_path), [949, 50, 1], 16, 8, "Train")


def test_preprocess_data_writes_fleetx_format(tmp_path):
    """tools/preprocess_data.py --output-format fleetx: FleetX's pair, read back with numpy
    as FleetX reads it; the ids are the tokenizer's, the lens the documents' lengths."""
    import importlib.util
    import json
    from pathlib import Path

    from bpe_helpers import train_tiny_bpe

    from libai.tokenizer import GPT2Tokenizer

    repo = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("pre", repo / "tools" / "preprocess_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    vocab, merges = train_tiny_bpe(tmp_path / "bpe")
    texts = ["hello world", "def hello(world):\n    return world + 1\n", "the lazy dog"]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    args = ["--input", str(jsonl), "--tokenizer-name", "GPT2Tokenizer", "--vocab-file", vocab]
    args += ["--merges-file", merges, "--append-eod", "--no-progress", "--output-format"]
    assert module.main([*args, "fleetx", "--output-prefix", str(tmp_path / "out" / "c")]) == 0
    prefix = str(tmp_path / "out" / "c_text_document")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "c_text_document_ids.npy",
        "c_text_document_idx.npz",
    ]
    tok = GPT2Tokenizer(vocab, merges)
    docs = [tok.encode(t) + [tok.eod] for t in texts]
    ids = np.load(prefix + "_ids.npy", mmap_mode="r", allow_pickle=True)
    index = np.load(prefix + "_idx.npz")
    assert ids.dtype == np.uint16 and ids.tolist() == [t for d in docs for t in d]
    assert index["lens"].dtype == np.int32 and index["lens"].tolist() == [len(d) for d in docs]
    assert index["docs"].dtype == np.int64 and index["docs"].tolist() == [0, 1, 2, 3]
    data = FleetXGPTDataset(str(tmp_path / "out"), [1, 0, 0], 4, None, "Train", 1)
    assert data.tokens.prefix == prefix
