"""Every setting and input name of the evaluators changes the result: hand-computed cases."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.fx.experimental._config as meta_config

from libai.evaluation import (
    AccEvaluator,
    ClsEvaluator,
    DatasetEvaluators,
    PPLEvaluator,
    print_csv_format,
)

# 3 classes; the target's rank in each row: 1st, 2nd, 3rd, 1st
LOGITS = torch.tensor([[3.0, 2.0, 1.0], [1.0, 3.0, 2.0], [1.0, 2.0, 3.0], [0.0, 5.0, 1.0]])
TARGETS = torch.tensor([0, 2, 0, 1])  # top-1: rows 0, 3; top-2: rows 0, 1, 3
OTHER = torch.tensor([1, 1, 1, 0])  # top-1: row 1 only


def acc(evaluator, inputs, outputs) -> dict:
    evaluator.reset()
    evaluator.process(inputs, outputs)
    return evaluator.evaluate()


def test_topk_as_int_and_invalid_topk():
    assert acc(AccEvaluator(topk=2), {"labels": TARGETS}, {"logits": LOGITS}) == {"Acc@2": 75.0}
    for bad in [(), (2, 0), -1]:
        with pytest.raises(ValueError, match="topk"):
            AccEvaluator(topk=bad)


def test_logits_key_picks_the_named_scores():
    # "logits" would give 50 % top-1; the named scores put every target first
    named = torch.nn.functional.one_hot(TARGETS, 3).float()
    outputs = {"logits": LOGITS, "cls_scores": named}
    assert acc(AccEvaluator(logits_key="cls_scores"), {"labels": TARGETS}, outputs) == {
        "Acc@1": 100.0
    }
    assert acc(AccEvaluator(), {"labels": TARGETS}, outputs) == {"Acc@1": 50.0}
    with pytest.raises(KeyError, match="cls_scores"):
        AccEvaluator(logits_key="cls_scores").process({"labels": TARGETS}, {"logits": LOGITS})


def test_ns_labels_only_when_labels_are_absent():
    ev = AccEvaluator()
    assert acc(ev, {"ns_labels": OTHER}, {"logits": LOGITS}) == {"Acc@1": 25.0}
    assert acc(ev, {"labels": TARGETS, "ns_labels": OTHER}, {"logits": LOGITS}) == {"Acc@1": 50.0}
    # a label_key of its own never falls back to LiBai's ns_labels
    with pytest.raises(KeyError, match="cls_label"):
        AccEvaluator(label_key="cls_label").process({"ns_labels": OTHER}, {"logits": LOGITS})
    assert acc(
        AccEvaluator(label_key="cls_label"),
        {"cls_label": OTHER, "labels": TARGETS},
        {"logits": LOGITS},
    ) == {"Acc@1": 25.0}


def test_cls_evaluator_passes_its_settings_on():
    # ignore_index=2 drops row 1: top-1 hits rows 0 and 3 of the 3 left
    ev = ClsEvaluator(topk=(1, 3), label_key="y", logits_key="s", ignore_index=2)
    result = acc(ev, {"y": TARGETS}, {"s": LOGITS})
    assert result == {"Acc@1": pytest.approx(200 / 3), "Acc@3": 100.0}
    assert ClsEvaluator().topk == (1, 5)


def test_scores_on_another_device_than_the_labels():
    # the model's logits on an accelerator, the labels still on the host: "meta" stands in for
    # the accelerator (no data, but every op checks devices as on a GPU, where mixing a host
    # tensor in raises). Boolean indexing on meta needs the "all non-zero" assumption: every
    # label here is valid.
    ev = AccEvaluator(topk=(1, 2))
    with meta_config.patch(meta_nonzero_assume_all_nonzero=True):
        ev.process({"labels": TARGETS}, {"logits": LOGITS.to("meta")})
        ev.process({"labels": TARGETS}, {"logits": LOGITS.to("meta")})


def ppl(evaluator, batches) -> dict:
    evaluator.reset()
    for inputs, loss in batches:
        evaluator.process(inputs, {evaluator.loss_key: torch.tensor(loss)})
    return evaluator.evaluate()


def test_ppl_counts_libai_loss_mask():
    # LiBai's BERT batch: loss_mask marks the positions with a loss; lm_labels alone would
    # count 4 and 2 tokens. 3 tokens at mean 1.0, 1 token at mean 4.0 -> 7 / 4
    batches = [
        ({"loss_mask": torch.tensor([[1, 1, 0, 1, 0]]), "lm_labels": torch.tensor([[7] * 5])}, 1.0),
        ({"loss_mask": torch.tensor([[0, 1]]), "lm_labels": torch.tensor([[7, 8]])}, 4.0),
    ]
    assert ppl(PPLEvaluator(), batches)["loss"] == pytest.approx(7 / 4, rel=1e-12)
    only_mask = [({"loss_mask": b["loss_mask"]}, loss) for b, loss in batches]
    result = ppl(PPLEvaluator(), only_mask)
    assert result == {"ppl": pytest.approx(math.exp(7 / 4)), "loss": pytest.approx(7 / 4)}


def test_ppl_counts_libai_lm_labels_with_its_ignore_index():
    # ignore_index=-1: 2 valid tokens at 2.0 and 1 at 5.0 (-100 is a valid label here) -> 9 / 3
    batches = [
        ({"lm_labels": torch.tensor([[5, -1, -100]])}, 2.0),
        ({"lm_labels": torch.tensor([[-1, 9]])}, 5.0),
    ]
    assert ppl(PPLEvaluator(ignore_index=-1), batches)["loss"] == pytest.approx(3.0, rel=1e-12)
    # the default ignore_index: 2 and 2 valid tokens -> 14 / 4
    assert ppl(PPLEvaluator(), batches)["loss"] == pytest.approx(3.5, rel=1e-12)


def test_ppl_label_key_and_loss_key():
    ev = PPLEvaluator(loss_key="mlm_loss", label_key="tgt", ignore_index=0)
    batches = [
        ({"tgt": torch.tensor([[3, 0, 0]]), "labels": torch.tensor([[3, 3, 3]])}, 1.0),
        ({"tgt": torch.tensor([[3, 3, 3]]), "labels": torch.tensor([[0, 3, 0]])}, 3.0),
    ]
    assert ppl(ev, batches)["loss"] == pytest.approx((1.0 + 9.0) / 4, rel=1e-12)
    # a label_key of its own never falls back to LiBai's names
    for fallback in ["loss_mask", "lm_labels"]:
        with pytest.raises(KeyError, match="tgt"):
            ev.process({fallback: torch.tensor([[1, 1]])}, {"mlm_loss": torch.tensor(1.0)})


def test_ppl_without_tokens_is_nan():
    ev = PPLEvaluator()
    result = ev.evaluate()
    assert sorted(result) == ["loss", "ppl"]
    assert math.isnan(result["ppl"]) and math.isnan(result["loss"])
    ev.process({"labels": torch.full((1, 3), -100)}, {"lm_loss": torch.tensor(2.0)})
    result = ev.evaluate()
    assert sorted(result) == ["loss", "ppl"]
    assert math.isnan(result["ppl"]) and math.isnan(result["loss"])


class Duck:
    """An evaluator by duck typing: no ``needs_predictions`` attribute."""

    def reset(self):
        pass

    def process(self, inputs, outputs):
        pass

    def evaluate(self):
        return {}


def test_needs_predictions_of_merged_evaluators():
    assert DatasetEvaluators([PPLEvaluator()]).needs_predictions is False
    assert DatasetEvaluators([Duck()]).needs_predictions is False
    assert DatasetEvaluators([]).needs_predictions is False
    assert DatasetEvaluators([PPLEvaluator(), AccEvaluator()]).needs_predictions is True
    assert DatasetEvaluators([Duck(), DatasetEvaluators([ClsEvaluator()])]).needs_predictions


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_csv_format_of_task_results():
    # keys with "-" (LiBai's per-class or std entries) are left out of a task's lines
    logger, lines = logging.getLogger("libai.evaluation.utils"), Lines()
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        print_csv_format({"cls": {"Acc@1": 50.0, "Acc@1-std": 0.25, "split": "dev"}})
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    assert lines.lines == [
        "copypaste: Task: cls",
        "copypaste: Acc@1,split",
        "copypaste: 50.0000,dev",
    ]
