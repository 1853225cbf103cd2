"""Attention, KV cache, TransformerLayer and the chunked LM loss against independent
references: a plain-torch ``softmax(q k^T * scale + bias) v`` attention and a pre-norm block
(``F.layer_norm`` with eps 1e-5, GELU MLP) written here on the layers' own weights, the
unchunked ``F.cross_entropy``, hand-computed cache lengths and masks, and the same layer
without activation checkpointing (values, gradients, and how often each part runs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from layer_helpers import randn, single_process  # noqa: F401 (single_process: an autouse fixture)
from torch import nn
from torch.profiler import ProfilerActivity, profile

import libai.layers.lm_logits as lm_logits_module
from libai import dist
from libai.layers import (
    LMLogits,
    MultiheadAttention,
    TransformerLayer,
    VocabEmbedding,
    chunked_lm_loss,
    init_method_normal,
    lm_head_input,
)
from libai.layers.kv_cache import StaticKVCache, past_length
from libai.runtime.memory_estimator import CountingDistUtil

HIDDEN, HEADS, HEAD_SIZE, FFN = 16, 4, 4, 32
INIT = init_method_normal(0.3)  # O(1) scores: a near-uniform softmax would hide bugs


def randomize(module: nn.Module, seed: int = 1) -> None:
    """Random biases and norm scales (the defaults 0 / 1 would hide a missing term)."""
    with torch.no_grad():
        for i, (name, p) in enumerate(module.named_parameters()):
            if name.endswith("bias"):
                p.copy_(0.5 * randn(*p.shape, seed=seed + i))
            elif "layernorm" in name:
                p.copy_(1 + 0.5 * randn(*p.shape, seed=seed + i))


def attention(kv_heads=HEADS, **kwargs) -> MultiheadAttention:
    torch.manual_seed(0)
    attn = MultiheadAttention(HIDDEN, HEADS, kv_heads, init_method=INIT, **kwargs)
    randomize(attn)
    return attn.eval()


def block(**kwargs) -> TransformerLayer:
    torch.manual_seed(0)
    layer = TransformerLayer(HIDDEN, FFN, HEADS, init_method=INIT, **kwargs)
    randomize(layer)
    return layer


def close(got, want, atol=1e-5, rtol=1e-5):
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


def reference_attention(attn: MultiheadAttention, x, bias=None):
    """``softmax(q k^T / sqrt(d) + bias) v`` then the output projection, in plain torch on the
    layer's weights; the fused q/k/v rows are ``[q x group, k, v]`` per kv head (the class
    docstring's layout)."""
    b, s, _ = x.shape
    kvh, g, hd = attn.num_kv_heads, attn.group_size, attn.head_size
    qkv = F.linear(x, attn.query_key_value.weight, attn.query_key_value.bias)
    qkv = qkv.view(b, s, kvh, g + 2, hd)
    q = qkv[:, :, :, :g].reshape(b, s, kvh * g, hd).transpose(1, 2)
    k = qkv[:, :, :, g].transpose(1, 2).repeat_interleave(g, dim=1)
    v = qkv[:, :, :, g + 1].transpose(1, 2).repeat_interleave(g, dim=1)
    scores = q @ k.transpose(-1, -2) / hd**0.5
    if bias is not None:
        scores = scores + bias
    context = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, s, -1)
    return F.linear(context, attn.dense.weight, attn.dense.bias)


def keep_to_bias(keep: torch.Tensor, dtype) -> torch.Tensor:
    """Masked scores get the dtype's min (the documented convention), kept ones 0."""
    return torch.zeros((), dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


# ---- attention: masks and biases -------------------------------------------------------------


def test_additive_mask_and_position_bias_add_up():
    """A float ``attention_mask`` is an additive bias; ``position_bias`` adds on top of it."""
    attn = attention()
    b, s = 2, 5
    x = randn(b, s, HIDDEN, seed=2)
    mask = randn(b, 1, 1, s, seed=3)
    position_bias = randn(1, HEADS, s, s, seed=4)
    with torch.no_grad():
        got = attn(x, attention_mask=mask, position_bias=position_bias)
        close(got, reference_attention(attn, x, mask + position_bias))
        close(attn(x, attention_mask=mask), reference_attention(attn, x, mask))


def test_fully_masked_query_in_float64_matches_reference():
    """float64: a causal query whose only key is padding has every score masked with the
    float64 min, hence a uniform softmax (no NaN), as the plain reference computes it."""
    attn = attention(attn_mask_type="causal").double()
    b, s = 2, 5
    x = randn(b, s, HIDDEN, seed=5, dtype=torch.float64)
    pad = torch.ones(b, 1, 1, s, dtype=torch.bool)
    pad[0, ..., :2] = False  # queries 0 and 1 of sequence 0 see padding only
    with torch.no_grad():
        got = attn(x, attention_mask=pad)
        keep = torch.ones(s, s, dtype=torch.bool).tril() & pad
        want = reference_attention(attn, x, keep_to_bias(keep, torch.float64))
    assert got.dtype == torch.float64 and not got.isnan().any()
    close(got, want, atol=1e-12, rtol=1e-12)


def test_layer_of_a_pipeline_layout_builds_and_matches_reference():
    """Under a layout with ``pipeline_num_layers`` (one stage here), every projection of layer
    1 is built for layer 1 (``layer_idx`` resolves its stage) and computes attention."""
    dist.setup_dist_util({"pipeline_num_layers": 2})
    torch.manual_seed(0)
    attn = MultiheadAttention(HIDDEN, HEADS, init_method=INIT, layer_idx=1).eval()
    randomize(attn)
    assert {m.layer_idx for m in (attn.query_key_value, attn.dense)} == {1}
    x = randn(2, 4, HIDDEN, seed=6)
    with torch.no_grad():
        close(attn(x), reference_attention(attn, x))


def test_hidden_size_not_divisible_by_tp_names_hidden_size():
    """On a tp=3 rank (the memory estimator's stand-in mesh: no process group) a hidden size
    of 16 is refused with an error naming ``hidden_size``."""
    layout = dist.resolve_layout({"tensor_parallel_size": 3}, 3)
    with dist.use_dist_util(CountingDistUtil(layout, 0)):
        with pytest.raises(
            ValueError, match=r"^hidden_size=16 is not divisible by tensor_parallel_size=3"
        ):
            MultiheadAttention(HIDDEN, 6, head_size=4)


# ---- activation checkpointing -----------------------------------------------------------------


def grads_of(layer: TransformerLayer, x, *args):
    out = layer(x, *args)
    loss = (out * randn(*out.shape, seed=9)).sum()
    # torch.autograd.grad, not .backward(): what reentrant checkpointing cannot serve
    return out.detach(), torch.autograd.grad(loss, [x, *layer.parameters()])


def count_entries(module: nn.Module, counter: dict, key: str):
    """Count calls of ``module`` as they start (a recomputation stops early once it has
    rebuilt what backward needs, so a module's end may never be reached again)."""

    def hook(*_):
        counter[key] = counter.get(key, 0) + 1

    return module.register_forward_pre_hook(hook)


@pytest.mark.parametrize(
    ("mode", "attention_runs", "mlp_runs"),
    [("core_attn", 1, 1), ("full_attn", 2, 1), ("full", 2, 2), ("selective", 2, 2)],
)
def test_checkpointing_recomputes_its_part_with_the_same_gradients(
    mode, attention_runs, mlp_runs, monkeypatch
):
    """Against the same layer without checkpointing: equal output and gradients (through
    ``torch.autograd.grad``); the checkpointed part runs again in backward, the rest once;
    the attention kernel runs twice in every mode but none."""
    layer = block(attn_mask_type="causal").train()
    x = randn(2, 5, HIDDEN, seed=7).requires_grad_()
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 0] = False
    want_out, want_grads = grads_of(layer, x, mask)

    counts: dict[str, int] = {}
    sdpa = F.scaled_dot_product_attention

    def counting_sdpa(*args, **kwargs):
        counts["kernel"] = counts.get("kernel", 0) + 1
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting_sdpa)
    count_entries(layer.self_attention, counts, "attention")
    count_entries(layer.mlp, counts, "mlp")
    layer.activation_checkpointing = mode
    got_out, got_grads = grads_of(layer, x, mask)
    close(got_out, want_out)
    for got, want in zip(got_grads, want_grads, strict=True):
        close(got, want)
    assert counts == {"kernel": 2, "attention": attention_runs, "mlp": mlp_runs}


# ---- the block --------------------------------------------------------------------------------


def test_default_block_is_pre_norm_layernorm_eps_1e5_gelu():
    """The defaults (pre-norm, LayerNorm with eps 1e-5 as torch's and GPT-2's, GELU MLP)
    against the block written out in plain torch; small activations make eps matter."""
    layer = block().eval()
    x = 0.05 * randn(2, 4, HIDDEN, seed=8)

    def norm(module, h):
        return F.layer_norm(h, (HIDDEN,), module.weight, module.bias, eps=1e-5)

    mlp = layer.mlp
    with torch.no_grad():
        h = x + reference_attention(layer.self_attention, norm(layer.input_layernorm, x))
        n = norm(layer.post_cross_attention_layernorm, h)
        up = F.gelu(F.linear(n, mlp.dense_h_to_4h.weight, mlp.dense_h_to_4h.bias))
        want = h + F.linear(up, mlp.dense_4h_to_h.weight, mlp.dense_4h_to_h.bias)
        close(layer(x), want)


# ---- KV cache ---------------------------------------------------------------------------------


def test_past_length_of_legacy_per_layer_pairs():
    """Legacy caches: ``[(k, v), ...]`` (decoder-only) or ``[((k, v), cross), ...]`` (T5);
    the length is the keys' dim 2, ``[batch, kv_heads, length, head_size]``."""
    k, v = randn(2, 3, 7, 5), randn(2, 3, 7, 5, seed=1)
    cross = (randn(2, 3, 4, 5), randn(2, 3, 4, 5))
    assert past_length([(k, v), (k, v)]) == 7
    assert past_length([((k, v), cross)]) == 7
    assert past_length(None) == 0


@pytest.mark.parametrize("bad", [0, -2, 3.0, "4"])
def test_static_cache_needs_a_positive_int_length(bad):
    with pytest.raises(ValueError, match="max_length >= 1"):
        StaticKVCache(bad)


def test_static_step_keeps_padding_device_whatever_the_default_device():
    """``step`` builds its mask on the padding's device, not on the default device (here
    ``meta``, standing in for a ``torch.set_default_device("cuda")`` around a CPU model)."""
    cache = StaticKVCache(5)
    padding = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    with torch.device("meta"):
        position = cache.step(1, 2, padding=padding)
    want = torch.tensor(
        [
            [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]],
            [[0, 1, 0, 0, 0], [0, 1, 1, 0, 0]],
        ],
        dtype=torch.bool,
    )[:, None]
    assert torch.equal(position, torch.tensor([1, 2]))
    assert cache.keep.device.type == "cpu" and torch.equal(cache.keep, want)


# ---- chunked LM loss --------------------------------------------------------------------------


def head_case(vocab=40, hidden=8, tokens=(3, 6), seed=0):
    torch.manual_seed(seed)
    head = LMLogits(
        None, bias=True, vocab_size=vocab, hidden_size=hidden, init_method=init_method_normal(0.5)
    )
    with torch.no_grad():
        head.bias.normal_()
    hidden_states = randn(*tokens, hidden, seed=seed + 1).requires_grad_()
    labels = torch.randint(0, vocab, tokens, generator=torch.Generator().manual_seed(seed + 2))
    labels.view(-1)[::5] = -100
    return head, hidden_states, labels


def test_chunked_loss_follows_the_tensors_device_not_the_default_device():
    """Loss and gradients under ``torch.device("meta")`` as default device (a stand-in for
    ``set_default_device("cuda")`` around a CPU model) equal the unchunked cross entropy."""
    head, hidden, labels = head_case()
    params = [head.weight, head.bias]
    logits = F.linear(hidden, head.weight, head.bias)
    want = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
    want_grads = torch.autograd.grad(want, [hidden, *params])
    with torch.device("meta"):
        got = chunked_lm_loss(hidden, head, labels, 4)
        got_grads = torch.autograd.grad(got, [hidden, *params])
    close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert g.device.type == "cpu"
        close(g, w)


def _peak_cpu_bytes(fn) -> int:
    """Peak bytes allocated on the CPU above the start while ``fn`` runs (profiler events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    memory = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(memory, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def test_chunked_loss_forward_holds_one_chunk_of_logits():
    """Per chunk one fp32 ``[chunk, V]`` buffer serves the logits, the shifted logits and
    their exp (the cross entropy works in place): the forward's peak stays under two."""
    vocab, chunk = 4096, 8
    head, hidden, labels = head_case(vocab=vocab, tokens=(4, 8))
    buffer = chunk * vocab * 4
    with torch.no_grad():
        peak = _peak_cpu_bytes(lambda: chunked_lm_loss(hidden, head, labels, chunk))
    assert buffer <= peak < 1.5 * buffer, (peak, buffer)


def test_lm_head_input_enters_the_heads_region_as_the_head_does(monkeypatch):
    """The head input is entered with the head's own ``sequence_parallel`` (LMLogits's
    documented default False: entered into the tp region, never all-gathered along the
    sequence) and the head's tp group."""
    seen = []
    enter_head = lm_logits_module.enter_head

    def spy(hidden, group, sequence_parallel=False):
        seen.append((group, sequence_parallel))
        return enter_head(hidden, group, sequence_parallel)

    monkeypatch.setattr(lm_logits_module, "enter_head", spy)
    hidden = randn(2, 3, 8)
    embedding = VocabEmbedding(11, 8)
    assert torch.equal(lm_head_input(hidden, LMLogits(embedding)), hidden)
    lm_head_input(hidden, LMLogits(embedding, sequence_parallel=True))
    assert seen == [(None, False), (None, True)]
