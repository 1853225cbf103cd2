"""A one-process ``DefaultTrainer`` on a tiny LM for the tests of LiBai's door
(``tests/unit/engine``): the model, its token datasets, the LazyConfig of a run, the
references computed from the same model, and :func:`build_trainer` (``default_setup`` then
``DefaultTrainer``, as ``tools/train_net.py`` does)."""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

from libai.config import LazyCall, LazyConfig
from libai.data.build import build_nlp_test_loader, build_nlp_train_loader
from libai.engine.default import DefaultTrainer, default_setup
from libai.evaluation import PPLEvaluator

VOCAB, SEQ = 11, 6


class TinyLM(nn.Module):
    """An embedding and a linear head: ``{"lm_loss": mean token cross-entropy}``, and the
    pipeline contract's forward / loss (what evaluation with predictions calls)."""

    pipeline_input_key, pipeline_target_key = "input_ids", "labels"

    def __init__(self, cfg=None):
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


class TokenizedTokens(Tokens):
    """A dataset that takes the run's tokenizer, as LiBai's text datasets do."""

    def __init__(self, n, seed, tokenizer=None):
        super().__init__(n, seed)
        self.tokenizer = tokenizer


def reference_ppl(model, n, seed):
    data = Tokens(n, seed)
    with torch.no_grad():
        out = model(data.ids[:, :-1], data.ids[:, 1:])
    return math.exp(float(out["lm_loss"]))


def reference_acc(model, n, seed):
    """Acc@1 in percent: the share of next tokens that are the logits' argmax."""
    data = Tokens(n, seed)
    with torch.no_grad():
        logits = model.pipeline_forward(data.ids[:, :-1])
    return 100 * float((logits.argmax(-1) == data.ids[:, 1:]).float().mean())


def batch_losses(model, n, seed, batches):
    """The model's loss on each of the first ``batches`` batches of 3 (the test batch)."""
    data = Tokens(n, seed)
    with torch.no_grad():
        return [
            float(model(data.ids[i : i + 3, :-1], data.ids[i : i + 3, 1:])["lm_loss"])
            for i in range(0, 3 * batches, 3)
        ]


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def build_trainer(
    output_dir,
    test_sets,
    evaluator=PPLEvaluator,
    resume=False,
    period=None,
    edit=None,
    fast_dev_run=False,
    **train,
):
    """``DefaultTrainer`` of :func:`config` with ``train`` updated, ``edit(cfg)`` applied
    and ``checkpointer.period`` set, after ``default_setup`` with the command line's
    ``--fast-dev-run`` / ``--resume`` (run from the checkout's root: the config reads
    ``configs/``)."""
    cfg = config(output_dir, test_sets, evaluator)
    cfg.train.update(train)
    if edit is not None:
        edit(cfg)  # what the test changes in the config before the run's setup
    if period is not None:
        cfg.train.checkpointer.period = period
    default_setup(cfg, argparse.Namespace(fast_dev_run=fast_dev_run, resume=resume))
    return DefaultTrainer(cfg)
