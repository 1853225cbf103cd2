"""configs/gpt2.py (the design card's command) and values that follow each other across
namespaces through omegaconf interpolation (``${model.cfg.max_seq_length}``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from train_net_helpers import ROOT, read_metrics, run_train_net

from libai.config import LazyConfig, instantiate

GPT2 = ROOT / "configs" / "gpt2.py"
GPT2_PRETRAIN = ROOT / "configs" / "gpt2_pretrain.py"
BERT_LARGE = ROOT / "configs" / "bert_large_pretrain.py"

#: a tiny GPT for end-to-end runs (no dataset override: the dataset follows the model)
TINY_GPT = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=64",
    "model.cfg.num_attention_heads=4",
    "model.cfg.ffn_hidden_size=128",
    "train.train_micro_batch_size=2",
    "train.test_micro_batch_size=2",
    "train.log_period=1",
    "train.evaluation.eval_iter=1",
    "train.warmup_ratio=0",
]


@pytest.mark.parametrize("config", [GPT2_PRETRAIN, GPT2], ids=["gpt2_pretrain", "gpt2"])
def test_max_seq_length_override_moves_the_dataset_too(config, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = LazyConfig.load(str(config))
    assert cfg.dataloader.train.dataset[0].max_seq_length == cfg.model.cfg.max_seq_length
    LazyConfig.apply_overrides(cfg, ["model.cfg.max_seq_length=64"])
    assert cfg.model.cfg.max_seq_length == 64
    assert cfg.dataloader.train.dataset[0].max_seq_length == 64
    # instantiate sees the resolved value, not the "${...}" string
    ds = instantiate({"_target_": dict, "n": cfg.dataloader.train.dataset[0].max_seq_length})
    assert ds == {"n": 64}
    # overriding the dataset alone still works, and leaves the model alone
    LazyConfig.apply_overrides(cfg, ["dataloader.train.dataset.0.max_seq_length=32"])
    assert cfg.dataloader.train.dataset[0].max_seq_length == 32
    assert cfg.model.cfg.max_seq_length == 64


def test_saved_config_keeps_the_interpolation(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = LazyConfig.load(str(GPT2_PRETRAIN))
    LazyConfig.save(cfg, tmp_path / "config.yaml")
    back = LazyConfig.load(str(tmp_path / "config.yaml"))
    LazyConfig.apply_overrides(back, ["model.cfg.max_seq_length=48"])
    assert back.dataloader.train.dataset[0].max_seq_length == 48


def test_bert_dataset_follows_max_position_embeddings():
    cfg = LazyConfig.load(str(BERT_LARGE))
    assert cfg.dataloader.train.dataset[0].max_seq_length == 512
    LazyConfig.apply_overrides(cfg, ["model.cfg.max_position_embeddings=128"])
    assert cfg.dataloader.train.dataset[0].max_seq_length == 128


@pytest.mark.parametrize(
    "world, layout", [(None, (1, 1)), ("1", (1, 1)), ("2", (2, 1)), ("4", (2, 2)), ("8", (2, 2))]
)
def test_gpt2_layout_follows_the_launch(world, layout, monkeypatch):
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    train = LazyConfig.load(str(GPT2)).train
    dist = train.dist
    assert (dist.tensor_parallel_size, dist.pipeline_parallel_size) == layout
    # pipeline micro-batches = accumulation steps: two per stage, one without a pipeline
    assert train.num_accumulation_steps == (4 if layout[1] == 2 else 1)
    assert dist.data_parallel_size is None  # derived from the world size at setup
    assert dist.pipeline_num_layers == 6


def _assert_trained(out: Path, iters: int) -> dict:
    metrics = read_metrics(out)
    losses = [metrics[i]["total_loss"] for i in range(iters) if "total_loss" in metrics.get(i, {})]
    assert len(losses) >= iters - 1 and all(math.isfinite(x) for x in losses), metrics
    assert (out / "model_final" / ".metadata").exists()
    return metrics


def test_gpt2_pretrain_trains_with_a_shorter_max_seq_length(sample_env, tmp_path, monkeypatch):
    # the saved config names the sample data as ${libai_sample:...}: resolved from this env
    monkeypatch.setenv("LIBAI_SAMPLE_DATA_DIR", sample_env["LIBAI_SAMPLE_DATA_DIR"])
    # before the interpolation this stopped with "sequence of 128 positions exceeds
    # max_seq_length=64": the dataset kept its own copy of 128
    out = tmp_path / "run"
    opts = [*TINY_GPT, "model.cfg.max_seq_length=64", f"train.output_dir={out}"]
    opts += ["train.train_iter=3", "train.evaluation.eval_period=3", "train.checkpointer.period=3"]
    run_train_net(GPT2_PRETRAIN, opts, env=sample_env, timeout=120)
    _assert_trained(out, 3)
    saved = LazyConfig.load(str(out / "config.yaml"))
    assert saved.dataloader.train.dataset[0].max_seq_length == 64
    # the loader the trainer builds from that config yields 64-token samples
    sample = instantiate(saved.dataloader.train.dataset[0])[0]
    assert len(sample["input_ids"]) == len(sample["labels"]) == 64


def test_design_card_command_trains_on_8_processes(sample_env, tmp_path):
    """bash tools/train.sh tools/train_net.py configs/gpt2.py 8: data 2 x tensor 2 x pipeline 2."""
    out = tmp_path / "run"
    opts = [*TINY_GPT, "model.cfg.max_seq_length=32", f"train.output_dir={out}"]
    opts += ["train.train_iter=4", "train.evaluation.eval_period=2", "train.checkpointer.period=2"]
    run_train_net(GPT2, opts, nproc=8, env=sample_env, timeout=240, launcher="train.sh")
    metrics = _assert_trained(out, 4)
    assert any("ppl" in m for m in metrics.values())
    saved = LazyConfig.load(str(out / "config.yaml"))
    dist = saved.train.dist
    assert (dist.data_parallel_size, dist.tensor_parallel_size, dist.pipeline_parallel_size) == (
        2,
        2,
        2,
    )
    assert saved.dataloader.train.dataset[0].max_seq_length == 32
    assert all((out / "model_final" / f"__{r}_0.distcp").exists() for r in range(8))
