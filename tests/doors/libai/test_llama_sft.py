"""configs/llama_sft.py through tools/train_net.py: a tiny Llama fine-tuned on SFT records with
a tiny tokenizer.json (pipeline-parallel, the padding mask handed between stages), and the
same config starting from a Hugging Face checkpoint (``LazyCall(load_huggingface)``)."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from train_net_helpers import ROOT, read_metrics, run_train_net, train_env
from zoo_data import build_sft_files

CONFIG = str(ROOT / "configs" / "llama_sft.py")


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    """A byte-level BPE tokenizer.json with <pad> and </s>, and a JSON-lines SFT file."""
    root = tmp_path_factory.mktemp("llama_sft")
    tok_dir, data, vocab = build_sft_files(root)
    env = train_env()
    common = [
        f"tokenization.tokenizer.tokenizer_file={tok_dir}",
        f"dataloader.train.dataset.0.data_path={data}",
        "dataloader.train.dataset.0.max_seq_length=96",
        "train.train_epoch=0",
        "train.train_iter=6",
        "train.train_micro_batch_size=4",
        "train.log_period=1",
        "train.checkpointer.period=100",
    ]
    return root, env, common, vocab


def train_net(env, out_dir, overrides, nproc=1):
    proc = run_train_net(CONFIG, [*overrides, f"train.output_dir={out_dir}"], nproc=nproc, env=env)
    losses = {i: r["total_loss"] for i, r in read_metrics(out_dir).items() if "total_loss" in r}
    return losses, proc.stdout + proc.stderr


def test_sft_trains_a_tiny_llama_on_two_pipeline_stages(sft_data, tmp_path):
    root, env, common, _ = sft_data
    tiny = [
        "model.cfg.hidden_layers=2",
        "model.cfg.hidden_size=32",
        "model.cfg.intermediate_size=64",
        "model.cfg.num_attention_heads=4",
        "model.cfg.num_key_value_heads=2",
        "model.cfg.max_position_embeddings=128",
        "optim.lr=1e-2",
    ]
    accumulation = ["train.num_accumulation_steps=2"]
    layout = ["train.dist.pipeline_parallel_size=2", *accumulation]
    losses, log = train_net(env, tmp_path / "pp2", [*common, *tiny, *layout], nproc=2)
    assert sorted(losses) == list(range(6)), losses
    assert "LlamaForCausalLM" in log
    # one process on the same two micro-batches per step: the same losses
    one, _ = train_net(env, tmp_path / "one", [*common, *tiny, *accumulation])
    assert [losses[i] for i in range(6)] == pytest.approx([one[i] for i in range(6)], abs=1e-5)
    assert losses[5] < losses[0] - 0.3, losses  # it learns the answers


def test_sft_starts_from_a_hugging_face_checkpoint(sft_data, tmp_path):
    """``model = LazyCall(load_huggingface)(path=...)`` (here as overrides): the first loss is
    that of the checkpoint's weights, whose zero final-norm makes every logit 0, so it is
    exactly ln(vocab of config.json), not that of a random or tokenizer-sized model."""
    _, env, common, vocab = sft_data
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=vocab,
        max_position_embeddings=128,
    )
    hf = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        hf.model.norm.weight.zero_()
    hf.save_pretrained(tmp_path / "hf")
    pretrained = [
        "model._target_=libai.models.utils.load_huggingface",
        f"+model.path={tmp_path / 'hf'}",
        "~model.cfg",
        "tokenization.setup=False",
        "train.train_iter=2",
    ]
    losses, log = train_net(env, tmp_path / "ft", [*common, *pretrained])
    assert abs(losses[0] - math.log(vocab)) < 1e-5, (losses, vocab)
    assert "LlamaForCausalLM" in log
