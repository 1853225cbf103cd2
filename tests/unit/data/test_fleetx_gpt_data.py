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
