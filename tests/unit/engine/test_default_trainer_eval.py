"""``DefaultTrainer`` in one process, on a tiny LM. Evaluation: LiBai's ``cfg.dataloader.test``
loaders (used when the train builder gives no valid loader, as LiBai's vision configs do)
are each evaluated, their keys prefixed ``test<i>/`` when there are several; an explicit
loader is evaluated as given. The reference is the perplexity of each dataset computed here
from the same model: ``exp(sum of token losses / tokens)``. Resume: a run stopped and resumed
ends with the weights of the run trained straight through. Building: the loaders' batch
sizes and sample counts, the tokenizer's padded vocab and its hand-off to the datasets, the
iterations of ``train_epoch`` and the warmup of ``warmup_ratio``, each LiBai's rule written
out in the test."""

from __future__ import annotations

import argparse
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.config import LazyCall, LazyConfig
from libai.data.build import build_nlp_test_loader, build_nlp_train_loader
from libai.engine.default import DefaultTrainer, default_setup
from libai.evaluation import AccEvaluator, DatasetEvaluators, PPLEvaluator
from libai.runtime.trainer import HookBase

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


def recording_test_loader(dataset, test_batch_size, seed, collate_fn):
    """LiBai's test loader builder's arguments, kept on the loader it builds."""
    loader = build_nlp_test_loader(dataset, test_batch_size, seed=seed, collate_fn=collate_fn)
    loader.given = {"test_batch_size": test_batch_size, "seed": seed}
    return loader


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


@pytest.fixture
def trainer_for(tmp_path, monkeypatch):
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])  # configs/ of this checkout

    def build(
        test_sets,
        evaluator=PPLEvaluator,
        output_dir=None,
        resume=False,
        period=None,
        edit=None,
        **train,
    ):
        cfg = config(output_dir or tmp_path, test_sets, evaluator)
        cfg.train.update(train)
        if edit is not None:
            edit(cfg)  # what the test changes in the config before the run's setup
        if period is not None:
            cfg.train.checkpointer.period = period
        args = argparse.Namespace(fast_dev_run=False, resume=resume)
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


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


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


def test_the_console_writer_counts_global_batch_times_sequence_length_tokens(trainer_for):
    trainer = trainer_for([])
    trainer.cfg.model.cfg = {"max_seq_length": 6}
    (printer,) = [w for w in trainer.build_hooks()[-1]._writers if hasattr(w, "_tokens_per_iter")]
    assert printer._tokens_per_iter == trainer.global_batch_size * 6 == 24
    trainer.cfg.model.cfg = {}
    (printer,) = [w for w in trainer.build_hooks()[-1]._writers if hasattr(w, "_tokens_per_iter")]
    assert printer._tokens_per_iter is None  # no sequence length: no tokens/s


@pytest.mark.parametrize(("dp", "pp"), [(1, 1), (2, 1), (1, 2)])
def test_the_train_loader_gets_libais_batch_sizes_and_sample_counts(
    trainer_for, monkeypatch, dp, pp
):
    """As LiBai's trainer: the per-rank batch is micro x accumulation, the test batch the
    test micro batch, and the sample counts train_iter x global batch and eval_iter x test
    batch x dp for the valid and test splits. Under pipeline parallelism the test batch is
    the training batch per rank (the stages' buffers are sized by it). The mesh sizes are
    stood in for: the loader arguments are all this computes from them."""
    trainer = trainer_for([], train_iter=3, num_accumulation_steps=2)
    cfg = trainer.cfg
    cfg.dataloader.train._target_ = f"{__name__}.record_train_loader_arguments"
    _given.clear()
    cfg.train.evaluation.eval_iter = 5
    cfg.train.test_micro_batch_size = 3
    monkeypatch.setattr(dist, "get_data_parallel_size", lambda: dp)
    monkeypatch.setattr(dist, "get_pipeline_parallel_size", lambda: pp)
    DefaultTrainer.build_train_loader(cfg)
    del _given["dataset"]
    test_batch = 4 * 2 if pp > 1 else 3
    assert _given == {
        "train_batch_size": 4 * 2,
        "test_batch_size": test_batch,
        "train_val_test_num_samples": [3 * 8, 5 * test_batch * dp, 5 * test_batch * dp],
        "consumed_samples": 0,
        "seed": cfg.train.seed,
    }
    assert all(type(n) is int for n in _given["train_val_test_num_samples"])


_given: dict = {}  # the arguments record_train_loader_arguments was last called with


def record_train_loader_arguments(dataset, collate_fn, **kwargs):
    _given.update(kwargs, dataset=dataset)
    return None, None, None


class TokenizedTokens(Tokens):
    """A dataset that takes the run's tokenizer, as LiBai's text datasets do."""

    def __init__(self, n, seed, tokenizer=None):
        super().__init__(n, seed)
        self.tokenizer = tokenizer


def test_the_train_datasets_get_the_runs_tokenizer(trainer_for):
    trainer = trainer_for([])
    cfg = trainer.cfg
    cfg.dataloader.train._target_ = f"{__name__}.record_train_loader_arguments"
    cfg.dataloader.train.dataset = [LazyCall(TokenizedTokens)(n=4, seed=0)]
    tokenizer = object()
    _given.clear()
    DefaultTrainer.build_train_loader(cfg, tokenizer)
    assert _given["dataset"][0].tokenizer is tokenizer
    assert "tokenizer" not in cfg.dataloader.train.dataset[0]  # the saved config keeps none


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


def write_vocab(root) -> str:
    """A BERT vocab.txt of 11 tokens (5 specials and 6 words)."""
    path = root / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdef"]) + "\n")
    return str(path)


def with_a_tokenizer(root):
    """A config edit: a BERT tokenizer of :func:`write_vocab`'s 11 tokens, the vocab padded
    to a multiple of 8, and train / test datasets that take a tokenizer."""
    from libai.tokenizer import BertTokenizer

    def edit(cfg):
        cfg.model.cfg = dict(vocab_size=3)
        cfg.tokenization = dict(
            tokenizer=LazyCall(BertTokenizer)(vocab_file=write_vocab(root)),
            make_vocab_size_divisible_by=8,
        )
        cfg.dataloader.train.dataset = [LazyCall(TokenizedTokens)(n=8, seed=0)]
        if cfg.dataloader.test:
            cfg.dataloader.test[0].dataset = [LazyCall(TokenizedTokens)(n=5, seed=1)]

    return edit


def test_the_runs_tokenizer_sizes_the_saved_vocab_and_reaches_every_dataset(trainer_for, tmp_path):
    """As LiBai's trainer: with ``tokenization.tokenizer``, ``model.cfg.vocab_size`` becomes
    the tokenizer's 11 tokens padded to a multiple of ``make_vocab_size_divisible_by`` (8:
    16), the run's ``config.yaml`` says so (written again after the resize: the first one,
    from ``default_setup``, had the config's 3), and the train and test datasets that take a
    tokenizer get the run's."""
    from omegaconf import OmegaConf

    trainer = trainer_for([(5, 1)], edit=with_a_tokenizer(tmp_path), output_dir=tmp_path / "run")
    assert trainer.cfg.model.cfg.vocab_size == -(-11 // 8) * 8 == 16
    assert OmegaConf.load(tmp_path / "run" / "config.yaml").model.cfg.vocab_size == 16
    assert type(trainer.tokenizer).__name__ == "BertTokenizer"
    assert trainer.train_loader.dataset.tokenizer is trainer.tokenizer
    (test_loader,) = trainer.extra_test_loaders
    assert test_loader.dataset.tokenizer is trainer.tokenizer


def test_a_valid_loader_from_the_train_builder_leaves_dataloader_test_unused(trainer_for):
    """The train builder's valid loader is what evaluation runs; ``dataloader.test`` is
    only used without one (LiBai's vision configs): no test loader is built."""

    def edit(cfg):
        cfg.dataloader.train.valid_dataset = [Tokens(7, 9)]

    trainer = trainer_for([(5, 1)], edit=edit)
    assert trainer.extra_test_loaders == []
    results = trainer.evaluate()
    assert results["ppl"] == pytest.approx(reference_ppl(trainer.model, 7, 9))


def test_train_epoch_counts_iterations_from_the_train_set(trainer_for):
    """LiBai's rule: ``train_iter = max(train_iter, ceil(len(train set) x train_epoch /
    global batch))``: 8 samples, 3 epochs, a global batch of 4: 6 iterations."""
    trainer = trainer_for([], train_iter=1, train_epoch=3)
    assert trainer.global_batch_size == 4
    assert trainer.cfg.train.train_iter == max(1, -(-8 * 3 // 4)) == 6


def test_warmup_ratio_reaches_the_lr_scheduler(trainer_for):
    """``warmup_ratio`` 0.3 of 10 iterations: 3 warmup iterations (LiBai's ceil), and the
    scheduler starts at ``warmup_factor`` (0.001, configs/common/train.py) times the base LR,
    rising linearly over them (LiBai's linear warmup of the base LR: factor + (1 - factor)
    x it / 3 at iteration 1; the cosine takes over after the warmup)."""
    trainer = trainer_for([], train_iter=10, warmup_ratio=0.3)
    assert trainer.cfg.train.warmup_iter == 3
    base = trainer.cfg.optim.lr
    optimizer = trainer.lr_scheduler.optimizer
    assert optimizer.param_groups[0]["lr"] == pytest.approx(base * 0.001)
    optimizer.step()  # no gradients: the weights stay; the schedule's order is kept
    trainer.lr_scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(base * (0.001 + 0.999 / 3))


def test_a_resumed_runs_new_train_loader_gets_the_tokenizer(trainer_for, tmp_path):
    """Resuming rebuilds the train loader at the consumed samples: its datasets get the
    run's tokenizer as the first loader's did."""
    edit = with_a_tokenizer(tmp_path)
    trainer_for([], edit=edit, output_dir=tmp_path / "a", train_iter=2, period=2).train()
    resumed = trainer_for([], edit=edit, output_dir=tmp_path / "a", train_iter=4)
    resumed.resume_or_load(resume=True)
    assert resumed.consumed_train_samples == 8
    assert resumed.train_loader.dataset.tokenizer is resumed.tokenizer is not None


def test_load_weight_without_resume_ignores_the_output_dirs_checkpoint(trainer_for, tmp_path):
    """``resume=False`` with ``load_weight``: the given weights at iteration 0, even where
    ``output_dir`` holds a later checkpoint of another run (which ``resume=True`` picks)."""
    other = trainer_for([], output_dir=tmp_path / "b", train_iter=1, period=1, seed=5)
    other.train()
    trainer_for([], output_dir=tmp_path / "a", train_iter=2, period=2).train()
    load = str(tmp_path / "b" / "model_final")
    loaded = trainer_for([], output_dir=tmp_path / "a", train_iter=4, load_weight=load)
    loaded.resume_or_load(resume=False)
    assert (loaded.start_iter, loaded.consumed_train_samples) == (0, 0)
    got, want = weights(loaded), weights(other)
    assert all(torch.equal(got[k], want[k]) for k in want)
    resumed = trainer_for([], output_dir=tmp_path / "a", train_iter=4, load_weight=load)
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 2
    assert not torch.equal(weights(resumed)["head.weight"], want["head.weight"])
