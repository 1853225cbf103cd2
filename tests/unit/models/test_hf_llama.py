"""Llama (GQA, untied), Llama 3 (llama3 RoPE scaling, tied), Qwen2 (q/k/v biases) and Qwen3
(per-head q/k norms, a padding row without gradient) from Hugging Face directories equal
transformers (logits, loss, every gradient) and export back bitwise: all four on 1 process,
Llama 3 on tp2 and pp2, Qwen2 (GQA, untied, biases) on dp2 x tp2. Plus padded batches, KV-cache decoding, the base model, RoPE formulas, bad input."""

from __future__ import annotations

import json
import shutil

import hf_parity
import pytest
import torch
import transformers
from hf_parity import check_layouts, check_single_process, hf_reference, save_case
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from libai import dist
from libai.layers import rope_inv_freq
from libai.layers.rotary import rope_attention_factor
from libai.models import LlamaForCausalLM, LlamaModel
from libai.models.utils import CheckpointError, load_huggingface

VOCAB = 101  # odd: the vocabulary is padded under tp2
SHAPES = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    attention_dropout=0.0,
    rms_norm_eps=1e-2,  # away from every default (1e-6 / 1e-5): a loader ignoring it fails
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # head_dim 8: one frequency on the smooth ramp
}


def build_hf(kind: str):
    torch.manual_seed({"llama": 0, "llama3": 1, "qwen2": 2, "qwen3": 3}[kind])
    if kind == "llama":  # a RoPE base of neither 1e4 (the default) nor llama3's 5e5
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPES, rope_theta=3e4))
    if kind == "llama3":
        config = transformers.LlamaConfig(
            **SHAPES, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True
        )
        return transformers.LlamaForCausalLM(config)
    if kind == "qwen3":  # per-head q/k norms, head_dim not hidden / heads, a pad row
        config = transformers.Qwen3Config(**SHAPES, head_dim=16, pad_token_id=3)
        model = transformers.Qwen3ForCausalLM(config)
        with torch.no_grad():  # norm weights away from ones: a missing norm shows
            for name, p in model.named_parameters():
                if "q_norm" in name or "k_norm" in name:
                    p.normal_(1.0, 0.3)
        return model
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPES))


def make_case(root, hf, padded: bool = False):
    """A causal-LM batch (unshifted labels) and the transformers reference on it."""
    hf.save_pretrained(root / "hf")
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, VOCAB, (4, 8), generator=g)
    batch = {"input_ids": x, "labels": x.clone()}
    if padded:  # right padding as the SFT dataset makes it: no loss on padding or prompt
        mask = torch.ones_like(x)
        mask[1, 5:] = 0
        mask[3, 2:] = 0
        labels = x.masked_fill(mask == 0, -100)
        labels[0, :3] = -100
        batch = {"input_ids": x, "attention_mask": mask, "labels": labels}
    ref = hf_reference(hf, dict(batch), lambda out: out.loss, {"logits": lambda out: out.logits})
    keys = [k for k in batch if k != "labels"]
    return save_case(root / f"case{int(padded)}.pt", batch=batch, input_keys=keys, ref=ref)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """``get(kind) -> (root, case file, HF class, HF state dict)``, each built once."""
    made = {}

    def get(kind: str):
        if kind not in made:
            root = tmp_path_factory.mktemp(kind)
            hf = build_hf(kind)
            made[kind] = root, make_case(root, hf), type(hf), hf.state_dict()
        return made[kind]

    return get


@pytest.mark.parametrize("kind", ["llama", "llama3", "qwen2", "qwen3"])
def test_single_process_parity_and_export(cases, kind):
    root, case_path, hf_cls, state = cases(kind)
    out = root / "out1"
    result = check_single_process(
        case_path, str(root / "hf"), {"export_dir": str(out), "max_shard_size": 20_000}
    )
    assert result["grads_checked"] >= 9 * 2 + 2
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == (kind if kind.startswith("qwen") else "llama")
    assert config["architectures"] == [hf_cls.__name__]
    assert (out / "model.safetensors.index.json").exists()
    hf_parity.assert_exported(out, hf_cls, state, source=root / "hf")
    # the settings the short parity batch barely feels, read from the loaded modules
    dist.setup_dist_util({})
    model = load_huggingface(str(root / "hf"))
    hf = hf_cls.from_pretrained(root / "hf")
    assert torch.equal(model.model.rotary_emb.inv_freq, hf.model.rotary_emb.inv_freq), kind
    eps = {m.eps for m in model.modules() if hasattr(m, "eps")}
    assert eps == {1e-2}, eps


def test_padded_batch_with_ignored_labels(tmp_path):
    """Right padding (attention_mask) and -100 labels: the loss is transformers' mean over
    the scored tokens, and the logits and gradients agree."""
    case_path = make_case(tmp_path, build_hf("qwen2"), padded=True)
    check_single_process(case_path, str(tmp_path / "hf"), {})


def test_tp2_and_pp2(cases):
    """One 2-process launch, on Llama 3: its tied head is a copy on the last pp stage."""
    root, case_path, hf_cls, state = cases("llama3")
    layouts = [hf_parity.tp2_layout(root), hf_parity.pp2_layout(root)]
    results = check_layouts(case_path, str(root / "hf"), 2, layouts)
    # pp: each stage checks only its own parameters' gradients, the two stages together all
    assert sum(r["grads_checked"] for r in results["pp2"]) >= results["tp2"][0]["grads_checked"]
    hf_parity.assert_exported(root / "tp2", hf_cls, state, source=root / "hf")
    hf_parity.assert_exported(root / "pp2", hf_cls, state, source=root / "hf")


def test_dp2_tp2(cases):
    """One 4-process launch, on Qwen2: its q/k/v biases are split over tp too."""
    root, case_path, hf_cls, state = cases("qwen2")
    layouts = [hf_parity.dp2_tp2_layout(root)]
    check_layouts(case_path, str(root / "hf"), 4, layouts)
    hf_parity.assert_exported(root / "dp2tp2", hf_cls, state, source=root / "hf")


# ---- generation with a KV cache ---------------------------------------------------------------
@torch.no_grad()
def greedy_with_cache(model, input_ids, attention_mask, new_tokens: int):
    """Greedy decoding, one token per call after the prompt, with left-padding positions."""
    mask, ids, past, steps = attention_mask, input_ids, None, []
    for _ in range(new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        step_ids = ids if past is None else ids[:, -1:]
        out = model(
            step_ids,
            attention_mask=mask,
            position_ids=positions[:, -step_ids.shape[1] :],
            past_key_values=past,
            use_cache=True,
        )
        past = out["past_key_values"]
        logits = out["logits"][:, -1]
        steps.append(logits)
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids, mask, torch.stack(steps, dim=1)


def test_kv_cache_decode_equals_full_forward_and_transformers(tmp_path):
    hf = build_hf("llama3")
    hf.save_pretrained(tmp_path)
    dist.setup_dist_util({})
    model = load_huggingface(tmp_path).eval()
    prompt = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    prompt_mask = torch.ones_like(prompt)
    prompt[1, :2], prompt_mask[1, :2] = 0, 0  # left padding
    ids, mask, step_logits = greedy_with_cache(model, prompt, prompt_mask, 5)
    # the cached steps' logits equal one forward over the whole sequence
    with torch.no_grad():
        full = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    torch.testing.assert_close(step_logits, full["logits"][:, 5:-1], atol=1e-5, rtol=1e-5)
    want = hf.eval().generate(
        prompt,
        attention_mask=prompt_mask,
        max_new_tokens=5,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert torch.equal(ids, want)


# ---- the base model, RoPE formulas, bad input ---------------------------------------------------
def test_base_model_from_base_and_head_checkpoints(tmp_path):
    torch.manual_seed(4)
    config = transformers.LlamaConfig(**SHAPES)
    base = transformers.LlamaModel(config).eval()
    base.save_pretrained(tmp_path / "base")
    dist.setup_dist_util({})
    model = load_huggingface(tmp_path / "base")
    assert type(model) is LlamaModel
    x = torch.randint(0, VOCAB, (2, 7))
    with torch.no_grad():
        got = model.eval()(x)["last_hidden_state"]
        want = base(input_ids=x).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the backbone of a head checkpoint loads into LlamaModel (lm_head.weight is not needed)
    head = build_hf("qwen2")
    head.save_pretrained(tmp_path / "head")
    assert type(load_huggingface(tmp_path / "head", LlamaModel)) is LlamaModel


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {**LLAMA3_ROPE, "original_max_position_embeddings": 64},
        # YaRN (DeepSeek-V3's): its attention factor is compared too
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 0.7,
            "mscale_all_dim": 1.0,
        },
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16},
    ],
)
def test_rope_inv_freq_matches_transformers(scaling):
    config = transformers.LlamaConfig(
        hidden_size=128, num_attention_heads=2, max_position_embeddings=32, rope_theta=5e5
    )
    config.rope_parameters = {"rope_theta": 5e5, "rope_type": "default", **(scaling or {})}
    kind = config.rope_parameters["rope_type"]
    for seq_len in (None, 100):
        if kind == "default":
            want, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
        else:
            want, factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
            assert rope_attention_factor(scaling) == pytest.approx(factor, rel=1e-12), kind
        got = rope_inv_freq(64, 5e5, scaling, max_position_embeddings=32, seq_len=seq_len)
        if kind == "yarn":  # the same formula, its ops in another order: last bits
            torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        else:
            assert torch.equal(got, want), (kind, seq_len)
    with pytest.raises(ValueError, match="'longrope' is not supported"):
        rope_inv_freq(64, 1e4, {"rope_type": "longrope", "factor": 2.0})


def test_tp_that_does_not_divide_kv_heads_is_named(tmp_path, monkeypatch):
    hf = build_hf("llama")  # 4 heads, 2 key/value heads
    hf.save_pretrained(tmp_path)
    dist.setup_dist_util({})
    monkeypatch.setattr(dist, "get_tensor_parallel_size", lambda: 4)
    with pytest.raises(ValueError, match=r"num_key_value_heads=2 .*tensor_parallel_size=4"):
        load_huggingface(tmp_path)
    cfg = dict(
        hidden_layers=1,
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=64,
        num_attention_heads=6,
        num_key_value_heads=2,
    )
    with pytest.raises(ValueError, match=r"num_attention_heads=6 .*tensor_parallel_size=4"):
        LlamaForCausalLM(cfg=cfg)


def test_checkpoint_contradicting_config_and_sliding_window(tmp_path):
    hf = build_hf("qwen2")
    hf.save_pretrained(tmp_path / "ok")
    dist.setup_dist_util({})
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "ok", bad)
    config = json.loads((bad / "config.json").read_text())
    config["intermediate_size"] = 48  # the weights have 64
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"mlp\.gate_proj\.weight: checkpoint \[64, 32\] vs config \[48, 32\]"
    ):
        load_huggingface(bad)
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=4)
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="use_sliding_window"):
        load_huggingface(bad)
