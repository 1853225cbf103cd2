"""One core, two front doors: GPT pretraining through the FleetX Engine (a YAML of
projects/gpt, GPTModule) gives the same per-step losses as tools/train_net.py on the same
config values, on 1 process and on dp2, tp2 and pp2."""

from __future__ import annotations

import pytest
from engine_helpers import ROOT, run_tool
from train_net_helpers import read_metrics, run_train_net, train_env

from libai.data.sample_corpus import ensure_sample_dataset

GPT_YAML = ROOT / "projects" / "gpt" / "configs" / "pretrain_gpt_345M_single_card.yaml"
STEPS = 5
#: the same tiny GPT, data, optimizer and schedule in both vocabularies
YAML = [
    "Global.device=cpu",
    "Model.hidden_layers=2",
    "Model.hidden_size=32",
    "Model.num_attention_heads=2",
    "Model.ffn_hidden_size=64",
    "Model.max_seq_length=32",
    "Model.embedding_dropout_prob=0.0",
    "Model.attention_dropout_prob=0.0",
    "Model.output_dropout_prob=0.0",
    f"Engine.max_steps={STEPS}",
    "Engine.logging_freq=1",
    "Engine.eval_freq=-1",
    "Engine.mix_precision.enable=false",
    "Global.local_batch_size=4",
    "Global.micro_batch_size=null",
    "Optimizer.name=AdamW",
    "~Optimizer.lr",
    "+Optimizer.lr={name: WarmupCosineLR, learning_rate: 2e-3, warmup_factor: 0.001, "
    "alpha: 0.01, warmup_ratio: 0.05}",
]
LIBAI = [
    "model.cfg.hidden_layers=2",
    "model.cfg.hidden_size=32",
    "model.cfg.num_attention_heads=2",
    "model.cfg.ffn_hidden_size=64",
    "model.cfg.max_seq_length=32",
    "dataloader.train.dataset.0.max_seq_length=32",
    f"train.train_iter={STEPS}",
    "train.log_period=1",
    "train.evaluation.enabled=false",
]
LAYOUTS = {
    "single": (1, [], []),
    "dp2": (2, ["Global.local_batch_size=2"], ["train.train_micro_batch_size=2"]),
    "tp2": (2, ["Distributed.mp_degree=2"], ["train.dist.tensor_parallel_size=2"]),
    "pp2": (
        2,
        ["Distributed.pp_degree=2", "Global.micro_batch_size=2"],
        [
            "train.dist.pipeline_parallel_size=2",
            "train.train_micro_batch_size=2",
            "train.num_accumulation_steps=2",
        ],
    ),
}


@pytest.fixture(scope="module")
def sample_env(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("sample_data")
    ensure_sample_dataset(str(data_dir), max_bytes=300_000, vocab_size=1000)
    return train_env(LIBAI_SAMPLE_DATA_DIR=str(data_dir))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_engine_and_train_net_give_the_same_losses(sample_env, tmp_path, layout):
    nproc, yaml_layout, libai_layout = LAYOUTS[layout]
    engine_out, trainer_out = tmp_path / "engine", tmp_path / "train_net"
    micro = [] if layout in ("dp2", "pp2") else ["train.train_micro_batch_size=4"]
    run_train_net(
        ROOT / "configs" / "gpt2_pretrain.py",
        [*LIBAI, *micro, *libai_layout, f"train.output_dir={trainer_out}"],
        nproc=nproc,
        env=sample_env,
    )
    run_tool(
        "train",
        GPT_YAML,
        *YAML,
        *yaml_layout,
        f"Engine.save_load.output_dir={engine_out}",
        nproc=nproc,
        env=sample_env,
    )
    a, b = read_metrics(engine_out), read_metrics(trainer_out)
    assert sorted(a) == sorted(b) == list(range(STEPS))
    for i in range(STEPS):
        assert a[i]["total_loss"] == b[i]["total_loss"], (layout, i, a[i], b[i])
        assert a[i]["lr"] == b[i]["lr"]
