"""inference_on_dataset: which batches it runs, where it puts them, what it returns."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from libai.evaluation import DatasetEvaluator, PPLEvaluator, inference_on_dataset


class Counter(DatasetEvaluator):
    """Records the ``i`` of every batch it processed."""

    def reset(self):
        self.seen = []

    def process(self, inputs, outputs):
        self.seen.append(int(inputs["i"]))

    def evaluate(self):
        return {"seen": list(self.seen)}


def echo(i):
    return {"i": i}


class Epochs:
    """``len()`` is one epoch of ``n`` batches; iterating runs two epochs (an endless sampler
    would run forever): the loop must stop after ``len()`` batches (or ``eval_iter``)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        for _ in range(2):
            for i in range(self.n):
                yield {"i": i}


def test_stops_after_len_or_eval_iter():
    assert inference_on_dataset(echo, Epochs(3), Counter()) == {"seen": [0, 1, 2]}
    # eval_iter beyond len(): still one epoch
    assert inference_on_dataset(echo, Epochs(3), Counter(), eval_iter=10) == {"seen": [0, 1, 2]}
    assert inference_on_dataset(echo, Epochs(3), Counter(), eval_iter=2) == {"seen": [0, 1]}
    with pytest.raises(ValueError, match="eval_iter"):
        inference_on_dataset(echo, Epochs(3), Counter(), eval_iter=0)


def test_loader_without_len_runs_to_its_end():
    gen = ({"i": i} for i in range(7))  # no len(), no eval_iter: every batch, no ETA to log
    assert inference_on_dataset(echo, gen, Counter()) == {"seen": list(range(7))}


def test_empty_loader_gives_the_evaluator_result():
    result = inference_on_dataset(echo, [], PPLEvaluator())
    assert sorted(result) == ["loss", "ppl"] and math.isnan(result["loss"])
    assert inference_on_dataset(echo, [], Counter()) == {"seen": []}


def test_evaluator_returning_none_gives_an_empty_dict():
    class Silent(DatasetEvaluator):
        def evaluate(self):
            return None

    assert inference_on_dataset(echo, [{"i": 0}], Silent()) == {}


class OnMeta(nn.Module):
    """A model whose weights live on another device: "meta" stands in for an accelerator."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.empty(2, device="meta"))
        self.calls = []

    def forward(self, x, tag):
        self.calls.append((x.device.type, tag))
        return {"y": x * self.w}


def test_batches_are_moved_to_the_model_device():
    model = OnMeta()
    data = [{"x": torch.ones(2), "tag": "a"}, {"x": torch.zeros(2), "tag": 7}]
    assert inference_on_dataset(model, data, None) == {}
    assert model.calls == [("meta", "a"), ("meta", 7)]  # tensors moved, the rest passed as is

    # with get_batch= the batch is the caller's: nothing is moved
    model.calls.clear()
    inference_on_dataset(model, data, None, get_batch=lambda d: {**d, "x": d["x"].to("meta")})
    assert model.calls == [("meta", "a"), ("meta", 7)]
    model.calls.clear()
    with pytest.raises(RuntimeError, match="device"):
        inference_on_dataset(model, data, None, get_batch=lambda d: dict(d))
