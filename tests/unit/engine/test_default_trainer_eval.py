"""``DefaultTrainer`` in one process, on the tiny LM of ``default_trainer_helpers``. Evaluation: LiBai's ``cfg.dataloader.test``
loaders (used when the train builder gives no valid loader, as LiBai's vision configs do)
are each evaluated, their keys prefixed ``test<i>/`` when there are several; an explicit
loader is evaluated as given. The reference is the perplexity of each dataset computed here
from the same model: ``exp(sum of token losses / tokens)``. Resume: a run stopped and resumed
ends with the weights of the run trained straight through. The building of a trainer:
``test_default_trainer_build.py``."""

from __future__ import annotations

import logging

import pytest
import torch
from default_trainer_helpers import (
    Tokens,
    batch_losses,
    collate,
    reference_acc,
    reference_ppl,
    weights,
)

from libai.config import LazyCall
from libai.data.build import build_nlp_test_loader
from libai.engine.default import DefaultTrainer
from libai.evaluation import AccEvaluator, DatasetEvaluators, PPLEvaluator
from libai.runtime.trainer import HookBase


def recording_test_loader(dataset, test_batch_size, seed, collate_fn):
    """LiBai's test loader builder's arguments, kept on the loader it builds."""
    loader = build_nlp_test_loader(dataset, test_batch_size, seed=seed, collate_fn=collate_fn)
    loader.given = {"test_batch_size": test_batch_size, "seed": seed}
    return loader


def test_several_test_loaders_are_each_evaluated_with_prefixed_keys(trainer_for):
    sets = [(7, 1), (5, 2)]
    trainer = trainer_for(sets)
    assert trainer.valid_loader is None and len(trainer.extra_test_loaders) == 2
    results = trainer.evaluate()
    assert sorted(results) == ["test0/loss", "test0/ppl", "test1/loss", "test1/ppl"]
    for i, (n, seed) in enumerate(sets):
        assert results[f"test{i}/ppl"] == pytest.approx(reference_ppl(trainer.model, n, seed))
    assert results["test0/ppl"] != pytest.approx(results["test1/ppl"])


def test_one_test_loader_gives_unprefixed_keys(trainer_for):
    trainer = trainer_for([(7, 3)])
    results = trainer.evaluate()
    assert sorted(results) == ["loss", "ppl"]
    assert results["ppl"] == pytest.approx(reference_ppl(trainer.model, 7, 3))


def test_an_explicit_loader_is_evaluated_as_given(trainer_for):
    trainer = trainer_for([(7, 1), (5, 2)])
    results = trainer.evaluate(trainer.extra_test_loaders[1])
    assert sorted(results) == ["loss", "ppl"]
    assert results["ppl"] == pytest.approx(reference_ppl(trainer.model, 5, 2))


def test_no_test_loader_config_gives_none(trainer_for):
    trainer = trainer_for([])
    assert trainer.extra_test_loaders == []
    assert DefaultTrainer.build_test_loader(trainer.cfg) == []


def test_an_evaluator_that_needs_predictions_gets_the_logits(trainer_for):
    trainer = trainer_for([(7, 4)], evaluator=AccEvaluator)
    results = trainer.evaluate()
    assert results == {"Acc@1": pytest.approx(reference_acc(trainer.model, 7, 4))}


def test_a_single_test_loader_node_gets_the_run_batch_size_and_seed(trainer_for):
    """``dataloader.test`` may be one node rather than a list (LiBai accepts both); each
    gets ``train.test_micro_batch_size`` and ``train.seed``, as LiBai's trainer passes."""
    trainer = trainer_for([])
    cfg = trainer.cfg
    cfg.dataloader.test = LazyCall(recording_test_loader)(
        dataset=[Tokens(5, 6)], collate_fn=collate
    )
    cfg.train.seed, cfg.train.test_micro_batch_size = 77, 2
    (loader,) = DefaultTrainer.build_test_loader(cfg)
    assert loader.given == {"test_batch_size": 2, "seed": 77}
    assert [len(b["input_ids"]) for b in loader] == [2, 2, 1]


class MeanLoss:
    """A duck-typed evaluator (no DatasetEvaluator base, no ``needs_predictions``): the
    mean of the batch losses it is given, and the output keys it saw."""

    def reset(self):
        self.losses, self.keys = [], set()

    def process(self, inputs, outputs):
        self.keys |= set(outputs)
        self.losses.append(float(outputs["lm_loss"]))

    def evaluate(self):
        return {"mean_loss": sum(self.losses) / len(self.losses), "keys": sorted(self.keys)}


def test_an_evaluator_without_the_predictions_flag_gets_the_loss_only(trainer_for):
    trainer = trainer_for([(6, 5)], evaluator=MeanLoss)
    results = trainer.evaluate()
    want = batch_losses(trainer.model, 6, 5, batches=2)  # test_micro_batch_size=3
    assert results == {"mean_loss": pytest.approx(sum(want) / 2), "keys": ["lm_loss"]}


class Stopped(Exception):
    pass


class StopAfter(HookBase):
    """Stops the run after ``n`` iterations, as a kill would."""

    def __init__(self, n):
        self.n = n

    def after_step(self):
        if self.trainer.iter + 1 == self.n:
            raise Stopped


def test_a_resumed_run_ends_bitwise_where_the_straight_run_ends(trainer_for, tmp_path, caplog):
    first = trainer_for([], output_dir=tmp_path / "a", train_iter=5, period=3)
    first.resume_or_load(resume=True)  # nothing saved yet: starts at 0
    assert (first.start_iter, first.consumed_train_samples) == (0, 0)
    first.register_hooks([StopAfter(3)])  # after the checkpointer's hook: killed once saved
    with pytest.raises(Stopped):
        first.train()
    resumed = trainer_for([], output_dir=tmp_path / "a", resume=True, train_iter=5)
    resumed.resume_or_load(resume=resumed.cfg.train.resume)
    assert (resumed.start_iter, resumed.consumed_train_samples) == (3, 3 * 4)
    assert resumed.cfg.train.consumed_train_samples == 12
    assert resumed.train()
    straight = trainer_for([], output_dir=tmp_path / "b", train_iter=5)
    straight.resume_or_load(resume=True)
    assert straight.train()
    got, want = weights(resumed), weights(straight)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert not torch.equal(weights(first)["head.weight"], want["head.weight"])

    again = trainer_for([], output_dir=tmp_path / "a", resume=True, train_iter=5)
    again.resume_or_load(resume=True)
    assert again.start_iter == 5
    with caplog.at_level(logging.INFO, logger="libai.engine.default"):
        assert again.train() is False
    assert "Nothing left to train" in caplog.text
    assert "at iteration 5 of train.train_iter=5" in caplog.text


def test_loading_weights_without_resume_starts_at_zero(trainer_for, tmp_path):
    first = trainer_for([], output_dir=tmp_path / "a", train_iter=2, period=2)
    first.train()
    saved = weights(first)
    loaded = trainer_for(
        [], output_dir=tmp_path / "b", train_iter=2, load_weight=str(tmp_path / "a" / "model_final")
    )
    loaded.resume_or_load(resume=False)
    assert (loaded.start_iter, loaded.consumed_train_samples) == (0, 0)
    got = weights(loaded)
    assert all(torch.equal(got[k], saved[k]) for k in saved)


def test_evaluation_stops_after_eval_iter_batches(trainer_for):
    trainer = trainer_for([(9, 7)], evaluator=MeanLoss)
    trainer.cfg.train.evaluation.eval_iter = 2  # of the 3 batches of 3
    results = trainer.evaluate()
    want = batch_losses(trainer.model, 9, 7, batches=2)
    assert results["mean_loss"] == pytest.approx(sum(want) / 2)


def test_resume_or_load_resumes_by_default(trainer_for, tmp_path):
    first = trainer_for([], output_dir=tmp_path / "a", train_iter=2, period=2)
    first.train()
    resumed = trainer_for([], output_dir=tmp_path / "a", train_iter=4)
    resumed.resume_or_load()
    assert (resumed.start_iter, resumed.consumed_train_samples) == (2, 8)


def test_an_evaluator_of_loss_and_predictions_gets_both(trainer_for):
    """One evaluator needing predictions makes the combined one get the logits and the loss
    (perplexity and accuracy from one forward)."""
    evaluator = LazyCall(DatasetEvaluators)(
        evaluators=[LazyCall(PPLEvaluator)(), LazyCall(AccEvaluator)()]
    )
    trainer = trainer_for([(7, 8)])
    trainer.cfg.train.evaluation.evaluator = evaluator
    results = trainer.evaluate()
    assert results["Acc@1"] == pytest.approx(reference_acc(trainer.model, 7, 8))
    assert results["ppl"] == pytest.approx(reference_ppl(trainer.model, 7, 8))
