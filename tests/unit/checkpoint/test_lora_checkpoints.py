"""Checkpoints of LoRA runs: the trained parameters alone, with the identity (path and
SHA-256 of the weight files) of the frozen base they were trained on, when that base was
read from files; the base loaded back from its Hugging Face directory or libai checkpoint;
a model holding another base refused in one line. A base read from no file is saved whole."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
import transformers

from libai import dist
from libai.checkpoint import Checkpointer, CheckpointError
from libai.checkpoint.checkpointer import read_checkpoint_metadata
from libai.checkpoint.files import read_rank_file
from libai.models import LlamaForCausalLM
from libai.models.lora import LoRAConfig, apply_lora
from libai.models.utils import load_huggingface

VOCAB = 61
LORA = LoRAConfig(target_modules=("q_proj", "v_proj", "down_proj"), r=4, lora_alpha=8.0)


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})
    yield
    dist.reset_dist_util()


def hf_llama(path, seed: int = 0, kv_heads: int = 2):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def libai_llama(seed: int):
    """A model built in the program: its weights come from no file."""
    torch.manual_seed(seed)
    sizes = dict(hidden_layers=2, vocab_size=VOCAB, hidden_size=32, intermediate_size=48)
    return LlamaForCausalLM(cfg=dict(sizes, num_attention_heads=4))


def train_adapters(model, seed: int = 5) -> None:
    """Stand-in for training: random values in every trained parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def values(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def saved_model_keys(ckpt) -> set[str]:
    keys = read_checkpoint_metadata(str(ckpt)).state_dict_metadata
    return {k[len("model.") :] for k in keys if k.startswith("model.")}


def test_an_hf_base_is_named_and_hashed_not_saved(tmp_path):
    base = hf_llama(tmp_path / "base")
    model = load_huggingface(str(base))
    apply_lora(model, LORA)
    train_adapters(model)
    want = values(model)
    Checkpointer(model, str(tmp_path / "run")).save("model_0")
    ckpt = tmp_path / "run" / "model_0"

    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora." in n for n in trained)
    assert saved_model_keys(ckpt) == trained  # no base weight in the checkpoint
    digest = hashlib.sha256(b"model.safetensors\0")
    digest.update((base / "model.safetensors").read_bytes())
    identity = read_rank_file(str(ckpt), 0)["lora_base"]
    assert identity == {
        "kind": "huggingface",
        "path": os.path.abspath(base),
        "sha256": digest.hexdigest(),
    }

    again = load_huggingface(str(base))
    apply_lora(again, LORA)
    Checkpointer(again).load(str(ckpt), checkpointables=[])
    got = values(again)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_adapters_of_another_base_are_refused(tmp_path):
    base = hf_llama(tmp_path / "base")
    model = load_huggingface(str(base))
    apply_lora(model, LORA)
    Checkpointer(model, str(tmp_path / "run")).save("model_0")
    ckpt = str(tmp_path / "run" / "model_0")

    other = load_huggingface(str(hf_llama(tmp_path / "other", seed=1)))
    apply_lora(other, LORA)
    before = values(other)
    with pytest.raises(CheckpointError) as err:
        Checkpointer(other).load(ckpt, checkpointables=[])
    message = str(err.value)
    assert "\n" not in message
    assert f"trained on the huggingface weights at {os.path.abspath(base)}" in message
    assert f"this model holds the huggingface weights at {tmp_path / 'other'}" in message
    assert all(torch.equal(v, before[k]) for k, v in values(other).items())  # untouched

    built = libai_llama(4)  # weights from no file
    apply_lora(built, LoRAConfig(target_modules=("q_proj", "v_proj", "down_proj"), r=4))
    with pytest.raises(CheckpointError, match="this model holds weights read from no file"):
        Checkpointer(built).load(ckpt, checkpointables=[])

    plain = load_huggingface(str(base))  # no adapters applied
    with pytest.raises(CheckpointError, match=r"LoRA adapters only: apply the run's LoRA"):
        Checkpointer(plain).load(ckpt, checkpointables=[])

    fewer = load_huggingface(str(hf_llama(tmp_path / "same", seed=0)))
    apply_lora(fewer, LoRAConfig(target_modules=("q_proj", "k_proj"), r=4))
    # the same weights under another path hold the same base; but other target modules
    with pytest.raises(CheckpointError, match=r"has no .*lora_A_k .*other train.lora settings"):
        Checkpointer(fewer).load(ckpt, checkpointables=[])

    # the same path, other weights in it: the hash tells
    hf_llama(base, seed=2)
    changed = load_huggingface(str(base))
    apply_lora(changed, LORA)
    with pytest.raises(CheckpointError, match="but the weights there changed since"):
        Checkpointer(changed).load(ckpt, checkpointables=[])


def test_a_libai_checkpoint_base_loads_into_a_lora_model_and_back(tmp_path):
    """train.load_weight of a checkpoint without adapters fills the LoRA model's base; its
    checkpoints then name that checkpoint, and loading one loads the base from it first."""
    source = libai_llama(0)
    Checkpointer(source, str(tmp_path / "pretrain")).save("model_final")
    base_ckpt = tmp_path / "pretrain" / "model_final"

    def fresh(seed):
        model = libai_llama(seed)  # random weights, not the base's
        apply_lora(model, LORA)
        return model

    model = fresh(7)
    Checkpointer(model).load(str(base_ckpt), checkpointables=[])
    for name, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    train_adapters(model)
    want = values(model)
    Checkpointer(model, str(tmp_path / "lora")).save("model_0")
    ckpt = tmp_path / "lora" / "model_0"
    identity = read_rank_file(str(ckpt), 0)["lora_base"]
    digest = hashlib.sha256(b"manifest.json\0" + (base_ckpt / "manifest.json").read_bytes())
    assert identity == {
        "kind": "checkpoint",
        "path": os.path.abspath(base_ckpt),
        "sha256": digest.hexdigest(),  # the manifest holds a checksum of every file
    }
    assert saved_model_keys(ckpt) == {n for n, p in model.named_parameters() if p.requires_grad}

    again = fresh(8)
    Checkpointer(again).load(str(ckpt), checkpointables=[])  # the base first, then these
    got = values(again)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # a model built from a Hugging Face directory (model.path) and the run's train.load_weight:
    # resuming its adapters loads the checkpoint base over the directory's weights
    hf = load_huggingface(str(hf_llama(tmp_path / "hf", kv_heads=4)))
    apply_lora(hf, LORA)
    Checkpointer(hf).load(str(ckpt))
    got = values(hf)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_a_base_from_no_file_is_saved_whole(tmp_path):
    model = libai_llama(3)
    apply_lora(model, LORA)
    train_adapters(model)
    Checkpointer(model, str(tmp_path / "run")).save("model_0")
    ckpt = tmp_path / "run" / "model_0"
    assert read_rank_file(str(ckpt), 0)["lora_base"] is None
    assert saved_model_keys(ckpt) == set(model.state_dict())
