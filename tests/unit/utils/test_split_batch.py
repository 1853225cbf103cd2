"""libai.utils.batches.split_batch: micro-batches equal the hand-sliced rows of the batch,
in order, with the batch's own container types; other leaves are shared."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import pytest
import torch

from libai.utils.batches import split_batch


class Batch(Mapping):
    """A user's mapping type (not a dict): it must come back as itself."""

    def __init__(self, items=()):
        self._d = dict(items)

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


def rows(t: torch.Tensor, i: int, size: int) -> torch.Tensor:
    return t[i * size : (i + 1) * size]


def test_a_tensor_is_cut_along_dim_zero_in_order():
    t = torch.arange(24).reshape(6, 4)
    parts = split_batch(t, 3)
    assert len(parts) == 3
    for i, part in enumerate(parts):
        assert part.shape == (2, 4) and torch.equal(part, rows(t, i, 2))
    assert [p.shape for p in split_batch(torch.zeros(4, 6), 2)] == [(2, 6), (2, 6)]
    (whole,) = split_batch(t, 1)
    assert torch.equal(whole, t)


@pytest.mark.parametrize("batch, n", [(7, 3), (6, 4), (5, 2), (3, 6)])
def test_a_batch_that_n_does_not_divide_is_refused(batch, n):
    with pytest.raises(
        ValueError, match=rf"local batch size {batch} is not divisible by num_microbatches={n}"
    ):
        split_batch({"input_ids": torch.zeros(batch, 2)}, n)


def test_structure_and_types_are_kept():
    ids = torch.arange(8).reshape(4, 2)
    mask = torch.arange(4) * 10
    labels = torch.arange(4) + 100
    shared = object()
    batch = OrderedDict(
        input_ids=ids,
        extra=[mask, (labels, "tag")],
        config=shared,
        sub=Batch([("labels", labels)]),
    )
    parts = split_batch(batch, 2)
    assert len(parts) == 2
    for i, part in enumerate(parts):
        assert type(part) is OrderedDict and list(part) == ["input_ids", "extra", "config", "sub"]
        assert torch.equal(part["input_ids"], rows(ids, i, 2))
        assert type(part["extra"]) is list and len(part["extra"]) == 2
        assert torch.equal(part["extra"][0], rows(mask, i, 2))
        inner = part["extra"][1]
        assert type(inner) is tuple and len(inner) == 2
        assert torch.equal(inner[0], rows(labels, i, 2)) and inner[1] == "tag"
        assert part["config"] is shared  # other leaves: the same object in every part
        assert type(part["sub"]) is Batch and list(part["sub"]) == ["labels"]
        assert torch.equal(part["sub"]["labels"], rows(labels, i, 2))


def test_plain_leaves_repeat_n_times():
    assert split_batch(None, 3) == [None, None, None]
    assert split_batch("x", 2) == ["x", "x"]
    parts = split_batch((torch.arange(6), 5), 3)
    assert [type(p) for p in parts] == [tuple] * 3
    assert [p[0].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p[1] for p in parts] == [5, 5, 5]
