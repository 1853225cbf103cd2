"""Evaluators and inference_on_dataset on one process: numbers checked by hand."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from libai import dist
from libai.evaluation import (
    AccEvaluator,
    ClsEvaluator,
    DatasetEvaluator,
    DatasetEvaluators,
    PPLEvaluator,
    flatten_results_dict,
    inference_on_dataset,
    print_csv_format,
)
from libai.models import GPTForPreTraining

TINY = dict(
    hidden_layers=2,
    vocab_size=50,
    hidden_size=16,
    ffn_hidden_size=32,
    num_attention_heads=2,
    max_seq_length=16,
)


@pytest.fixture(scope="module")
def gpt():
    dist.setup_dist_util({})
    torch.manual_seed(0)
    return GPTForPreTraining(**TINY)


def gpt_batches():
    """Unequal batches (4, 4, 2 samples) with different numbers of ignored labels."""
    g = torch.Generator().manual_seed(7)
    batches = []
    for size, ignored in [(4, 0), (4, 9), (2, 5)]:
        tokens = torch.randint(0, TINY["vocab_size"], (size, 9), generator=g)
        labels = tokens[:, 1:].clone()
        labels.view(-1)[:ignored] = -100
        batches.append({"input_ids": tokens[:, :-1], "labels": labels})
    return batches


def test_ppl_and_acc_on_tiny_gpt(gpt):
    batches = gpt_batches()
    # by hand: every valid token's loss from the full-vocab logits, one mean over all tokens
    token_losses, top1, top5 = [], [], []
    gpt.eval()
    with torch.no_grad():
        for batch in batches:
            logits = gpt(input_ids=batch["input_ids"])["logits"].reshape(-1, TINY["vocab_size"])
            labels = batch["labels"].reshape(-1)
            valid = labels != -100
            losses = F.cross_entropy(logits, labels.clamp(min=0), reduction="none")
            token_losses.append(losses[valid])
            ranks = (logits > logits.gather(1, labels.clamp(min=0)[:, None])).sum(-1)[valid]
            top1.append(ranks < 1)
            top5.append(ranks < 5)
    gpt.train()
    mean_loss = torch.cat(token_losses).double().mean().item()
    per_batch_mean = sum(t.double().mean().item() for t in token_losses) / len(token_losses)
    assert abs(mean_loss - per_batch_mean) > 1e-4  # so the weighting is really exercised

    results = inference_on_dataset(gpt, batches, [PPLEvaluator(), AccEvaluator(topk=(1, 5))])
    assert gpt.training  # mode restored
    assert results["loss"] == pytest.approx(mean_loss, rel=1e-5)
    assert results["ppl"] == pytest.approx(math.exp(mean_loss), rel=1e-5)
    assert results["Acc@1"] == pytest.approx(100.0 * torch.cat(top1).float().mean().item())
    assert results["Acc@5"] == pytest.approx(100.0 * torch.cat(top5).float().mean().item())
    assert list(results) == ["ppl", "loss", "Acc@1", "Acc@5"]

    # eval_iter: only the first batch
    first = inference_on_dataset(gpt, batches, PPLEvaluator(), eval_iter=1)
    assert first["loss"] == pytest.approx(token_losses[0].double().mean().item(), rel=1e-5)


def test_acc_on_known_logits():
    # target rank among 6 classes: sample 0 -> 1st, 1 -> 2nd, 2 -> 5th, 3 -> 6th; 4 ignored
    logits = torch.tensor(
        [
            [9.0, 1, 2, 3, 4, 5],
            [1.0, 2, 9, 3, 4, 8],
            [5.0, 4, 3, 2, 1, 0],
            [5.0, 4, 3, 2, 1, 0],
            [0.0, 0, 0, 0, 0, 9],
        ]
    )
    labels = torch.tensor([0, 5, 4, 5, -100])
    ev = AccEvaluator(topk=(1, 2, 5, 10))
    ev.reset()
    ev.process({"labels": labels[:2]}, {"logits": logits[:2]})
    ev.process({"labels": labels[2:]}, {"logits": logits[2:]})
    assert ev.evaluate() == {"Acc@1": 25.0, "Acc@2": 50.0, "Acc@5": 75.0, "Acc@10": 100.0}

    cls = ClsEvaluator()  # LiBai's name: prediction_scores, top-1 and top-5
    cls.process({"labels": labels}, {"prediction_scores": logits})
    assert cls.evaluate() == {"Acc@1": 25.0, "Acc@5": 75.0}
    cls.reset()
    assert math.isnan(cls.evaluate()["Acc@1"])

    with pytest.raises(KeyError, match="logits"):
        AccEvaluator().process({"labels": labels}, {"lm_loss": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="do not match"):
        AccEvaluator().process({"labels": labels[:3]}, {"logits": logits})


def test_ppl_weights_by_valid_tokens():
    ev = PPLEvaluator()
    # batch 1: 3 valid tokens, mean 1.0; batch 2: 1 valid token, mean 3.0 -> 6 / 4 = 1.5
    ev.process({"labels": torch.tensor([[1, 2, 3, -100]])}, {"lm_loss": torch.tensor(1.0)})
    ev.process({"labels": torch.tensor([[-100, 7]])}, {"lm_loss": torch.tensor(3.0)})
    result = ev.evaluate()
    assert result["loss"] == pytest.approx(1.5)
    assert result["ppl"] == pytest.approx(math.exp(1.5))
    ev.reset()
    assert math.isnan(ev.evaluate()["ppl"])
    ev.process({"labels": torch.tensor([[1]])}, {"lm_loss": torch.tensor(1000.0)})
    assert ev.evaluate()["ppl"] == float("inf")
    with pytest.raises(KeyError, match="lm_loss"):
        ev.process({"labels": torch.tensor([[1]])}, {"logits": torch.zeros(1, 1, 3)})
    with pytest.raises(KeyError, match="labels"):
        ev.process({"input_ids": torch.tensor([[1]])}, {"lm_loss": torch.tensor(1.0)})


def test_evaluators_merge_and_callable_model():
    class Counter(DatasetEvaluator):
        def __init__(self, key):
            self.key, self.n = key, 0

        def reset(self):
            self.n = 0

        def process(self, inputs, outputs):
            self.n += 1

        def evaluate(self):
            return {self.key: self.n}

    calls = []

    def model(x):  # a callable; None = "outputs live on another pipeline stage"
        calls.append(x)
        return None if x == 2 else {"y": x}

    data = [{"x": i} for i in range(4)]
    assert inference_on_dataset(model, data, [Counter("a"), Counter("b")]) == {"a": 3, "b": 3}
    assert len(calls) == 4
    merged = DatasetEvaluators([Counter("a"), DatasetEvaluators([Counter("b")])])
    assert inference_on_dataset(model, data, merged) == {"a": 3, "b": 3}
    calls.clear()
    with pytest.raises(KeyError, match="same key"):
        inference_on_dataset(model, data, [Counter("a"), Counter("a")])
    assert inference_on_dataset(model, iter(data), None, eval_iter=2) == {}
    assert len(calls) == 4 + 2
    with pytest.raises(TypeError, match="get_batch"):
        inference_on_dataset(model, [(1, 2)], None)
    res = inference_on_dataset(model, [(5,)], Counter("c"), get_batch=lambda d: {"x": d[0]})
    assert res == {"c": 1}


def test_flatten_and_csv(caplog):
    nested = {"gpt": {"ppl": 3.0, "acc": {"top1": 0.5}}, "loss": 1.0}
    assert flatten_results_dict(nested) == {"gpt/ppl": 3.0, "gpt/acc/top1": 0.5, "loss": 1.0}
    logger = logging.getLogger("libai.evaluation.utils")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="libai.evaluation.utils"):
            print_csv_format({"ppl": 12.3456789, "loss": 2.5})
    finally:
        logger.removeHandler(caplog.handler)
    text = caplog.text
    assert "copypaste: ppl,loss" in text and "copypaste: 12.3457,2.5000" in text
