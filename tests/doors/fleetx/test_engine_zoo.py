"""The zoo's ready-made task modules: a YAML of configs/fleetx alone trains Llama SFT (also
on two pipeline stages and from a Hugging Face checkpoint), BERT / RoBERTa sequence
classification and ViT image classification, with accuracy in evaluation."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from engine_helpers import ROOT, make_engine, run_tool
from train_net_helpers import read_metrics
from zoo_data import build_image_folder, build_sft_files, build_text_classification

from libai.fleetx.yaml_config import load_yaml_config

CONFIGS = ROOT / "configs" / "fleetx"


def yaml(name, out_dir, *overrides):
    return load_yaml_config(
        CONFIGS / name,
        [f"Engine.save_load.output_dir={out_dir}", "Engine.logging_freq=1", *overrides],
    )


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    tok_dir, data, vocab = build_sft_files(root)
    overrides = [
        f"Model.tokenizer={tok_dir}",
        f"Data.Train.dataset.data_path={data}",
        "Data.Train.dataset.max_seq_length=96",
        "Model.hidden_layers=2",
        "Model.hidden_size=32",
        "Model.intermediate_size=64",
        "Model.num_attention_heads=4",
        "Model.num_key_value_heads=2",
        "Model.max_position_embeddings=128",
        "Engine.max_steps=6",
        "Optimizer.lr.learning_rate=1e-2",
    ]
    return root, tok_dir, vocab, overrides


def test_llama_sft_trains_on_two_pipeline_stages(sft, tmp_path):
    """Distributed.pp_degree=2 gives the losses of one process running the same two
    micro-batches per step (the loss is a mean of micro-batch token means)."""
    _, _, _, overrides = sft
    batches = ["Global.global_batch_size=4", "Global.micro_batch_size=2"]
    losses = {}
    for name, nproc, layout in (("pp2", 2, ["Distributed.pp_degree=2"]), ("one", 1, [])):
        out = tmp_path / name
        run_tool(
            "train",
            CONFIGS / "llama_sft.yaml",
            *overrides,
            f"Engine.save_load.output_dir={out}",
            "Engine.logging_freq=1",
            *batches,
            *layout,
            nproc=nproc,
        )
        losses[name] = [read_metrics(out)[i]["total_loss"] for i in range(6)]
    assert losses["pp2"] == pytest.approx(losses["one"], abs=1e-5)
    assert losses["one"][5] < losses["one"][0] - 0.3, losses  # it learns the answers


def test_llama_sft_from_a_hugging_face_checkpoint(sft, tmp_path):
    """The first loss is that of the checkpoint's weights: a zero final norm makes every
    logit 0, so it is exactly ln(the checkpoint's vocabulary)."""
    _, tok_dir, vocab, overrides = sft
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=vocab + 5,
        max_position_embeddings=128,
    )
    hf = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        hf.model.norm.weight.zero_()
    hf.save_pretrained(tmp_path / "hf")
    shape_keys = ("Model.hidden", "Model.intermediate", "Model.num_", "Model.max_position")
    data = [o for o in overrides if not o.startswith(shape_keys)]
    cfg = yaml(
        "llama_sft.yaml",
        tmp_path / "ft",
        *data,
        f"Model.pretrained={tmp_path / 'hf'}",
        "~Model.hidden_layers",
        "~Model.hidden_size",
        "~Model.intermediate_size",
        "~Model.num_attention_heads",
        "~Model.num_key_value_heads",
        "~Model.max_position_embeddings",
        "Engine.max_steps=1",
    )
    engine = make_engine(cfg)
    engine.fit()
    assert engine.module.model.model.embed_tokens.num_embeddings == vocab + 5
    loss = read_metrics(tmp_path / "ft")[0]["total_loss"]
    assert abs(loss - math.log(vocab + 5)) < 1e-5


def test_vit_classification_reports_accuracy(tmp_path):
    root = build_image_folder(tmp_path / "images")
    cfg = yaml(
        "vit_classification.yaml",
        tmp_path / "run",
        f"Data.Train.dataset.root={root / 'train'}",
        f"Data.Eval.dataset.root={root / 'val'}",
        "Model.img_size=16",
        "Model.patch_size=4",
        "Model.embed_dim=32",
        "Model.depth=2",
        "Model.num_heads=4",
        "Model.num_classes=3",
        "Global.global_batch_size=6",
        "Global.micro_batch_size=6",
        "Engine.num_train_epochs=4",
        "Optimizer.lr.max_lr=3e-3",
    )
    engine = make_engine(cfg)
    assert engine.steps_per_epoch == 6 and engine.max_iter == 24
    engine.fit()
    metrics = read_metrics(tmp_path / "run")
    evals = [m for m in metrics.values() if "eval_acc" in m]
    assert [m["iteration"] for m in evals] == [5, 11, 17, 23]  # run_mode: epoch, eval_freq 1
    assert all(0.0 <= m["eval_acc"] <= 1.0 for m in evals)
    assert metrics[23]["total_loss"] < metrics[0]["total_loss"]
    assert sorted(p.name for p in (tmp_path / "run").glob("model_00*")) == [
        "model_0000005",
        "model_0000011",
        "model_0000017",
        "model_0000023",
    ]  # save_epoch: 1


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_text_classification_fine_tunes_a_pretraining_checkpoint(tmp_path, model_type):
    hf_dir, train, dev = build_text_classification(tmp_path, model_type)
    cfg = yaml(
        "text_classification.yaml",
        tmp_path / "run",
        f"Model.pretrained={hf_dir}",
        f"Data.Train.dataset.data_path={train}",
        f"Data.Eval.dataset.data_path={dev}",
        "Data.Train.dataset.max_seq_length=32",
        "Global.global_batch_size=16",
        "Global.micro_batch_size=8",
        "Engine.num_train_epochs=6",
        "Engine.eval_freq=10",
        "Optimizer.lr.learning_rate=8e-3",
    )
    engine = make_engine(cfg)
    expected = "RobertaForClassification" if model_type == "roberta" else "BertForClassification"
    assert type(engine.module.model).__name__ == expected
    engine.fit()
    metrics = read_metrics(tmp_path / "run")
    assert sorted(metrics) == list(range(30))
    evals = [m for m in metrics.values() if "eval_acc" in m]
    assert len(evals) == 3 and all(0.0 <= m["eval_acc"] <= 1.0 for m in evals)
    assert evals[-1]["eval_acc"] >= 0.75, evals  # "good" vs "bad" is learned
    assert metrics[29]["total_loss"] < metrics[0]["total_loss"]
