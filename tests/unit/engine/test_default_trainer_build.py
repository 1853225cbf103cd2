"""``DefaultTrainer``'s building in one process, on the tiny LM of
``default_trainer_helpers``: the loaders' batch sizes and sample counts (under dp and pp),
the tokenizer's padded vocab in the saved config and its hand-off to the train and test
datasets (on a resume too), the iterations of ``train_epoch``, epoch periods, the warmup of
``warmup_ratio``, ``load_weight`` against resuming, ``graph.enabled``. Each expectation is
LiBai's rule written out in the test."""

from __future__ import annotations

import pytest
import torch
from default_trainer_helpers import TokenizedTokens, Tokens, reference_ppl, weights
from omegaconf import OmegaConf

from libai import dist
from libai.config import LazyCall
from libai.engine.default import DefaultTrainer
from libai.runtime.spec import RunSpec


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


def test_epoch_periods_count_the_train_sets_iterations(trainer_for):
    """``save_model_after_n_epoch=3`` with 8 samples in batches of 4: a checkpoint every
    3 x 2 iterations (LiBai's ``n x len(dataset) // global batch``)."""

    def edit(cfg):
        cfg.train.checkpointer.save_model_after_n_epoch = 3

    trainer = trainer_for([], edit=edit, train_iter=12)
    assert trainer.spec.checkpointer.period == 3 * (8 // 4) == 6


def test_consumed_train_samples_of_the_config_is_where_the_run_starts(trainer_for):
    trainer = trainer_for([], consumed_train_samples=12)
    assert trainer.consumed_train_samples == 12


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


@pytest.mark.parametrize("enabled", [True, False, None])
def test_graph_enabled_compiles_each_block(trainer_for, enabled):
    """LiBai's ``graph.enabled`` is ``torch.compile`` of each block here (TinyLM's two
    children with parameters): True compiles them, False does not, unset compiles on CUDA
    only, so not on this CPU. Nothing runs, so nothing is compiled yet."""
    from libai.runtime.blocks import model_blocks

    def edit(cfg):
        cfg.graph = dict(enabled=enabled)

    blocks = model_blocks(trainer_for([], edit=edit).model)
    assert [type(b).__name__ for b in blocks] == ["Embedding", "Linear"]
    assert [b._compiled_call_impl is not None for b in blocks] == [bool(enabled)] * 2


@pytest.mark.parametrize(
    ("train_iter", "eval_iter", "want_train_iter", "want_eval_iter"),
    [(100, 50, 20, 5), (7, 2, 7, 2), (0, 9, 20, 5)],
)
def test_fast_dev_run_shortens_the_run(
    trainer_for, train_iter, eval_iter, want_train_iter, want_eval_iter
):
    """``--fast-dev-run``: at most 20 iterations (20 when the config counts by epochs), no
    epochs, a log line every iteration, a checkpoint and an evaluation every 10, at most 5
    evaluation batches."""

    def edit(cfg):
        cfg.train.evaluation.eval_iter = eval_iter
        cfg.train.checkpointer.period, cfg.train.evaluation.eval_period = 1000, 500

    trainer = trainer_for(
        [], edit=edit, fast_dev_run=True, train_iter=train_iter, train_epoch=3, log_period=50
    )
    train = trainer.cfg.train
    assert (train.train_iter, trainer.max_iter, train.train_epoch) == (want_train_iter,) * 2 + (0,)
    assert (train.log_period, train.checkpointer.period, train.evaluation.eval_period) == (
        1,
        10,
        10,
    )
    assert train.evaluation.eval_iter == want_eval_iter


def test_the_fp16_loss_scale_is_saved_and_resumed(trainer_for, tmp_path):
    """fp16 autocast's dynamic loss scale is part of the checkpoint: a resumed run goes on
    with the scale the run had when it saved (set to 128 here, against the configured 1024)."""

    def edit(cfg):
        cfg.train.amp.update(enabled=True, dtype="fp16", init_scale=1024.0)

    first = trainer_for([], edit=edit, output_dir=tmp_path / "a", train_iter=2, period=2)
    first.grad_scaler.scale = 128.0
    first.train()
    saved = first.grad_scaler.scale
    resumed = trainer_for([], edit=edit, output_dir=tmp_path / "a", train_iter=4)
    assert resumed.grad_scaler.scale == 1024.0
    resumed.resume_or_load(resume=True)
    assert resumed.start_iter == 2
    assert resumed.grad_scaler.scale == saved <= 128.0


def test_setup_writes_the_runs_config(trainer_for, tmp_path):
    """``default_setup`` writes the whole config to ``<output_dir>/config.yaml`` (what
    ``--eval-only`` and the checkpoint converter read back)."""
    trainer_for([], output_dir=tmp_path / "run", train_iter=7)
    assert OmegaConf.load(tmp_path / "run" / "config.yaml").train.train_iter == 7


def test_config_yaml_and_run_spec_yaml_hold_the_run_as_resolved(trainer_for, tmp_path):
    """Iterations and periods counted from epochs reach config.yaml (LiBai's ``train``) and
    the frozen spec the run was built from (``run_spec.yaml``): 8 samples in batches of 4,
    3 epochs -> 6 iterations; a checkpoint every 2 epochs -> every 4."""

    def edit(cfg):
        cfg.train.checkpointer.save_model_after_n_epoch = 2

    trainer = trainer_for([], edit=edit, output_dir=tmp_path / "run", train_iter=1, train_epoch=3)
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml").train
    assert (saved.train_iter, saved.checkpointer.period) == (6, 4)
    spec = RunSpec.from_config(OmegaConf.load(tmp_path / "run" / "run_spec.yaml"))
    assert spec == trainer.spec and trainer.spec.frozen
    assert (spec.train_iter, spec.checkpointer.period) == (6, 4)


@pytest.mark.parametrize(
    ("sizes", "key"),
    [
        ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
        ({"data_parallel_size": 1, "pipeline_parallel_size": 2}, "pipeline_parallel_size"),
    ],
)
def test_a_layout_that_does_not_fit_one_process_fails_in_setup(trainer_for, sizes, key):
    """A layout needing more processes than the launch has is refused by ``default_setup``,
    before any process group exists, naming the key."""

    def edit(cfg):
        cfg.train.dist.update(sizes)

    with pytest.raises(ValueError, match=key):
        trainer_for([], edit=edit)
