"""``DefaultTrainer.evaluate`` in one process, on a tiny LM: LiBai's ``cfg.dataloader.test``
loaders (used when the train builder gives no valid loader, as LiBai's vision configs do)
are each evaluated, their keys prefixed ``test<i>/`` when there are several; an explicit
loader is evaluated as given. The reference is the perplexity of each dataset computed here
from the same model: ``exp(sum of token losses / tokens)``."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.config import LazyCall, LazyConfig
from libai.data.build import build_nlp_test_loader, build_nlp_train_loader
from libai.engine.default import DefaultTrainer, default_setup
from libai.evaluation import AccEvaluator, PPLEvaluator

VOCAB, SEQ = 11, 6


class TinyLM(nn.Module):
    """An embedding and a linear head: ``{"lm_loss": mean token cross-entropy}``, and the
    pipeline contract's forward / loss (what evaluation with predictions calls)."""

    pipeline_input_key, pipeline_target_key = "input_ids", "labels"

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, VOCAB)

    def pipeline_forward(self, input_ids):
        return self.head(self.embed(input_ids))

    def pipeline_loss(self, logits, labels):
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    def forward(self, input_ids, labels):
        return {"lm_loss": self.pipeline_loss(self.pipeline_forward(input_ids), labels)}


class Tokens(torch.utils.data.Dataset):
    """``n`` random sequences (``input_ids`` and next-token ``labels``) of seed ``seed``."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i, :-1], "labels": self.ids[i, 1:]}


def collate(items):
    return {k: torch.stack([item[k] for item in items]) for k in items[0]}


def config(tmp_path, test_sets, evaluator=PPLEvaluator):
    cfg = LazyConfig.load("configs/common/train.py")
    cfg.train.update(
        output_dir=str(tmp_path),
        train_iter=1,
        train_micro_batch_size=4,
        test_micro_batch_size=3,
        log_period=1,
    )
    cfg.train.evaluation.evaluator = LazyCall(evaluator)()
    cfg.train.evaluation.eval_iter = 100
    cfg.model = LazyCall(TinyLM)()
    cfg.optim = LazyConfig.load("configs/common/optim.py").optim
    cfg.dataloader = dict(
        train=LazyCall(build_nlp_train_loader)(dataset=[Tokens(8, 0)], collate_fn=collate),
        test=[
            LazyCall(build_nlp_test_loader)(dataset=[Tokens(n, seed)], collate_fn=collate)
            for n, seed in test_sets
        ],
    )
    return cfg


def reference_ppl(model, n, seed):
    data = Tokens(n, seed)
    with torch.no_grad():
        out = model(data.ids[:, :-1], data.ids[:, 1:])
    return math.exp(float(out["lm_loss"]))


@pytest.fixture
def trainer_for(tmp_path, monkeypatch):
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])  # configs/ of this checkout

    def build(test_sets, evaluator=PPLEvaluator):
        cfg = config(tmp_path, test_sets, evaluator)
        args = argparse.Namespace(fast_dev_run=False, resume=False)
        default_setup(cfg, args)
        trainer = DefaultTrainer(cfg)
        return trainer

    yield build
    dist.setup_dist_util({})


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
    data = Tokens(7, 4)
    with torch.no_grad():
        logits = trainer.model.pipeline_forward(data.ids[:, :-1])
    hits = (logits.argmax(-1) == data.ids[:, 1:]).float().mean()
    assert results == {"Acc@1": pytest.approx(100 * float(hits))}
