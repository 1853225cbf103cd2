"""LiBai's Megatron-style T5 (libai.models.t5_megatron) against an independent plain-PyTorch
implementation written here from the equations (pre-LN self-attention, cross-attention and
GeLU MLP blocks with biases, learned absolute positions, tied LM head with its own bias),
run on the same weights: logits and the masked LM loss in fp32. transformers has no
Megatron T5 class to compare with."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from libai import dist
from libai.config import LazyConfig, instantiate
from libai.models import MegatronT5ForPreTraining, T5ForPreTraining, T5Model

CFG = dict(
    vocab_size=50,
    hidden_size=32,
    hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    embedding_dropout_prob=0.0,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=24,
    layernorm_eps=1e-5,
)
LIBAI_T5_CONFIG = Path(__file__).resolve().parents[2] / "fixtures/libai/configs/common/models/t5.py"


@pytest.fixture
def single_process():
    dist.setup_dist_util({})
    yield
    dist.reset_dist_util()


def make_model(seed=0) -> MegatronT5ForPreTraining:
    torch.manual_seed(seed)
    model = T5ForPreTraining(cfg=CFG)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # weights large enough for every nonlinearity to show
        for name, p in model.named_parameters():
            scale = 0.1 if name.endswith("bias") or "layernorm" in name else 0.3
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model.eval()


# ---- the reference, from the equations ---------------------------------------------------
def layer_norm(x, w, prefix):
    return F.layer_norm(x, x.shape[-1:], w[prefix + ".weight"], w[prefix + ".bias"], 1e-5)


def linear(x, w, prefix):
    return x @ w[prefix + ".weight"].T + w[prefix + ".bias"]


def attention(q, k, v, mask, heads):
    """softmax(q k^T / sqrt(d) masked as LiBai: s * m - 10000 * (1 - m)) v, per head."""
    b, sq, h = q.shape
    d = h // heads
    q, k, v = (t.reshape(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    m = mask[:, None].float()
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d) * m - 10000.0 * (1 - m)
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, sq, h)


def self_attention(x, mask, w, p, heads):
    # the fused projection's rows: per head [q_h, k_h, v_h] (each head_size rows)
    h = x.shape[-1]
    qkv = linear(x, w, p + ".query_key_value").view(*x.shape[:2], heads, 3, h // heads)
    q, k, v = (qkv[..., i, :].reshape(*x.shape[:2], h) for i in range(3))
    return linear(attention(q, k, v, mask, heads), w, p + ".dense")


def cross_attention(x, enc, mask, w, p, heads):
    h = x.shape[-1]
    q = linear(x, w, p + ".query")
    kv = linear(enc, w, p + ".key_value").view(*enc.shape[:2], heads, 2, h // heads)
    k, v = (kv[..., i, :].reshape(*enc.shape[:2], h) for i in range(2))
    return linear(attention(q, k, v, mask, heads), w, p + ".dense")


def mlp(x, w, p):
    return linear(F.gelu(linear(x, w, p + ".dense_h_to_4h")), w, p + ".dense_4h_to_h")


def reference_logits(w, batch, heads, layers):
    pos = w["t5_model.embedding.position_embeddings.weight"]
    tok = w["t5_model.embedding.token_embeddings.weight"]

    def embed(ids):
        return tok[ids] + pos[: ids.shape[1]][None]

    x = embed(batch["encoder_input_ids"])
    for i in range(layers):
        p = f"t5_model.encoder.layers.{i}"
        x = x + self_attention(
            layer_norm(x, w, p + ".input_layernorm"),
            batch["encoder_attn_mask"],
            w,
            p + ".self_attention",
            heads,
        )
        x = x + mlp(layer_norm(x, w, p + ".post_cross_attention_layernorm"), w, p + ".mlp")
    enc = layer_norm(x, w, "t5_model.encoder.final_layernorm")
    y = embed(batch["decoder_input_ids"])
    for i in range(layers):
        p = f"t5_model.decoder.layers.{i}"
        y = y + self_attention(
            layer_norm(y, w, p + ".input_layernorm"),
            batch["decoder_attn_mask"],
            w,
            p + ".self_attention",
            heads,
        )
        y = y + cross_attention(
            layer_norm(y, w, p + ".post_attention_layernorm"),
            enc,
            batch["encoder_decoder_attn_mask"],
            w,
            p + ".cross_attention",
            heads,
        )
        y = y + mlp(layer_norm(y, w, p + ".post_cross_attention_layernorm"), w, p + ".mlp")
    y = layer_norm(y, w, "t5_model.decoder.final_layernorm")
    return y @ tok.T + w["t5_model.lm_head.bias"]


def libai_batch(seed=3, batch=3, src=10, tgt=7):
    """Random ids with padding at the end and LiBai's extended masks (as its dataset)."""
    g = torch.Generator().manual_seed(seed)
    enc_len = torch.tensor([src, src - 3, src - 5])[:batch]
    dec_len = torch.tensor([tgt, tgt - 2, tgt - 4])[:batch]
    real_enc = torch.arange(src)[None] < enc_len[:, None]
    real_dec = torch.arange(tgt)[None] < dec_len[:, None]
    causal = torch.ones(tgt, tgt, dtype=torch.bool).tril()
    labels = torch.randint(0, CFG["vocab_size"], (batch, tgt), generator=g)
    return {
        "encoder_input_ids": torch.randint(1, CFG["vocab_size"], (batch, src), generator=g),
        "decoder_input_ids": torch.randint(1, CFG["vocab_size"], (batch, tgt), generator=g),
        "encoder_attn_mask": real_enc[:, :, None] & real_enc[:, None, :],
        "decoder_attn_mask": real_dec[:, :, None] & real_dec[:, None, :] & causal,
        "encoder_decoder_attn_mask": real_dec[:, :, None] & real_enc[:, None, :],
        "lm_labels": labels.masked_fill(~real_dec, -1),  # LiBai pads labels with -1
        "loss_mask": real_dec.long(),
    }


def test_logits_and_loss_equal_the_reference_from_the_equations(single_process):
    model = make_model()
    assert isinstance(model, MegatronT5ForPreTraining)
    batch = libai_batch()
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    want = reference_logits(weights, batch, CFG["num_attention_heads"], CFG["hidden_layers"])
    inputs = {k: v for k, v in batch.items() if k not in ("lm_labels", "loss_mask")}
    with torch.no_grad():
        got = model(**inputs)["prediction_scores"]
        loss = model(**batch)["masked_lm_loss"]
    real = batch["loss_mask"].bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    # LiBai's T5Loss: sum(token loss * loss_mask) / sum(loss_mask)
    token_loss = F.cross_entropy(
        want.reshape(-1, CFG["vocab_size"]),
        batch["lm_labels"].clamp(min=0).reshape(-1),
        reduction="none",
    )
    mask = batch["loss_mask"].reshape(-1).float()
    torch.testing.assert_close(loss, (token_loss * mask).sum() / mask.sum(), rtol=1e-5, atol=1e-6)
    model.train()  # one process: the training loss is the same global-token mean
    torch.testing.assert_close(model(**batch)["masked_lm_loss"], loss.detach(), rtol=1e-6, atol=0)


def test_libai_keys_select_the_megatron_t5_and_hf_keys_keep_hugging_faces(single_process):
    """LiBai's own model config file (configs/common/models/t5.py) builds LiBai's T5 (its
    fusion flags accepted as having no effect); our Hugging Face T5 keys still build HF's
    architecture; a key neither knows is still an error."""
    cfg = LazyConfig.load(str(LIBAI_T5_CONFIG))
    for key, value in {**CFG, "hidden_dropout_prob": 0.1}.items():
        cfg.pretrain_model.cfg[key] = value
    model = instantiate(cfg.pretrain_model)
    assert type(model).__name__ == "MegatronT5ForPreTraining"
    assert type(instantiate(cfg.t5_model)).__name__ == "MegatronT5Model"
    hf = T5ForPreTraining(
        vocab_size=50, hidden_size=32, hidden_layers=2, num_attention_heads=4, ffn_hidden_size=48
    )
    assert type(hf) is T5ForPreTraining and hasattr(hf.t5_model.encoder, "relative_attention_bias")
    assert type(T5Model(cfg=CFG)).__name__ == "MegatronT5Model"
    with pytest.raises(ValueError, match="unknown config key model.cfg.intermidiate_size"):
        T5ForPreTraining(cfg={**CFG, "intermidiate_size": 48})


def test_init_is_libais(single_process):
    """N(0, initializer_range) everywhere, the output projections N(0, range / sqrt(2 *
    hidden_layers)) (LiBai's scaled init), zero biases (the LM head's too), unit norms."""
    torch.manual_seed(0)
    model = T5ForPreTraining(cfg={**CFG, "hidden_size": 64, "intermediate_size": 256})
    params = dict(model.named_parameters())
    for name, std in [
        ("t5_model.encoder.layers.0.mlp.dense_h_to_4h.weight", 0.02),
        ("t5_model.decoder.layers.1.cross_attention.query.weight", 0.02),
        ("t5_model.embedding.position_embeddings.weight", 0.02),
        ("t5_model.encoder.layers.1.mlp.dense_4h_to_h.weight", 0.02 / 2),
        ("t5_model.decoder.layers.0.self_attention.dense.weight", 0.02 / 2),
    ]:
        assert params[name].std().item() == pytest.approx(std, rel=0.1), name
    assert not params["t5_model.lm_head.bias"].any()
    assert not params["t5_model.decoder.layers.0.mlp.dense_h_to_4h.bias"].any()
    assert bool((params["t5_model.encoder.final_layernorm.weight"] == 1).all())
