"""LiBai's own config files (tests/fixtures/libai/configs, LiBai at 9dcbe3b2, unmodified) run
through tools/train_net.py with overrides only for sizes, run length and data paths."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from bpe_helpers import train_tiny_bpe, write_indexed
from train_net_helpers import ROOT, read_metrics, run_train_net

LIBAI_CONFIGS = ROOT / "tests" / "fixtures" / "libai" / "configs"


@pytest.fixture(scope="module")
def gpt_files(tmp_path_factory):
    """A tiny byte-level BPE and an indexed corpus of its ids (LiBai's GPT data format)."""
    root = tmp_path_factory.mktemp("libai_gpt")
    vocab, merges = train_tiny_bpe(root / "bpe")
    rng = random.Random(0)
    docs = [[rng.randrange(1, 360) for _ in range(rng.randrange(20, 80))] for _ in range(200)]
    return {"vocab": vocab, "merges": merges, "prefix": write_indexed(root / "corpus", docs)}


def gpt2_overrides(files, out_dir, micro: int) -> list[str]:
    """Sizes, run length and data paths; and bf16 autocast off, so that the layouts are
    compared in fp32 to float rounding: nothing else of LiBai's gpt2_pretrain.py changes."""
    prefix = files["prefix"]
    return [
        f"tokenization.tokenizer.vocab_file={files['vocab']}",
        f"tokenization.tokenizer.merges_file={files['merges']}",
        f"dataloader.train.dataset.0.data_prefix={prefix}",
        f"dataloader.train.dataset.0.indexed_dataset.data_prefix={prefix}",
        f"dataloader.test.0.dataset.data_prefix={prefix}",
        f"dataloader.test.0.dataset.indexed_dataset.data_prefix={prefix}",
        "model.cfg.hidden_layers=2",
        "model.cfg.hidden_size=32",
        "model.cfg.num_attention_heads=2",
        "model.cfg.ffn_hidden_size=64",
        "model.cfg.max_seq_length=32",
        "model.cfg.embedding_dropout_prob=0.0",
        "model.cfg.attention_dropout_prob=0.0",
        "dataloader.train.dataset.0.max_seq_length=32",
        "dataloader.test.0.dataset.max_seq_length=32",
        "dataloader.train.num_workers=0",
        "train.dist.pipeline_num_layers=2",
        f"train.train_micro_batch_size={micro}",
        "train.test_micro_batch_size=2",
        "train.train_iter=4",
        "train.log_period=1",
        "train.evaluation.eval_period=4",
        "train.evaluation.eval_iter=2",
        "train.amp.enabled=False",
        f"train.output_dir={out_dir}",
    ]


def losses(out_dir) -> list[float]:
    metrics = read_metrics(out_dir)
    return [metrics[i]["total_loss"] for i in sorted(metrics) if "total_loss" in metrics[i]]


def test_gpt2_pretrain_runs_unmodified_on_one_and_two_processes(gpt_files, tmp_path):
    """LiBai's gpt2_pretrain.py (``import oneflow as flow``, GraphBase, LiBai's model and
    tokenizer keys, train.py's keys): one process, and two processes where LiBai derives
    dp=2 from the launch although the config says data_parallel_size=1 -- the same global
    batch gives the same losses (dropout off for that comparison: its masks differ by rank
    by design). The model's vocabulary is the tokenizer's, padded to 128
    as LiBai pads it, not the config's placeholder 30522."""
    config = LIBAI_CONFIGS / "gpt2_pretrain.py"
    one = run_train_net(config, gpt2_overrides(gpt_files, tmp_path / "one", micro=2))
    two = run_train_net(config, gpt2_overrides(gpt_files, tmp_path / "two", micro=1), nproc=2)
    assert "using 2, as LiBai does" in two.stdout + two.stderr
    assert "nccl_fusion_threshold_mb" in one.stdout + one.stderr  # named as having no effect
    assert "graph.enabled=True: LiBai's static graph is torch.compile" in one.stdout + one.stderr
    want = losses(tmp_path / "one")
    assert len(want) == 4
    assert losses(tmp_path / "two") == pytest.approx(want, rel=1e-6)
    # ours: graph.compile_scope='model' compiles the whole forward (numbers: test_switches)
    whole = run_train_net(
        config,
        [*gpt2_overrides(gpt_files, tmp_path / "whole", micro=2), "+graph.compile_scope=model"],
    )
    assert "torch.compile of the whole model (graph.compile_scope='model')" in (
        whole.stdout + whole.stderr
    )
    assert losses(tmp_path / "whole") == pytest.approx(want, rel=1e-6)
    saved = yaml.safe_load((tmp_path / "one" / "config.yaml").read_text())
    vocab = len(yaml.safe_load(Path(gpt_files["vocab"]).read_text()))
    assert saved["model"]["cfg"]["vocab_size"] == -(-vocab // 128) * 128
    assert saved["optim"]["_target_"] == "libai.optim.oneflow_optim.AdamW"
