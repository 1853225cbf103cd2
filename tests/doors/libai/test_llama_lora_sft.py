"""configs/llama_lora_sft.py through tools/train_net.py on a Hugging Face base (tp2), then
tools/convert_checkpoint.py: the adapters exported as a PEFT directory load with
``peft.PeftModel.from_pretrained`` onto the untouched base and give the logits of the merged
export (``to-hf --merge-lora``) loaded in transformers; the base weights did not move; the
inference pipeline on the run's config and checkpoint gives the same logits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import transformers
from train_net_helpers import ROOT, read_metrics, run_train_net, train_env
from zoo_data import build_sft_files

from libai.checkpoint.checkpointer import read_checkpoint_metadata
from libai.checkpoint.files import read_rank_file

peft = pytest.importorskip("peft")
CONFIG = str(ROOT / "configs" / "llama_lora_sft.py")


def test_lora_sft_exports_a_peft_adapter_and_a_merged_model(tmp_path):
    (tmp_path / "data").mkdir()
    tok_dir, data, vocab = build_sft_files(tmp_path / "data")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=vocab, max_position_embeddings=128,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    out = tmp_path / "run"
    overrides = [
        f"tokenization.tokenizer.tokenizer_file={tok_dir}",
        f"dataloader.train.dataset.0.data_path={data}",
        "dataloader.train.dataset.0.max_seq_length=64",
        "model._target_=libai.models.utils.load_huggingface",
        f"+model.path={tmp_path / 'base'}",
        "~model.cfg",
        "tokenization.setup=False",
        "train.train_epoch=0",
        "train.train_iter=4",
        "train.train_micro_batch_size=4",
        "train.log_period=1",
        "train.lora.lora_dropout=0.0",
        "optim.lr=5e-2",
        "train.dist.tensor_parallel_size=2",
        f"train.output_dir={out}",
    ]
    proc = run_train_net(CONFIG, overrides, nproc=2, env=train_env())
    log = proc.stdout + proc.stderr
    assert "LoRA r=8 alpha=16 on 10 layers" in log, log[-3000:]
    losses = [r["total_loss"] for _, r in sorted(read_metrics(out).items()) if "total_loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    base_identity = adapter_only(out / "model_final")  # the base is named, not copied
    assert base_identity["kind"] == "huggingface"
    assert base_identity["path"] == str(tmp_path / "base")

    convert = [sys.executable, str(ROOT / "tools" / "convert_checkpoint.py")]
    common = ["--checkpoint", str(out / "model_final"), "--config-file", str(out / "config.yaml")]
    for command in (
        ["to-peft", *common, "--output", str(tmp_path / "adapter")],
        ["to-hf", "--merge-lora", *common, "--output", str(tmp_path / "merged")],
    ):
        subprocess.run([*convert, *command], check=True, capture_output=True, cwd=tmp_path)
    refused = subprocess.run([*convert, "to-hf", *common, "--output", str(tmp_path / "x")],
                             capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert refused.returncode != 0 and "--merge-lora" in refused.stderr
    settings = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert settings["base_model_name_or_path"] == str(tmp_path / "base")  # the run's base

    x = torch.randint(0, vocab, (2, 11), generator=torch.Generator().manual_seed(0))
    base = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base").eval()
    with torch.no_grad():
        plain = base(x).logits
        adapted = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
        with_adapter = adapted(x).logits
        merged = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "merged").eval()
        assert (with_adapter - plain).abs().max() > 1e-3  # training moved the adapters
        torch.testing.assert_close(merged(x).logits, with_adapter, atol=1e-5, rtol=1e-5)

    # the inference pipeline on the run's own config and checkpoint: adapters applied,
    # loaded and merged (one process; the run was tp2)
    from libai import dist
    from libai.inference import TextGenerationPipeline

    pipe = TextGenerationPipeline(
        config_file=str(out / "config.yaml"), model_path=str(out), mode="libai"
    )
    with torch.no_grad():
        ours = pipe.model(x)["logits"]
    torch.testing.assert_close(ours.float(), with_adapter, atol=1e-5, rtol=1e-5)
    dist.reset_dist_util()


def adapter_only(checkpoint) -> dict:
    """The base identity of an adapter-only checkpoint (its model entries all adapters)."""
    keys = read_checkpoint_metadata(str(checkpoint)).state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora." in k for k in model_keys), model_keys
    return read_rank_file(str(checkpoint), 0)["lora_base"]


def test_a_lora_run_resumes_bitwise(tmp_path):
    """A LoRA run on tp2 on the base of a libai checkpoint (``train.load_weight``, a run
    without adapters), stopped after its checkpoint at step 3 and resumed, continues with
    the straight run's losses exactly: the checkpoint holds the adapters and their optimizer
    state and names the base, which the resume loads again."""
    (tmp_path / "data").mkdir()
    tok_dir, data, _ = build_sft_files(tmp_path / "data")
    out = tmp_path / "run"
    common = [
        f"tokenization.tokenizer.tokenizer_file={tok_dir}",
        f"dataloader.train.dataset.0.data_path={data}",
        "dataloader.train.dataset.0.max_seq_length=64",
        "model.cfg.hidden_layers=2",
        "model.cfg.hidden_size=32",
        "model.cfg.intermediate_size=64",
        "model.cfg.num_attention_heads=4",
        "model.cfg.num_key_value_heads=2",
        "model.cfg.max_position_embeddings=128",
        "train.train_epoch=0",
        "train.train_iter=6",
        "train.train_micro_batch_size=4",
        "train.log_period=1",
        "train.checkpointer.period=3",
        "train.lora.lora_dropout=0.0",
        "train.dist.tensor_parallel_size=2",
    ]
    pretrain = tmp_path / "pretrain"  # the base: the same model trained without adapters
    no_lora = ["train.lora.target_modules=[]", "train.train_iter=2", "optim.lr=1e-2"]
    run_train_net(CONFIG, [*common, *no_lora, f"train.output_dir={pretrain}"], nproc=2,
                  env=train_env())  # fmt: skip
    common += [f"train.output_dir={out}", f"train.load_weight={pretrain / 'model_final'}"]
    run_train_net(CONFIG, common, nproc=2, env=train_env())
    straight = read_metrics(out)
    base = adapter_only(out / "model_0000002")
    assert base["kind"] == "checkpoint" and base["path"] == str(pretrain / "model_final")
    (out / "last_checkpoint").write_text("model_0000002\n")
    (out / "metrics.json").unlink()
    proc = run_train_net(CONFIG, common, nproc=2, env=train_env(), extra_args=("--resume",))
    assert "Resumed at iteration 3" in proc.stdout + proc.stderr
    resumed = read_metrics(out)
    assert sorted(resumed) == [3, 4, 5]
    for i in (3, 4, 5):
        assert resumed[i]["total_loss"] == straight[i]["total_loss"], (i, resumed, straight)
