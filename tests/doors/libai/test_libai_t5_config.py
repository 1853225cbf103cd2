"""LiBai's own t5_large_pretrain.py (tests/fixtures/libai/configs, unmodified: its BERT
tokenizer with [BOS]/[EOS]/<extra_id_*>, LiBai's T5Dataset keywords, LiBai's Megatron-style
T5 keys) through tools/train_net.py with overrides only for sizes, run length and data
paths (plus dropout off, graph.enabled=False and train.amp.enabled=False, which spare the
comparisons the dropout masks and bf16's rounding and the tests the compile time): 1 process
equals 2 processes at the same global batch (dp2, and pp2), --resume reproduces the
uninterrupted losses bit for bit, --eval-only on the trained weights reports the trained run's evaluation."""

from __future__ import annotations

import re

import pytest
from libai_t5_data import build_t5_corpus
from train_net_helpers import ROOT, read_metrics, run_train_net

CONFIG = ROOT / "tests" / "fixtures" / "libai" / "configs" / "t5_large_pretrain.py"


@pytest.fixture(scope="module")
def t5_files(tmp_path_factory):
    vocab, prefix = build_t5_corpus(tmp_path_factory.mktemp("libai_t5"))
    return {"vocab": vocab, "prefix": prefix}


def t5_overrides(files, out_dir, micro: int) -> list[str]:
    prefix = files["prefix"]
    return [
        f"tokenization.tokenizer.vocab_file={files['vocab']}",
        f"dataloader.train.dataset.0.data_prefix={prefix}",
        f"dataloader.train.dataset.0.indexed_dataset.data_prefix={prefix}",
        f"dataloader.test.0.dataset.data_prefix={prefix}",
        f"dataloader.test.0.dataset.indexed_dataset.data_prefix={prefix}",
        "model.cfg.hidden_layers=2",
        "model.cfg.hidden_size=32",
        "model.cfg.num_attention_heads=2",
        "model.cfg.intermediate_size=64",
        "model.cfg.max_position_embeddings=32",
        "model.cfg.embedding_dropout_prob=0.0",
        "model.cfg.hidden_dropout_prob=0.0",
        "model.cfg.attention_probs_dropout_prob=0.0",
        "dataloader.train.dataset.0.max_seq_length=32",
        "dataloader.train.dataset.0.max_seq_length_dec=16",
        "dataloader.train.num_workers=0",
        "train.dist.pipeline_num_layers=4",
        f"train.train_micro_batch_size={micro}",
        "train.test_micro_batch_size=2",
        "train.train_iter=4",
        "train.log_period=1",
        "train.checkpointer.period=2",
        "train.evaluation.eval_period=4",
        "train.evaluation.eval_iter=2",
        "graph.enabled=False",
        "train.amp.enabled=False",
        f"train.output_dir={out_dir}",
    ]


def losses(out_dir) -> dict[int, float]:
    metrics = read_metrics(out_dir)
    return {i: m["total_loss"] for i, m in metrics.items() if "total_loss" in m}


def evaluation(log: str) -> tuple[float, float]:
    found = re.findall(r"'ppl': ([0-9.e+-]+), 'loss': ([0-9.e+-]+)", log)
    assert found, log[-3000:]
    return tuple(float(v) for v in found[-1])


@pytest.fixture(scope="module")
def one_process(t5_files, tmp_path_factory):
    """The one-process run: its output directory, losses by iteration and evaluation."""
    out = tmp_path_factory.mktemp("t5_one") / "run"
    proc = run_train_net(CONFIG, t5_overrides(t5_files, out, micro=2))
    log = proc.stdout + proc.stderr
    assert "MegatronT5ForPreTraining(" in log  # LiBai's T5, not Hugging Face's
    assert "bias_gelu_fusion" in log  # named as having no effect
    want = losses(out)
    assert sorted(want) == [0, 1, 2, 3] and len(set(want.values())) == 4
    return out, want, evaluation(log)


def test_t5_pretrain_two_processes_resume_and_eval_only(t5_files, one_process, tmp_path):
    one_dir, want, trained_eval = one_process
    # dp=2 derived from the launch (the config says 1); the loss is LiBai's mean over the
    # global batch's loss tokens although the two ranks hold different numbers of them.
    # fp32 (the config's bf16 autocast is off): equal to float rounding. Under bf16 the runs
    # differ by about 5e-5 and by more on other CPUs, which would hide a real fault.
    two = run_train_net(CONFIG, t5_overrides(t5_files, tmp_path / "two", micro=1), nproc=2)
    assert "using 2, as LiBai does" in two.stdout + two.stderr
    got = losses(tmp_path / "two")
    assert [got[i] for i in range(4)] == pytest.approx([want[i] for i in range(4)], rel=1e-6)

    # resume from the iteration-2 checkpoint: the uninterrupted losses, bit for bit
    (one_dir / "last_checkpoint").write_text("model_0000001\n")
    (one_dir / "metrics.json").unlink()
    resumed = run_train_net(
        CONFIG, t5_overrides(t5_files, one_dir, micro=2), extra_args=("--resume",)
    )
    assert "Resumed at iteration 2" in resumed.stdout + resumed.stderr
    again = losses(one_dir)
    assert sorted(again) == [2, 3]
    assert [again[i] for i in (2, 3)] == [want[i] for i in (2, 3)]

    # --eval-only on the trained weights: the trained run's evaluation, no training
    evaluated = run_train_net(
        CONFIG,
        t5_overrides(t5_files, tmp_path / "eval", micro=2)
        + [f"train.load_weight={one_dir / 'model_final'}"],
        extra_args=("--eval-only",),
    )
    log = evaluated.stdout + evaluated.stderr
    assert "Starting training" not in log
    assert evaluation(log) == pytest.approx(trained_eval, rel=1e-6)


def test_t5_pretrain_under_pipeline_parallelism(t5_files, one_process, tmp_path):
    """pp2 (encoder on stage 0, decoder on stage 1, as LiBai's pipeline_num_layers = 2 x
    hidden_layers splits it; the masks read by each stage from its batch): the one-process
    losses and evaluation on the same global batches (fp32: to float rounding)."""
    _, want, trained_eval = one_process
    opts = t5_overrides(t5_files, tmp_path / "pp2", micro=2)
    opts += ["train.dist.pipeline_parallel_size=2", "+train.dist.pipeline_schedule=GPipe"]
    proc = run_train_net(CONFIG, opts, nproc=2)
    got = losses(tmp_path / "pp2")
    assert [got[i] for i in range(4)] == pytest.approx([want[i] for i in range(4)], rel=1e-6)
    ppl, loss = evaluation(proc.stdout + proc.stderr)
    assert loss == pytest.approx(trained_eval[1], rel=1e-6)  # ppl = exp(loss)
