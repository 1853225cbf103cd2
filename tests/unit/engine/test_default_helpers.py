"""The pieces of LiBai's door (``libai.engine.default``) that translate LiBai's rules: dp
derived from the launch, epoch periods in iterations, the run's tokenizer handed to the
datasets that take one. Each expectation is LiBai's rule written out in the test."""

from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.engine.default import (
    derive_data_parallel_size,
    scale_epoch_periods,
    with_tokenizer,
)
from libai.runtime.spec import RunSpec


def dist_cfg(**sizes):
    return OmegaConf.create(sizes)


@pytest.mark.parametrize(
    ("world", "sizes", "derived"),
    [
        (8, {"data_parallel_size": 1, "tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 2),
        (8, {"data_parallel_size": 8, "tensor_parallel_size": 2}, 4),
        (6, {"data_parallel_size": 1, "pipeline_parallel_size": 3}, 2),
        (4, {"data_parallel_size": 2}, 4),  # no tp / pp keys: both 1
    ],
)
def test_dp_is_the_world_over_tp_times_pp_and_the_warning_names_both(world, sizes, derived):
    cfg = dist_cfg(**sizes)
    asked = sizes["data_parallel_size"]
    message = derive_data_parallel_size(cfg, world)
    assert (
        cfg.data_parallel_size
        == derived
        == world // (sizes.get("tensor_parallel_size", 1) * sizes.get("pipeline_parallel_size", 1))
    )
    assert f"data_parallel_size={asked}" in message
    assert f"{world} processes" in message
    assert f"= {derived} data-parallel ranks; using {derived}" in message


@pytest.mark.parametrize(
    ("world", "sizes"),
    [
        (8, {"data_parallel_size": 2, "tensor_parallel_size": 2, "pipeline_parallel_size": 2}),
        (8, {"tensor_parallel_size": 2}),  # dp unset: the layout derives it
        (6, {"data_parallel_size": 1, "tensor_parallel_size": 4}),  # left to the layout check
        (1, {"data_parallel_size": 1}),
    ],
)
def test_dp_that_agrees_is_unset_or_does_not_divide_is_left_alone(world, sizes):
    cfg = dist_cfg(**sizes)
    assert derive_data_parallel_size(cfg, world) is None
    assert OmegaConf.to_container(cfg) == sizes


def spec(global_batch=8, save_after=None, eval_after=None, period=1000, eval_period=500):
    run = RunSpec()
    run.global_batch_size = global_batch
    run.checkpointer.period = period
    run.checkpointer.save_model_after_n_epoch = save_after
    run.evaluation.eval_period = eval_period
    run.evaluation.eval_after_n_epoch = eval_after
    return run


def test_epoch_periods_are_n_times_the_iterations_of_an_epoch(caplog):
    run = spec(global_batch=8, save_after=3, eval_after=2)
    with caplog.at_level(logging.INFO, logger="libai.engine.default"):
        scale_epoch_periods(run, samples_per_epoch=100)
    # LiBai: len(dataset) // global_batch_size iterations per epoch = 12
    assert run.checkpointer.period == 3 * 12
    assert run.evaluation.eval_period == 2 * 12
    assert "train.checkpointer.save_model_after_n_epoch=3: every 36 iterations" in caplog.text
    assert "train.evaluation.eval_after_n_epoch=2: every 24 iterations" in caplog.text


def test_an_epoch_shorter_than_a_batch_counts_as_one_iteration():
    run = spec(global_batch=64, save_after=2)
    scale_epoch_periods(run, samples_per_epoch=10)
    assert run.checkpointer.period == 2
    assert run.evaluation.eval_period == 500  # not asked: unchanged


def test_epoch_periods_unset_leave_the_iteration_periods():
    run = spec(period=7, eval_period=9)
    scale_epoch_periods(run, samples_per_epoch=None)
    assert (run.checkpointer.period, run.evaluation.eval_period) == (7, 9)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"save_after": 1}, "checkpointer.save_model_after_n_epoch"),
        ({"eval_after": 2}, "evaluation.eval_after_n_epoch"),
    ],
)
@pytest.mark.parametrize("length", [None, 0])
def test_epoch_periods_without_a_dataset_length_name_the_key(kwargs, key, length):
    run = spec(**kwargs)
    with pytest.raises(ValueError, match=rf"train\.{key}=\d needs the training set's length"):
        scale_epoch_periods(run, samples_per_epoch=length)


class TakesTokenizer:
    def __init__(self, path, tokenizer=None):
        self.path, self.tokenizer = path, tokenizer


class NoTokenizer:
    def __init__(self, path):
        self.path = path


def loader(datasets):
    return OmegaConf.create({"_target_": "builtins.dict", "dataset": datasets})


def test_the_tokenizer_goes_to_the_datasets_that_take_one_on_a_copy():
    tok = object()
    cfg = loader(
        [
            LazyCall(TakesTokenizer)(path="a"),
            LazyCall(NoTokenizer)(path="b"),
            LazyCall(TakesTokenizer)(path="c", tokenizer="mine"),
        ]
    )
    cfg.dataset[0]._target_ = f"{__name__}.TakesTokenizer"  # a dotted path is located too
    out = with_tokenizer(cfg, tok)
    assert out is not cfg
    assert out.dataset[0].tokenizer is tok
    assert "tokenizer" not in out.dataset[1]
    assert out.dataset[2].tokenizer == "mine"  # a dataset's own tokenizer is kept
    assert "tokenizer" not in cfg.dataset[0]  # the config saved to config.yaml keeps none


def test_a_single_dataset_node_gets_the_tokenizer_too():
    tok = object()
    cfg = loader(LazyCall(TakesTokenizer)(path="a"))
    out = with_tokenizer(cfg, tok)
    assert out.dataset.tokenizer is tok
    assert "tokenizer" not in cfg.dataset


@pytest.mark.parametrize(
    "datasets",
    [
        [LazyCall(NoTokenizer)(path="b")],
        [{"path": "not a lazy node"}],
        [LazyCall(TakesTokenizer)(path="a", tokenizer="own")],
        [LazyCall(max)(a=1)],  # a builtin without an inspectable signature
    ],
)
def test_nothing_to_hand_returns_the_config_itself(datasets):
    cfg = loader(datasets)
    assert with_tokenizer(cfg, object()) is cfg


def test_no_tokenizer_or_no_dataset_returns_the_config_itself():
    cfg = loader([LazyCall(TakesTokenizer)(path="a")])
    assert with_tokenizer(cfg, None) is cfg
    bare = OmegaConf.create({"_target_": "builtins.dict"})
    assert with_tokenizer(bare, object()) is bare


@pytest.mark.parametrize(("rank", "written"), [(0, True), (1, False)])
def test_only_rank_0_writes_the_config(tmp_path, monkeypatch, rank, written):
    """``config.yaml`` is rank 0's to write (every rank holds the same config; two writers
    would race on one file); the other ranks' rank is stood in for."""
    from libai import dist
    from libai.engine.default import _save_config

    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    cfg = OmegaConf.create({"train": {"output_dir": str(tmp_path / "out")}, "x": 1})
    _save_config(cfg)
    assert (tmp_path / "out" / "config.yaml").exists() is written
    if written:
        assert OmegaConf.load(tmp_path / "out" / "config.yaml").x == 1


def test_a_dataset_node_whose_target_is_the_class_itself_gets_the_tokenizer():
    """A node written by hand with the class object as ``_target_`` (a config that allows
    objects) is handed the tokenizer as a dotted path's is."""
    tok = object()
    cfg = OmegaConf.create(
        {"_target_": "builtins.dict", "dataset": [{"_target_": TakesTokenizer, "path": "a"}]},
        flags={"allow_objects": True},
    )
    assert with_tokenizer(cfg, tok).dataset[0].tokenizer is tok


def test_epoch_periods_are_written_to_the_libai_namespace_too():
    """The spec and LiBai's ``train`` never drift: config.yaml, saved from ``train``, holds
    the same periods the run uses."""
    train = OmegaConf.create({"checkpointer": {"period": 1000}, "evaluation": {"eval_period": 500}})
    run = spec(global_batch=8, save_after=3, eval_after=None)
    scale_epoch_periods(run, samples_per_epoch=100, train=train)
    assert train.checkpointer.period == run.checkpointer.period == 36
    assert train.evaluation.eval_period == run.evaluation.eval_period == 500
