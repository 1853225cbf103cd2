"""The Hugging Face interop core: checkpoint formats, sliced reads, bad input, the converter."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

from libai import dist
from libai.models.utils import CheckpointError, CheckpointReader, load_huggingface
from libai.models.utils.weight_mapping import QKV, Copy, ShardSpec, Src

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=101,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    path = tmp_path_factory.mktemp("gpt2") / "hf"
    model.save_pretrained(path)
    return model, path


@pytest.fixture(autouse=True)
def one_process():
    dist.setup_dist_util({})


def _logits(model, ids):
    return model(ids)["logits"]


def _copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_formats_give_equal_models(gpt2, tmp_path):
    hf, path = gpt2
    ids = torch.randint(0, 101, (2, 7))
    want = hf(ids).logits
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((path / "config.json").read_text())
    torch.save(hf.state_dict(), binary / "pytorch_model.bin")
    for directory in (path, sharded, binary):
        got = _logits(load_huggingface(directory).eval(), ids)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_base_model_checkpoint_loads_into_base_class(gpt2, tmp_path):
    hf, _ = gpt2
    base = tmp_path / "base"
    hf.transformer.save_pretrained(base)  # keys without the "transformer." prefix
    model = load_huggingface(base).eval()
    assert type(model).__name__ == "GPTModel"
    ids = torch.randint(0, 101, (2, 5))
    got = model.lm_head.gather(model(ids))
    torch.testing.assert_close(got, hf(ids).logits, atol=1e-5, rtol=0)


class CountingReader(CheckpointReader):
    """A real reader that records how many elements each read returned."""

    def __init__(self, path):
        super().__init__(path)
        self.elements = 0

    def read(self, name, dim=None, start=0, stop=None):
        t = super().read(name, dim, start, stop)
        self.elements += t.numel()
        return t


def test_a_shard_reads_only_its_rows(gpt2):
    hf, path = gpt2
    state = hf.state_dict()
    reader = CountingReader(path)
    # vocab-split embedding, rank 1 of 2: rows 51..101 of a padded 102-row table
    rule = Copy("w", "transformer.wte.weight")
    local = rule.load(reader, (102, 32), (101, 32), ShardSpec(0, 1, 2))
    assert reader.elements == 50 * 32
    assert torch.equal(local[:50], state["transformer.wte.weight"][51:]) and not local[50].any()
    # GPT-2's fused Conv1D c_attn, rank 0 of 2: heads 0-1 of q, k and v, one column range each
    reader.elements = 0
    name = "transformer.h.0.attn.c_attn.weight"
    srcs = [Src(name, offset=i * 32, transpose=True) for i in range(3)]
    rule = QKV("qkv", *srcs, num_heads=4, head_size=8)
    local = rule.load(reader, (96, 32), (96, 32), ShardSpec(0, 0, 2))
    assert reader.elements == 48 * 32
    full = rule.load(reader, (96, 32), (96, 32), None)
    torch.testing.assert_close(local, full[:48], rtol=0, atol=0)
    # and the export inverts the load
    assert torch.equal(rule.export(full)[name], state[name])


def test_unexpected_tensors_are_named(gpt2, tmp_path, caplog):
    hf, path = gpt2
    extra = _copy_dir(path, tmp_path / "extra")
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    state["transformer.h.0.attn.surprise"] = torch.zeros(3)
    save_file(state, extra / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        load_huggingface(extra)
    assert "transformer.h.0.attn.surprise" in caplog.text


def test_unsupported_model_type_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(CheckpointError, match="unsupported model_type 'mamba'.*llama.*t5"):
        load_huggingface(tmp_path)


def test_missing_shard_named_in_index(gpt2, tmp_path):
    hf, _ = gpt2
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name):
        load_huggingface(tmp_path)


def test_shapes_contradicting_config(gpt2, tmp_path):
    _, path = gpt2
    bad = _copy_dir(path, tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    config["n_inner"] = 64  # the weights have 4 * 32 = 128
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"mlp\.c_fc\.weight: checkpoint \[32, 128\] vs config \[32, 64\]"
    ):
        load_huggingface(bad)


def test_missing_tensor_is_named(gpt2, tmp_path):
    hf, path = gpt2
    bad = _copy_dir(path, tmp_path / "missing")
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    del state["transformer.ln_f.bias"], state["lm_head.weight"]
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing tensors: \['transformer.ln_f.bias'\]"):
        load_huggingface(bad)


def test_no_weights_and_corrupt_weights(gpt2, tmp_path):
    _, path = gpt2
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weights in"):
        load_huggingface(empty)
    (empty / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(CheckpointError, match="corrupt safetensors"):
        load_huggingface(empty)
    with pytest.raises(CheckpointError, match="no config.json"):
        load_huggingface(tmp_path)


def test_convert_checkpoint_round_trip(gpt2, tmp_path):
    hf, path = gpt2
    tool = [sys.executable, str(ROOT / "tools" / "convert_checkpoint.py")]
    ckpt = tmp_path / "ckpt"
    subprocess.run([*tool, "from-hf", "--hf-dir", str(path), "--output", str(ckpt)], check=True)
    assert (ckpt / "model_hf" / ".metadata").exists()
    out = tmp_path / "back"
    cmd = [*tool, "to-hf", "--checkpoint", str(ckpt / "model_hf"), "--output", str(out)]
    subprocess.run(cmd, check=True)
    back = transformers.GPT2LMHeadModel.from_pretrained(out).state_dict()
    for name, value in hf.state_dict().items():
        assert torch.equal(back[name], value), name


def test_skip_init_then_init_deferred_equals_normal_init():
    from libai.layers.param import init_deferred, skip_init
    from libai.models.gpt_model import GPTModel

    kwargs = dict(
        hidden_layers=2, vocab_size=50, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2
    )
    torch.manual_seed(3)
    normal = GPTModel(**kwargs)
    torch.manual_seed(3)
    with skip_init():
        deferred = GPTModel(**kwargs)
    for p in deferred.parameters():
        init_deferred(p)
    for (name, a), b in zip(normal.named_parameters(), deferred.parameters()):
        assert torch.equal(a, b), name


def test_optional_missing_tensors_are_initialized_and_named(gpt2, tmp_path, caplog):
    from libai.models.utils.model_loader.gpt_loader import GPT2LoaderHuggerFace

    class HeadlessOK(GPT2LoaderHuggerFace):
        optional_missing = (r"ln_f\.",)

    hf, path = gpt2
    bad = _copy_dir(path, tmp_path / "no_ln_f")
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if "ln_f" not in k}
    del state["lm_head.weight"]
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        model = HeadlessOK(pretrained_model_path=str(bad)).load()
    assert "newly initialized" in caplog.text and "layernorm_f.weight" in caplog.text
    ln_f = model.GPT_model.transformer.layernorm_f
    assert torch.equal(ln_f.weight, torch.ones(32)) and torch.equal(ln_f.bias, torch.zeros(32))
    wte = model.GPT_model.embeddings.token_embeddings.weight
    assert torch.equal(wte, hf.transformer.wte.weight)
