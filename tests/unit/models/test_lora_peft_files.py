"""The PEFT adapter files themselves: the config we write is PEFT's (read back by
``peft.LoraConfig.from_pretrained``, field by field), the config we read takes PEFT's fields
with PEFT's defaults and refuses, by name, what this library cannot honour."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from libai import dist
from libai.models.lora import LoRAConfig, apply_lora
from libai.models.lora_peft import _TensorReader, read_peft_config, save_peft_adapter
from libai.models.utils import load_huggingface

peft = pytest.importorskip("peft")


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})
    yield
    dist.reset_dist_util()


def test_the_written_config_is_peft_s(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    model = load_huggingface(str(tmp_path / "base"))
    settings = LoRAConfig(
        target_modules=("q_proj", "down_proj"),
        r=4,
        lora_alpha=12.0,
        lora_dropout=0.05,
        use_rslora=True,
        modules_to_save=("lm_head",),
    )
    apply_lora(model, settings)
    save_peft_adapter(model, settings, str(tmp_path / "a"), "old/base")
    save_peft_adapter(model, settings, str(tmp_path / "a"), "org/base")  # over an export
    theirs = peft.LoraConfig.from_pretrained(str(tmp_path / "a"))
    assert theirs.peft_type == peft.PeftType.LORA and theirs.task_type == "CAUSAL_LM"
    assert (theirs.r, theirs.lora_alpha, theirs.lora_dropout) == (4, 12.0, 0.05)
    assert theirs.use_rslora is True and theirs.bias == "none"
    assert set(theirs.target_modules) == {"q_proj", "down_proj"}
    assert list(theirs.modules_to_save) == ["lm_head"]
    assert theirs.fan_in_fan_out is False  # Llama's Linear weights are [out, in]
    assert theirs.base_model_name_or_path == "org/base"
    assert theirs.inference_mode is True and theirs.init_lora_weights is True
    back = read_peft_config(str(tmp_path / "a"))  # and ours reads it back unchanged
    assert back == LoRAConfig(
        target_modules=("down_proj", "q_proj"), r=4, lora_alpha=12.0, lora_dropout=0.05,
        use_rslora=True, modules_to_save=("lm_head",),
    )  # fmt: skip


def write_config(tmp_path, **fields) -> str:
    path = tmp_path / "adapter"
    path.mkdir(exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps(fields))
    return str(path)


def test_read_config_takes_peft_defaults(tmp_path):
    minimal = read_peft_config(write_config(tmp_path, r=2, lora_alpha=4, target_modules=["v"]))
    assert minimal == LoRAConfig(target_modules=("v",), r=2, lora_alpha=4.0)
    assert minimal.lora_dropout == 0.0 and minimal.use_rslora is False
    assert minimal.modules_to_save == ()
    regex = read_peft_config(write_config(tmp_path, r=2, lora_alpha=4, target_modules=".*q"))
    assert regex.target_modules == ".*q"  # PEFT's regex form stays a string
    given = read_peft_config(
        write_config(
            tmp_path,
            peft_type="LORA",
            r=2,
            lora_alpha=4,
            target_modules=["v"],
            lora_dropout=0.1,
            use_rslora=True,
            modules_to_save=["lm_head"],
            use_dora=False,
            rank_pattern={},
            alpha_pattern={},
            layers_to_transform=None,
        )  # fmt: skip
    )
    assert (given.lora_dropout, given.use_rslora, given.modules_to_save) == (
        0.1,
        True,
        ("lm_head",),
    )


@pytest.mark.parametrize(
    "field, value",
    [("use_dora", True), ("rank_pattern", {"q": 8}), ("alpha_pattern", {"q": 8}),
     ("layers_to_transform", [0])],
)  # fmt: skip
def test_read_config_refuses_what_it_cannot_honour(tmp_path, field, value):
    path = write_config(tmp_path, r=2, lora_alpha=4, target_modules=["v"], **{field: value})
    with pytest.raises(ValueError, match=rf"PEFT's {field}=.* is not supported here"):
        read_peft_config(path)


def test_read_config_refuses_other_adapters_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="a PREFIX_TUNING adapter; only LoRA loads here"):
        read_peft_config(write_config(tmp_path, peft_type="PREFIX_TUNING", r=1))
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        read_peft_config(str(tmp_path / "nowhere"))


def test_tensor_reader_reads_rows_as_the_rules_ask():
    """A tensor-parallel shard of a saved module reads a slice along one dim."""
    t = torch.arange(24.0).view(4, 6)
    reader = _TensorReader({"w": t}, "file")
    assert torch.equal(reader.read("w"), t)
    assert torch.equal(reader.read("w", 0, 1, 3), t[1:3])
    assert torch.equal(reader.read("w", 1, 2, None), t[:, 2:])
    assert reader.shape("w") == (4, 6) and reader.dtype("w") == torch.float32
    got = reader.read("w", 0, 0, 2)
    got += 1  # a copy: the file's tensor is untouched
    assert torch.equal(t, torch.arange(24.0).view(4, 6))
