"""Fast single-process unit tests of the layers (no torchrun): KV cache, masks, GQA, RoPE and
argument validation. The tensor-parallel equivalence tests are in
tests/distributed/test_layers_parallel.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from layer_helpers import randn, single_process  # noqa: F401 (single_process: an autouse fixture)
from torch import nn
from torch.distributed.tensor import DTensor

from libai.layers import (
    MLP,
    Linear,
    LMLogits,
    MultiheadAttention,
    ParallelCrossEntropyLoss,
    RotaryEmbedding,
    TransformerLayer,
    VocabEmbedding,
    apply_rotary_pos_emb,
    build_norm,
    init_method_normal,
)

HIDDEN, HEADS, HEAD_SIZE = 16, 4, 4
INIT = init_method_normal(0.3)  # O(1) activations: a near-uniform softmax would hide bugs


def randomize_biases(module: nn.Module, seed: int = 1) -> None:
    with torch.no_grad():
        for i, (name, p) in enumerate(module.named_parameters()):
            if name.endswith("bias"):
                p.copy_(0.5 * randn(*p.shape, seed=seed + i))


def attention(kv_heads=HEADS, **kwargs) -> MultiheadAttention:
    torch.manual_seed(0)
    attn = MultiheadAttention(HIDDEN, HEADS, kv_heads, init_method=INIT, **kwargs)
    randomize_biases(attn)
    return attn.eval()


def close(got, want, atol=1e-5):
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)


# ---- KV cache ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kv_heads", "rotary"),
    [(HEADS, False), (2, True), (1, True)],
    ids=["mha", "gqa-rope", "mqa-rope"],
)
def test_kv_cache_matches_full_causal_forward(kv_heads, rotary):
    attn = attention(kv_heads, attn_mask_type="causal")
    b, s = 2, 7
    x = randn(b, s, HIDDEN, seed=2)
    positions = torch.arange(s).expand(b, s)
    rope = RotaryEmbedding(HEAD_SIZE)

    def rot(sl):
        return rope(positions[:, sl]) if rotary else None

    with torch.no_grad():
        full = attn(x, rotary_pos_emb=rot(slice(None)))
        outs, past, t = [], None, 0
        for step in (3, 2, 1, 1):  # prefill 3, a chunk of 2 (causal inside the chunk), then 1 by 1
            out, past = attn(
                x[:, t : t + step],
                past_key_value=past,
                use_cache=True,
                rotary_pos_emb=rot(slice(t, t + step)),
            )
            outs.append(out)
            t += step
    assert past[0].shape == past[1].shape == (b, kv_heads, s, HEAD_SIZE)  # kv heads, not repeated
    close(torch.cat(outs, dim=1), full)


def test_decoder_layer_kv_cache_with_cross_attention_and_left_padding():
    torch.manual_seed(0)
    layer = TransformerLayer(
        HIDDEN, 32, HEADS, 2, is_decoder=True, attn_mask_type="causal", init_method=INIT
    ).eval()
    randomize_biases(layer)
    b, s, s_enc = 2, 6, 5
    x, enc = randn(b, s, HIDDEN, seed=3), randn(b, s_enc, HIDDEN, seed=4)
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[1, ..., :2] = False  # sequence 1 is left-padded by two tokens
    enc_mask = torch.ones(b, 1, 1, s_enc, dtype=torch.bool)
    enc_mask[0, ..., -1] = False
    with torch.no_grad():
        full = layer(x, attention_mask=mask, encoder_states=enc, encoder_attention_mask=enc_mask)
        outs, past = [], None
        for t in range(s):
            out, past = layer(
                x[:, t : t + 1],
                attention_mask=mask[..., : t + 1],
                encoder_states=enc,
                encoder_attention_mask=enc_mask,
                past_key_value=past,
                use_cache=True,
            )
            outs.append(out)
    incremental = torch.cat(outs, dim=1)
    self_kv, cross_kv = past
    assert self_kv[0].shape == (b, 2, s, HEAD_SIZE)
    assert cross_kv[0].shape == (b, 2, s_enc, HEAD_SIZE)  # computed once, reused every step
    assert torch.isfinite(full).all() and torch.isfinite(incremental).all()
    close(incremental[0], full[0])
    close(incremental[1, 2:], full[1, 2:])  # padded query positions carry no meaning


# ---- masks ------------------------------------------------------------------------------------


def test_causal_with_left_padding_has_no_nan_and_ignores_padding():
    attn = attention(attn_mask_type="causal")
    attn.train()  # dropout is 0; gradients must be finite too
    pad = 3
    x = randn(2, 6, HIDDEN, seed=5).requires_grad_()
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., :pad] = False  # the first query rows of sequence 1 see no key at all
    out = attn(x, attention_mask=mask)
    out.square().sum().backward()
    assert torch.isfinite(out).all(), "a fully masked query row produced NaN/inf"
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
    with torch.no_grad():
        unpadded = attn(x[1:, pad:])
    close(out[1, pad:], unpadded[0])  # real tokens are unaffected by the padding
    close(out[0], attn(x[:1])[0])


def test_bool_and_additive_masks_agree():
    attn = attention()
    x = randn(2, 5, HIDDEN, seed=6)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)[:, None, None, :]
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    with torch.no_grad():
        close(attn(x, attention_mask=keep), attn(x, attention_mask=additive))
        # 0/1 integer masks (as tokenizers return them) mean keep/drop, not an additive bias
        close(attn(x, attention_mask=keep.long()), attn(x, attention_mask=keep))
        # masked keys are ignored: sequence 1 acts like its first 3 tokens alone
        close(attn(x, attention_mask=keep)[1, :3], attn(x[1:, :3])[0])


# ---- grouped-query attention ------------------------------------------------------------------


def test_gqa_equals_mha_with_repeated_kv_weights():
    kv_heads = 2
    group = HEADS // kv_heads
    gqa = attention(kv_heads, attn_mask_type="causal")
    mha = attention(HEADS, attn_mask_type="causal")
    # fused rows per kv head j: [q_{j*g}, ..., q_{j*g+g-1}, k_j, v_j]; MHA has g = 1
    w = gqa.query_key_value.weight.detach().view(kv_heads, group + 2, HEAD_SIZE, HIDDEN)
    b = gqa.query_key_value.bias.detach().view(kv_heads, group + 2, HEAD_SIZE)
    w_mha = torch.stack(
        [w[h // group, i] for h in range(HEADS) for i in (h % group, group, group + 1)]
    )
    b_mha = torch.stack(
        [b[h // group, i] for h in range(HEADS) for i in (h % group, group, group + 1)]
    )
    with torch.no_grad():
        mha.query_key_value.weight.copy_(w_mha.reshape(-1, HIDDEN))
        mha.query_key_value.bias.copy_(b_mha.reshape(-1))
        mha.dense.weight.copy_(gqa.dense.weight)
        mha.dense.bias.copy_(gqa.dense.bias)
    x = randn(2, 6, HIDDEN, seed=7)
    positions = torch.arange(6).expand(2, 6) + torch.tensor([[0], [4]])
    rope = RotaryEmbedding(HEAD_SIZE)(positions)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., -2:] = False
    with torch.no_grad():
        want = mha(x, attention_mask=mask, rotary_pos_emb=rope)
        got = gqa(x, attention_mask=mask, rotary_pos_emb=rope)
    close(got, want)


def test_gqa_cross_attention_equals_mha_with_repeated_kv_weights():
    kv_heads = 2
    group = HEADS // kv_heads
    gqa = attention(kv_heads, is_cross_attention=True)
    mha = attention(HEADS, is_cross_attention=True)
    w = gqa.key_value.weight.detach().view(kv_heads, 2, HEAD_SIZE, HIDDEN)
    b = gqa.key_value.bias.detach().view(kv_heads, 2, HEAD_SIZE)
    with torch.no_grad():
        mha.key_value.weight.copy_(w.repeat_interleave(group, dim=0).reshape(-1, HIDDEN))
        mha.key_value.bias.copy_(b.repeat_interleave(group, dim=0).reshape(-1))
        for name in ("query.weight", "query.bias", "dense.weight", "dense.bias"):
            mha.get_parameter(name).copy_(gqa.get_parameter(name))
    x, enc = randn(2, 4, HIDDEN, seed=8), randn(2, 6, HIDDEN, seed=9)
    with torch.no_grad():
        close(gqa(x, encoder_states=enc), mha(x, encoder_states=enc))


# ---- rotary -----------------------------------------------------------------------------------


def reference_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0):
    """Rotate each pair (x[i], x[i + d/2]) by angle position * base^(-2i/d), one at a time."""
    b, h, s, d = x.shape
    out = torch.empty_like(x)
    for bi in range(b):
        for si in range(s):
            p = float(positions[bi, si])
            for i in range(d // 2):
                theta = p * base ** (-2.0 * i / d)
                c, sn = math.cos(theta), math.sin(theta)
                x1, x2 = x[bi, :, si, i], x[bi, :, si, i + d // 2]
                out[bi, :, si, i] = x1 * c - x2 * sn
                out[bi, :, si, i + d // 2] = x1 * sn + x2 * c
    return out


def test_rotary_matches_reference():
    d = 8
    x = randn(2, 3, 5, d, seed=10)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 9, 100, 2, 0]])
    cos, sin = RotaryEmbedding(d)(positions)
    assert cos.shape == sin.shape == (2, 5, d)
    close(apply_rotary_pos_emb(x, cos, sin), reference_rope(x, positions), atol=1e-4)


def test_rotary_scores_depend_only_on_relative_position():
    d = 8
    rope = RotaryEmbedding(d)
    q, k = randn(1, 1, 1, d, seed=11), randn(1, 1, 1, d, seed=12)

    def score(pq, pk):
        rq = apply_rotary_pos_emb(q, *rope(torch.tensor([[pq]])))
        rk = apply_rotary_pos_emb(k, *rope(torch.tensor([[pk]])))
        return (rq * rk).sum()

    close(score(5, 2), score(13, 10))
    close(score(0, 0), (q * k).sum())
    assert not torch.allclose(score(5, 2), score(5, 3))


# ---- LM head + loss ---------------------------------------------------------------------------


def test_single_process_layers_hold_plain_tensors():
    torch.manual_seed(0)
    layer = TransformerLayer(HIDDEN, 32, HEADS)
    for name, p in layer.named_parameters():
        assert not isinstance(p, DTensor), f"{name} is a DTensor on a 1-process mesh"


def test_cross_entropy_excludes_ignored_positions():
    torch.manual_seed(0)
    emb = VocabEmbedding(11, HIDDEN, init_method=INIT)
    head, loss_fn = LMLogits(emb), ParallelCrossEntropyLoss()
    h = randn(2, 4, HIDDEN, seed=13)
    target = torch.tensor([[1, -100, 10, 0], [-100, 3, 4, 5]])
    logits = head(h)
    close(logits, h @ emb.weight.detach().T)
    loss = loss_fn(logits, target)
    want = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=-100)
    close(loss, want)
    as_class0 = F.cross_entropy(logits.view(-1, 11), target.view(-1).clamp(min=0))
    assert not torch.allclose(loss, as_class0)
    assert (loss_fn.token_losses(logits, target)[target == -100] == 0).all()


# ---- argument validation ----------------------------------------------------------------------


def test_heads_not_dividing_hidden_raises():
    with pytest.raises(
        ValueError, match=r"hidden_size=30 is not divisible by num_attention_heads=4"
    ):
        MultiheadAttention(30, 4)
    with pytest.raises(
        ValueError, match=r"hidden_size=30 is not divisible by num_attention_heads=4"
    ):
        TransformerLayer(30, 64, 4)


def test_kv_heads_not_dividing_heads_raises():
    with pytest.raises(
        ValueError, match=r"num_attention_heads=4 is not a multiple of num_key_value_heads=3"
    ):
        MultiheadAttention(16, 4, 3)


def test_unknown_mask_type_raises():
    with pytest.raises(
        ValueError, match=r"attn_mask_type must be 'padding' or 'causal', got 'sliding'"
    ):
        MultiheadAttention(16, 4, attn_mask_type="sliding")


def test_cross_attention_without_encoder_states_raises():
    attn = attention(is_cross_attention=True)
    with pytest.raises(ValueError, match="cross-attention needs encoder_states"):
        attn(randn(1, 2, HIDDEN))


def test_unknown_activation_raises():
    with pytest.raises(ValueError, match=r"activation must be one of .*'gelu'.*got 'swish'"):
        MLP(16, 32, activation="swish")
    with pytest.raises(ValueError, match=r"got 'swish'"):
        TransformerLayer(16, 32, 4, activation="swish")


def test_unknown_norm_type_raises():
    with pytest.raises(
        ValueError, match=r"norm_type must be 'layernorm' or 'rmsnorm', got 'batchnorm'"
    ):
        build_norm("batchnorm", 16, 1e-5, layer_idx=0)
    with pytest.raises(ValueError, match=r"got 'batchnorm'"):
        TransformerLayer(16, 32, 4, norm_type="batchnorm")


def test_unknown_linear_parallel_mode_raises():
    with pytest.raises(
        ValueError, match=r"Linear parallel must be one of \('data', 'col', 'row'\), got 'diag'"
    ):
        Linear(4, 4, parallel="diag")


def test_row_linear_with_wrong_input_size_names_the_layer():
    """tp=1 cannot tell a full input from a split one, but a wrong last dim still gives the
    named error instead of a matmul shape error (tp2 with a full input: layers_tp.py)."""
    layer = Linear(16, 24, parallel="row", layer_idx=3)
    assert layer(randn(2, 3, 16)).shape == (2, 3, 24)
    with pytest.raises(ValueError) as info:
        layer(randn(2, 3, 8))
    msg = str(info.value)
    assert "Linear(parallel='row', in_features=16, out_features=24, layer_idx=3)" in msg
    assert "this rank's share of in_features, 16 (= 16 / tp 1), got 8;" in msg
    assert "pair it with a column-parallel Linear (parallel='col')" in msg
    assert "split the input over tp (scatter_to_tp)" in msg


def test_parameters_start_equal_under_any_default_device():
    """Initial values come from a CPU generator on CPU tensors whatever the default device
    (FleetX's door builds its module under ``torch.device(<run device>)``: on a GPU the
    init drew on a CUDA tensor with the CPU generator and raised). Here the default device
    is ``meta``: the parameters still get the values of a plain build."""
    from libai.layers import Linear

    torch.manual_seed(0)
    plain = Linear(8, 4)
    torch.manual_seed(0)
    with torch.device("meta"):
        under_meta = Linear(8, 4)
    assert under_meta.weight.device.type == "cpu"
    assert torch.equal(under_meta.weight, plain.weight)
