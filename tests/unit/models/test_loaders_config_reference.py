"""What the Llama / Qwen2, T5, GPT-2 and base loaders translate between ``config.json`` and
libai, each against an independent reference: transformers reading the same directory (its
config defaults for keys a ``config.json`` lacks, the RoPE frequencies, the logits), the
``config.json`` transformers itself writes for the same hyper-parameters (exports of models
built without a checkpoint, where no source setting fills a gap), transformers' fixed Qwen2
layout, and a hand-built tied pair for the tied-copy rule."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from hf_parity import edit_config
from safetensors.torch import save_file
from torch import nn

from libai import dist
from libai.models import LlamaForCausalLM, T5ForPreTraining
from libai.models.utils import load_huggingface, save_huggingface
from libai.models.utils.hf_export import model_libai_cfg
from libai.models.utils.hf_io import CheckpointReader
from libai.models.utils.model_loader.base_loader import complete_rules, load_weights
from libai.models.utils.model_loader.t5_loader import T5LoaderHuggerFace
from libai.models.utils.weight_mapping import Copy

TOL = 1e-4
LLAMA_SHAPES = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    vocab_size=61,
    max_position_embeddings=64,
    attention_dropout=0.0,
)
T5_SHAPES = dict(
    vocab_size=53,
    d_model=16,
    d_kv=8,
    d_ff=24,
    num_layers=1,
    num_heads=2,
    dropout_rate=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
    decoder_start_token_id=0,
)


@pytest.fixture(autouse=True)
def single_process():
    dist.setup_dist_util({})
    yield
    dist.reset_dist_util()


def t5_logits(model, hf, ids, dec):
    with torch.no_grad():
        got = model.eval()(encoder_input_ids=ids, decoder_input_ids=dec)["logits"]
        want = hf.eval()(input_ids=ids, decoder_input_ids=dec).logits
    return got, want


# ---- base loader: tied copies -------------------------------------------------------------------
class TiedPair(nn.Module):
    """An embedding and a head marked as LMLogits marks a tied pair."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.emb.weight.libai_tied_group = "words"
        self.head.weight.libai_tied_group = "words"
        self.head.weight.libai_tied_copy = True


def test_tied_copy_without_rule_reuses_its_groups_rule(tmp_path):
    """complete_rules' contract: a tied copy with no rule of its own gets its group's rule
    (renamed), so loading fills it with the same checkpoint tensor (the reference: the
    tensor written to the file by hand)."""
    model = TiedPair()
    rules = complete_rules(model, [Copy("emb.weight", "wte.weight")])
    assert rules["head.weight"] == Copy("head.weight", "wte.weight")
    wte = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    save_file({"wte.weight": wte}, str(tmp_path / "model.safetensors"))
    load_weights(model, CheckpointReader(str(tmp_path)), [Copy("emb.weight", "wte.weight")])
    assert torch.equal(model.emb.weight, wte) and torch.equal(model.head.weight, wte)
    # a parameter that is not a tied copy is never covered by a group's rule
    del model.head.weight.libai_tied_copy
    with pytest.raises(RuntimeError, match=r"misses \['head.weight'\]"):
        complete_rules(model, [Copy("emb.weight", "wte.weight")])


# ---- GPT-2 --------------------------------------------------------------------------------------
def test_gpt2_config_without_embd_pdrop_takes_transformers_default(tmp_path):
    """A config.json without ``embd_pdrop``: the embedding dropout is GPT2Config's default,
    as transformers reads the same directory."""
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=37, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    edit_config(tmp_path, drop=["embd_pdrop"])
    want = transformers.GPT2Config.from_pretrained(tmp_path).embd_pdrop
    assert want == transformers.GPT2Config().embd_pdrop
    model = load_huggingface(str(tmp_path))
    assert model.GPT_model.embeddings.dropout.p == want
    assert model_libai_cfg(model)["embedding_dropout_prob"] == want


# ---- Llama / Qwen2 ------------------------------------------------------------------------------
def test_llama_top_level_rope_theta_of_older_configs(tmp_path):
    """The older spelling (top-level ``rope_theta``, no ``rope_parameters``): libai's RoPE
    frequencies equal those transformers builds from the same directory, at a non-default
    base."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_SHAPES))
    hf.save_pretrained(tmp_path)
    edit_config(tmp_path, drop=["rope_parameters", "rope_scaling"], rope_theta=3e4)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    assert reference.config.rope_parameters["rope_theta"] == 3e4
    model = load_huggingface(str(tmp_path))
    want = reference.model.rotary_emb.inv_freq
    assert torch.equal(model.model.rotary_emb.inv_freq, want)


def test_llama3_scaling_without_original_max_position_embeddings(tmp_path):
    """A llama3 RoPE scaling without ``original_max_position_embeddings``: transformers
    defaults it to ``max_position_embeddings``; libai's frequencies and logits equal it."""
    torch.manual_seed(1)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}
    scaling["high_freq_factor"] = 4.0
    config = transformers.LlamaConfig(**LLAMA_SHAPES, rope_theta=5e5, rope_scaling=dict(scaling))
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    params = {"rope_theta": 5e5, **scaling}  # no original_max_position_embeddings
    assert "original_max_position_embeddings" not in params
    edit_config(tmp_path, drop=["rope_scaling"], rope_parameters=params)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert reference.config.rope_parameters["original_max_position_embeddings"] == 64
    model = load_huggingface(str(tmp_path)).eval()
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
    x = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (model(x)["logits"] - reference(input_ids=x).logits).abs().max()
    assert diff < TOL


def test_llama_mlp_bias_checkpoint_equals_transformers(tmp_path):
    """A Llama with ``mlp_bias=True`` (non-zero biases): the libai model keeps the MLP
    biases and its logits equal transformers'."""
    torch.manual_seed(3)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_SHAPES, mlp_bias=True))
    with torch.no_grad():  # transformers initializes biases to zero: make them count
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    hf.save_pretrained(tmp_path)
    model = load_huggingface(str(tmp_path)).eval()
    x = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        diff = (model(x)["logits"] - hf.eval()(input_ids=x).logits).abs().max()
    assert diff < TOL


@pytest.mark.parametrize(
    "biases", [dict(attention_bias=False, mlp_bias=True), dict(attention_bias=True, mlp_bias=False)]
)
def test_qwen2_export_refuses_biases_qwen2_does_not_have(tmp_path, biases):
    """transformers' Qwen2 has q/k/v biases only (no o_proj, no MLP biases): exporting a
    libai qwen2 model with either of those biases is refused, not written as a model
    transformers would silently build without them."""
    qwen2 = transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**{**LLAMA_SHAPES, "hidden_size": 16, "intermediate_size": 8})
    )
    attn, mlp = qwen2.model.layers[0].self_attn, qwen2.model.layers[0].mlp
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None
    assert mlp.gate_proj.bias is None and mlp.down_proj.bias is None
    cfg = dict(
        model_type="qwen2",
        hidden_layers=1,
        vocab_size=61,
        hidden_size=16,
        intermediate_size=8,
        num_attention_heads=2,
        qkv_bias=True,
        **biases,
    )
    model = LlamaForCausalLM(cfg=cfg)
    with pytest.raises(ValueError, match="qwen2 export needs"):
        save_huggingface(model, str(tmp_path / "out"))


def test_llama_built_without_checkpoint_exports_what_transformers_writes(tmp_path):
    """A libai Llama built from scratch (non-default sizes, no source config to fill gaps):
    transformers reads the exported config.json as the LlamaConfig of the same sizes, and
    the transformers model loaded from the export has libai's logits."""
    torch.manual_seed(5)
    cfg = dict(
        hidden_layers=1,
        vocab_size=50,
        hidden_size=48,
        intermediate_size=80,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = LlamaForCausalLM(cfg=cfg).eval()
    save_huggingface(model, str(tmp_path))
    want = transformers.LlamaConfig(
        num_hidden_layers=1,
        vocab_size=50,
        hidden_size=48,
        intermediate_size=80,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=32,
        architectures=["LlamaForCausalLM"],
    ).to_dict()
    got = transformers.LlamaConfig.from_pretrained(tmp_path).to_dict()
    assert {k: got.get(k) for k in want} == want
    assert set(got) == set(want)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        diff = (model(x)["logits"] - hf(input_ids=x).logits).abs().max()
    assert diff < TOL


# ---- T5 -----------------------------------------------------------------------------------------
def test_t5_built_without_checkpoint_exports_what_transformers_writes(tmp_path):
    """A libai T5 built from scratch with non-default relative_attention_max_distance and
    initializer_factor: the exported config.json reads in transformers as the T5Config of
    the same hyper-parameters (same keys, same values, is_encoder_decoder included)."""
    cfg = dict(
        vocab_size=53,
        hidden_size=16,
        hidden_layers=1,
        num_attention_heads=2,
        ffn_hidden_size=24,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        initializer_factor=0.5,
        dropout_prob=0.0,
    )
    save_huggingface(T5ForPreTraining(cfg=cfg), str(tmp_path))
    shapes = {**T5_SHAPES, "relative_attention_max_distance": 20}
    want = transformers.T5Config(
        **shapes, initializer_factor=0.5, architectures=["T5ForConditionalGeneration"]
    ).to_dict()
    got = transformers.T5Config.from_pretrained(tmp_path).to_dict()
    assert {k: got.get(k) for k in want} == want
    assert set(got) == set(want)
    assert json.loads((tmp_path / "config.json").read_text())["is_encoder_decoder"] is True


def test_t5_eos_token_id_reaches_libai_and_the_export(tmp_path):
    """A non-default ``eos_token_id`` in config.json is libai's and comes back in the export
    (the reference: the value transformers reads from the source)."""
    torch.manual_seed(7)
    config = transformers.T5Config(**T5_SHAPES, eos_token_id=5, pad_token_id=0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path / "hf")
    want = transformers.T5Config.from_pretrained(tmp_path / "hf").eos_token_id
    assert want == 5
    model = load_huggingface(str(tmp_path / "hf"))
    assert model_libai_cfg(model)["eos_token_id"] == want
    save_huggingface(model, str(tmp_path / "out"))
    assert transformers.T5Config.from_pretrained(tmp_path / "out").eos_token_id == want


def test_t5_config_without_feed_forward_proj_equals_transformers(tmp_path):
    """A config.json without ``feed_forward_proj``: transformers' default (relu) runs, and
    libai's logits equal transformers' on the same directory."""
    torch.manual_seed(8)
    config = transformers.T5Config(**T5_SHAPES, feed_forward_proj="relu")
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path)
    edit_config(tmp_path, drop=["feed_forward_proj", "dense_act_fn", "is_gated_act"])
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path)
    assert hf.config.feed_forward_proj == transformers.T5Config().feed_forward_proj
    model = load_huggingface(str(tmp_path))
    g = torch.Generator().manual_seed(9)
    ids, dec = torch.randint(2, 53, (2, 6), generator=g), torch.randint(2, 53, (2, 4), generator=g)
    got, want = t5_logits(model, hf, ids, dec)
    assert (got - want).abs().max() < TOL


def test_t5_libai_config_without_model_type_reads_t5(tmp_path):
    """``libai_config`` of a config without ``model_type`` reads it as transformers' T5
    (``T5Config.model_type``), so the export writes a model_type transformers knows."""
    config = transformers.T5Config(**T5_SHAPES)
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    del hf_config["model_type"]
    loader = T5LoaderHuggerFace(pretrained_model_path=str(tmp_path))
    assert loader.libai_config(hf_config)["model_type"] == transformers.T5Config.model_type
