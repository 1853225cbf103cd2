"""Every parallel layer against its plain single-device PyTorch equivalent, under tensor parallel.

Run by ``tests/distributed/test_layers_parallel.py`` as
``torchrun --nproc_per_node={2,4} layers_tp.py``.
For tensor_parallel_size 2 (and 4 when the world has 4 ranks; tp=2 on 4 ranks also gives dp=2)
each layer is built after ``torch.manual_seed(SEED)``; its full weights are gathered with
``dist.ttol`` and fed to a reference written with plain ops (``nn.Linear``, ``F.embedding``,
matmul + softmax attention, ...). Outputs, input gradients and every weight gradient must agree
to 1e-5 (fp32), and each rank must hold only its share: local shard shapes, placements and
values are checked against the full tensor. Inputs are identical on every rank (seeded
generators), so replicated outputs and gradients are comparable on every rank.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import parse_out_dir, run_checks
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from libai import dist
from libai.layers import (
    MLP,
    Embedding,
    LayerNorm,
    Linear,
    LMLogits,
    MultiheadAttention,
    ParallelCrossEntropyLoss,
    RMSLayerNorm,
    RotaryEmbedding,
    TransformerLayer,
    VocabEmbedding,
    gather_from_tp,
    scatter_to_tp,
)

TOL = 1e-5
SEED = 2024
B, S, S_ENC, H, FFN = 2, 6, 5, 32, 64
VOCAB = 99  # not divisible by 2 or 4: exercises vocab padding

# ---- helpers -------------------------------------------------------------------------------


def randn(*shape, seed: int) -> torch.Tensor:
    """The same tensor on every rank."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def full(t: torch.Tensor) -> torch.Tensor:
    """Gather a (DTensor) parameter or gradient to a plain full tensor."""
    return dist.ttol(t.detach()).clone()


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach(), want.detach().to(got.dtype)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != reference {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        raise AssertionError(f"{name}: non-finite values {got}")
    # fp32 rounding grows with the values summed: the tolerance is relative to the tensor's
    # scale (and absolute below 1), i.e. max|got - want| <= 1e-5 * max(1, max|want|)
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(
        got, want, atol=TOL * scale, rtol=TOL, msg=lambda m: f"{name} (scale {scale:.3g}): {m}"
    )
    return (got - want).abs().max().item() / scale if got.numel() else 0.0


def check_layout(name: str, param: torch.Tensor, local_shape, split_dim: int | None) -> None:
    """This rank holds exactly its tp shard (or the whole tensor when replicated)."""
    tp = dist.get_tensor_parallel_size()
    if not isinstance(param, DTensor):
        raise AssertionError(f"{name}: expected a DTensor parameter, got {type(param).__name__}")
    local = param.to_local()
    if tuple(local.shape) != tuple(local_shape):
        raise AssertionError(
            f"{name}: local shard shape {tuple(local.shape)} != expected {tuple(local_shape)}"
        )
    want_tp = Replicate() if split_dim is None or tp == 1 else Shard(split_dim)
    if param.placements[-1] != want_tp or any(p != Replicate() for p in param.placements[:-1]):
        raise AssertionError(f"{name}: placements {param.placements}, expected [..., {want_tp}]")
    whole = full(param)
    if split_dim is not None:
        whole = whole.chunk(tp, dim=split_dim)[dist.get_tensor_parallel_rank()]
    if not torch.equal(local.detach(), whole):
        raise AssertionError(f"{name}: the local shard is not this rank's chunk of the full value")


def set_full_value(param: torch.Tensor, value: torch.Tensor) -> None:
    """Overwrite a DTensor parameter with this rank's share of the full ``value``."""
    if not isinstance(param, DTensor):
        raise AssertionError(f"expected a DTensor parameter, got {type(param).__name__}")
    local = value
    for dim, placement in zip(range(param.device_mesh.ndim), param.placements):
        if isinstance(placement, Shard):
            size = param.device_mesh.size(dim)
            local = local.chunk(size, placement.dim)[param.device_mesh.get_local_rank(dim)]
    with torch.no_grad():
        param.to_local().copy_(local)


def compare(
    name: str,
    layer: nn.Module,
    run: Callable[..., torch.Tensor],
    ref: Callable[..., torch.Tensor],
    inputs: dict[str, torch.Tensor],
    results: dict,
) -> None:
    """Compare ``run(layer, **inputs)`` with ``ref(P, **inputs)`` (P = full weights by name):
    the output, d(output . w)/d(every float input) and d(...)/d(every parameter)."""
    inputs_a = {k: _leaf(v) for k, v in inputs.items()}
    # the reference runs in float64: the comparison measures the layer's error, not fp32 noise
    inputs_b = {k: _leaf(v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    params = dict(layer.named_parameters())
    ref_params = {n: full(p).double().requires_grad_() for n, p in params.items()}

    out = run(layer, **inputs_a)
    want = ref(ref_params, **inputs_b)
    diffs = {"out": assert_close(f"{name} output", out, want)}
    weight = randn(*want.shape, seed=7) if want.dim() else torch.tensor(1.0)
    (out * weight).sum().backward()
    (want * weight.double()).sum().backward()

    for k, v in inputs_a.items():
        if v.is_floating_point():
            diffs[f"d_{k}"] = assert_close(f"{name} grad of input {k}", v.grad, inputs_b[k].grad)
    for n, p in params.items():
        if p.grad is None:
            raise AssertionError(f"{name}: parameter {n} got no gradient")
        diffs[f"d_{n}"] = assert_close(f"{name} grad of {n}", full(p.grad), ref_params[n].grad)
    results[name] = max(diffs.values())


def _leaf(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().clone()
    return t.requires_grad_() if t.is_floating_point() else t


#: per check name: fingerprints of the full parameters as constructed (before randomizing)
FINGERPRINTS: dict[str, list[float]] = {}


def build(name: str, factory: Callable[[], nn.Module], randomize: bool = True) -> nn.Module:
    """``factory()`` after ``torch.manual_seed(SEED)``; record its initial full weights, then
    (``randomize``) give every parameter O(1) values, identical on all ranks, so that a wrong
    layout cannot hide behind a near-uniform softmax or zero-initialized biases."""
    torch.manual_seed(SEED)
    layer = factory()
    prints = []
    for p in layer.parameters():
        value = full(p).double().flatten()
        prints.append(float((value * torch.arange(1, value.numel() + 1)).sum()))
    FINGERPRINTS[name] = prints
    if randomize:
        for i, (n, p) in enumerate(layer.named_parameters()):
            noise = randn(*p.shape, seed=1000 + i)
            if p.dim() > 1:  # activations stay O(1): std 1/sqrt(fan_in)
                value = noise / math.sqrt(p.shape[1])
            elif n.endswith("bias"):
                value = 0.5 * noise
            else:  # norm scales
                value = 1.0 + 0.3 * noise
            set_full_value(p, value)
    return layer


# ---- references built from plain PyTorch ------------------------------------------------------


def ref_linear(P, prefix, x, bias=True):
    lin = nn.Linear(*reversed(P[prefix + "weight"].shape), bias=bias)
    state = {"weight": P[prefix + "weight"]}
    if bias:
        state["bias"] = P[prefix + "bias"]
    return torch.func.functional_call(lin, state, (x,))


def ref_layernorm(P, prefix, x, eps=1e-5):
    ln = nn.LayerNorm(x.shape[-1], eps=eps)
    return torch.func.functional_call(
        ln, {"weight": P[prefix + "weight"], "bias": P[prefix + "bias"]}, (x,)
    )


def ref_rmsnorm(P, prefix, x, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * P[prefix + "weight"]


def ref_rotary(x, position_ids, base=10000.0):
    """Rotate pairs (i, i + d/2) of x [b, heads, s, d] by position * base^(-2i/d)."""
    d = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = position_ids.float()[:, None, :, None] * inv_freq  # [b, 1, s, d/2]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    cos, sin = angle.cos(), angle.sin()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def ref_attention(
    P, prefix, x, *, heads, kv_heads, causal=False, mask=None, enc=None, position_ids=None
):
    """Plain matmul + softmax attention from the fused weights (layout: see MultiheadAttention).

    Self-attention ``query_key_value`` rows: per kv head ``j``, ``[q_{j*g}, ..., q_{j*g+g-1},
    k_j, v_j]`` of ``head_size`` rows each. Cross-attention ``key_value``: ``[k_j, v_j]`` per j.
    """
    b, s, hidden = x.shape
    g = heads // kv_heads
    if enc is None:
        w = P[prefix + "query_key_value.weight"]
        hd = w.shape[0] // (heads + 2 * kv_heads)
        w = w.view(kv_heads, g + 2, hd, hidden)
        bias = P[prefix + "query_key_value.bias"].view(kv_heads, g + 2, hd)
        q = x @ w[:, :g].reshape(-1, hidden).T + bias[:, :g].reshape(-1)
        k = x @ w[:, g].reshape(-1, hidden).T + bias[:, g].reshape(-1)
        v = x @ w[:, g + 1].reshape(-1, hidden).T + bias[:, g + 1].reshape(-1)
        src_len = s
    else:
        q = x @ P[prefix + "query.weight"].T + P[prefix + "query.bias"]
        hd = q.shape[-1] // heads
        w = P[prefix + "key_value.weight"].view(kv_heads, 2, hd, hidden)
        bias = P[prefix + "key_value.bias"].view(kv_heads, 2, hd)
        k = enc @ w[:, 0].reshape(-1, hidden).T + bias[:, 0].reshape(-1)
        v = enc @ w[:, 1].reshape(-1, hidden).T + bias[:, 1].reshape(-1)
        src_len = enc.shape[1]
    q = q.view(b, s, heads, hd).transpose(1, 2)
    k = k.view(b, src_len, kv_heads, hd).transpose(1, 2)
    v = v.view(b, src_len, kv_heads, hd).transpose(1, 2)
    if position_ids is not None:
        q, k = ref_rotary(q, position_ids), ref_rotary(k, position_ids)
    owner = torch.tensor([h // g for h in range(heads)])  # kv head serving query head h
    k, v = k[:, owner], v[:, owner]
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if causal:
        scores = scores.masked_fill(~torch.ones(s, src_len, dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, heads * hd)
    return context @ P[prefix + "dense.weight"].T + P[prefix + "dense.bias"]


def ref_mlp(P, prefix, x, gated=False, act=F.gelu):
    up = ref_linear(P, prefix + "dense_h_to_4h.", x)
    h = act(ref_linear(P, prefix + "dense_gate.", x)) * up if gated else act(up)
    return ref_linear(P, prefix + "dense_4h_to_h.", h)


def ref_transformer_layer(P, x, *, heads, kv_heads, pre_norm, mask, enc=None, enc_mask=None):
    def attn(h):
        return ref_attention(
            P, "self_attention.", h, heads=heads, kv_heads=kv_heads, causal=True, mask=mask
        )

    def cross(h):
        return ref_attention(
            P, "cross_attention.", h, heads=heads, kv_heads=kv_heads, mask=enc_mask, enc=enc
        )

    def mlp(h):
        return ref_mlp(P, "mlp.", h)

    blocks = [("input_layernorm.", attn)]
    if enc is not None:
        blocks.append(("post_attention_layernorm.", cross))
    blocks.append(("post_cross_attention_layernorm.", mlp))
    for norm, fn in blocks:
        x = x + fn(ref_layernorm(P, norm, x)) if pre_norm else ref_layernorm(P, norm, x + fn(x))
    return x


# ---- the checks -------------------------------------------------------------------------------


def check_linear(results: dict) -> None:
    tp = dist.get_tensor_parallel_size()
    n_in, n_out = 16, 24
    x = randn(B, S, n_in, seed=1)
    for parallel in ("data", "col", "row"):
        for bias in (True, False):
            for skip_bias_add in (False, True) if bias else (False,):
                name = f"Linear[{parallel},bias={bias},skip_bias_add={skip_bias_add}]"
                layer = build(
                    name,
                    lambda parallel=parallel, bias=bias, skip=skip_bias_add: Linear(
                        n_in, n_out, bias, parallel, skip_bias_add=skip
                    ),
                )
                split = {"data": None, "col": 0, "row": 1}[parallel]
                shape = {
                    "data": (n_out, n_in),
                    "col": (n_out // tp, n_in),
                    "row": (n_out, n_in // tp),
                }
                check_layout(f"{name}.weight", layer.weight, shape[parallel], split)
                if bias:
                    bias_shape = (n_out // tp,) if parallel == "col" else (n_out,)
                    check_layout(
                        f"{name}.bias", layer.bias, bias_shape, 0 if parallel == "col" else None
                    )

                def run(layer, x, parallel=parallel, skip=skip_bias_add):
                    if parallel == "row":  # a row layer reads the split output of a col layer
                        x = scatter_to_tp(x, layer._dist_util.tp_group, dim=-1)
                    out = layer(x)
                    if skip:  # (output without bias, bias): the caller adds it
                        out, b = out
                        if parallel == "col":
                            b = gather_from_tp(b, layer._dist_util.tp_group, dim=-1)
                            out = gather_from_tp(out, layer._dist_util.tp_group, dim=-1)
                        return out + b
                    return (
                        gather_from_tp(out, layer._dist_util.tp_group, dim=-1)
                        if parallel == "col"
                        else out
                    )

                def ref(P, x, bias=bias):
                    return ref_linear(P, "", x, bias=bias)

                compare(name, layer, run, ref, {"x": x}, results)

    # a row layer given the whole input (LiBai's row-parallel heads on a pooled output, which
    # OneFlow's boxing splits): it takes its share; output and every gradient, the input's
    # whole gradient included, equal the one-process Linear
    row = build("Linear[row,whole-input]", lambda: Linear(n_in, n_out, parallel="row"))
    compare(
        "Linear[row,whole-input]",
        row,
        lambda layer, x: layer(x),
        lambda P, x: ref_linear(P, "", x, bias=True),
        {"x": x},
        results,
    )
    # an input of neither size: a named error, not a matmul shape error
    try:
        row(x[..., : n_in - 2])
    except ValueError as exc:
        for part in (
            f"Linear(parallel='row', in_features={n_in}, out_features={n_out}, layer_idx=0)",
            f"this rank's share of in_features, {n_in // tp} (= {n_in} / tp {tp})",
            f"got {n_in - 2};",
            "pair it with a column-parallel Linear (parallel='col')",
        ):
            if part not in str(exc):
                raise AssertionError(f"row Linear's error lacks {part!r}: {exc}") from exc
    else:
        raise AssertionError("a row-parallel Linear took an input of the wrong size")


def check_embeddings(results: dict) -> None:
    tp = dist.get_tensor_parallel_size()
    padded = -(-VOCAB // tp) * tp
    per_rank = padded // tp
    # every shard's first and last row, plus random ids
    edges = sorted({min(r * per_rank + o, VOCAB - 1) for r in range(tp) for o in (0, per_rank - 1)})
    ids = torch.randint(0, VOCAB, (B, S + 4), generator=torch.Generator().manual_seed(3))
    ids.view(-1)[: len(edges)] = torch.tensor(edges)

    name = f"VocabEmbedding[{VOCAB}->{padded}]"
    layer = build(name, lambda: VocabEmbedding(VOCAB, H), randomize=False)
    assert layer.padded_num_embeddings == padded, layer.padded_num_embeddings
    check_layout("VocabEmbedding.weight", layer.weight, (per_rank, H), 0)
    pad_rows = full(layer.weight)[VOCAB:]
    if pad_rows.shape[0] != padded - VOCAB or pad_rows.abs().sum() != 0:
        raise AssertionError(f"VocabEmbedding padding rows are not {padded - VOCAB} zero rows")
    compare(
        name,
        layer,
        lambda layer, ids: layer(ids),
        lambda P, ids: F.embedding(ids, P["weight"]),
        {"ids": ids},
        results,
    )

    pos = torch.arange(S).repeat(B, 1)
    layer = build("Embedding", lambda: Embedding(S + 3, H), randomize=False)
    check_layout("Embedding.weight", layer.weight, (S + 3, H), None)
    compare(
        "Embedding",
        layer,
        lambda layer, ids: layer(ids),
        lambda P, ids: F.embedding(ids, P["weight"]),
        {"ids": pos},
        results,
    )


def check_norms(results: dict) -> None:
    x = randn(B, S, H, seed=4) * 3 + 1
    layer = build("LayerNorm", lambda: LayerNorm(H, eps=1e-5))
    check_layout("LayerNorm.weight", layer.weight, (H,), None)
    check_layout("LayerNorm.bias", layer.bias, (H,), None)
    compare(
        "LayerNorm",
        layer,
        lambda m, x: m(x),
        lambda P, x: ref_layernorm(P, "", x),
        {"x": x},
        results,
    )

    layer = build("RMSLayerNorm", lambda: RMSLayerNorm(H, eps=1e-6))
    check_layout("RMSLayerNorm.weight", layer.weight, (H,), None)
    compare(
        "RMSLayerNorm",
        layer,
        lambda m, x: m(x),
        lambda P, x: ref_rmsnorm(P, "", x),
        {"x": x},
        results,
    )


def padding_mask(lengths, length) -> torch.Tensor:
    """bool [b, 1, 1, length], True for the first ``lengths[i]`` keys (right padding)."""
    return (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def check_attention(results: dict) -> None:
    tp = dist.get_tensor_parallel_size()
    x = randn(B, S, H, seed=8)
    enc = randn(B, S_ENC, H, seed=9)
    mask = padding_mask([S, S - 2], S)
    enc_mask = padding_mask([S_ENC - 1, S_ENC], S_ENC)
    position_ids = torch.stack([torch.arange(S), torch.arange(S) + 3])  # different offsets
    rope = RotaryEmbedding(H // 8)
    cases = [
        # name, heads, kv_heads, kwargs of the layer, kwargs of forward, reference extras
        ("causal", 4, 4, {"attn_mask_type": "causal"}, {}, {"causal": True}),
        ("padding-mask", 4, 4, {}, {"attention_mask": mask}, {"mask": mask}),
        (
            "causal+padding-mask",
            4,
            4,
            {"attn_mask_type": "causal"},
            {"attention_mask": mask},
            {"causal": True, "mask": mask},
        ),
        ("gqa-causal", 8, 4, {"attn_mask_type": "causal"}, {}, {"causal": True}),
        (
            "gqa-causal-rotary",
            8,
            4,
            {"attn_mask_type": "causal"},
            {"rotary_pos_emb": rope(position_ids)},
            {"causal": True, "position_ids": position_ids},
        ),
        (
            "cross",
            4,
            4,
            {"is_cross_attention": True},
            {"attention_mask": enc_mask},
            {"mask": enc_mask, "enc": True},
        ),
        (
            "gqa-cross",
            8,
            4,
            {"is_cross_attention": True},
            {"attention_mask": enc_mask},
            {"mask": enc_mask, "enc": True},
        ),
    ]
    for case, heads, kvh, layer_kw, fwd_kw, ref_kw in cases:
        name = f"MultiheadAttention[{case},heads={heads},kv_heads={kvh}]"
        layer = build(
            name, lambda heads=heads, kvh=kvh, kw=layer_kw: MultiheadAttention(H, heads, kvh, **kw)
        )
        hd = H // heads
        cross = "enc" in ref_kw
        if cross:
            check_layout(f"{name}.query.weight", layer.query.weight, (heads * hd // tp, H), 0)
            check_layout(
                f"{name}.key_value.weight", layer.key_value.weight, (2 * kvh * hd // tp, H), 0
            )
            check_layout(f"{name}.key_value.bias", layer.key_value.bias, (2 * kvh * hd // tp,), 0)
        else:
            rows = (heads + 2 * kvh) * hd // tp
            check_layout(
                f"{name}.query_key_value.weight", layer.query_key_value.weight, (rows, H), 0
            )
            check_layout(f"{name}.query_key_value.bias", layer.query_key_value.bias, (rows,), 0)
        check_layout(f"{name}.dense.weight", layer.dense.weight, (H, heads * hd // tp), 1)
        check_layout(f"{name}.dense.bias", layer.dense.bias, (H,), None)
        inputs = {"x": x, **({"enc": enc} if cross else {})}

        def run(layer, x, enc=None, fwd_kw=fwd_kw):
            return layer(x, encoder_states=enc, **fwd_kw)

        def ref(P, x, enc=None, heads=heads, kvh=kvh, ref_kw=ref_kw):
            kw = {**ref_kw, "enc": enc}
            return ref_attention(P, "", x, heads=heads, kv_heads=kvh, **kw)

        compare(name, layer, run, ref, inputs, results)


def check_mlp(results: dict) -> None:
    tp = dist.get_tensor_parallel_size()
    x = randn(B, S, H, seed=10)
    for activation, gated, act in (("gelu", False, F.gelu), ("silu", True, F.silu)):
        name = f"MLP[{activation},gated={gated}]"
        layer = build(name, lambda a=activation, g=gated: MLP(H, FFN, activation=a, gated=g))
        check_layout(f"{name}.dense_h_to_4h.weight", layer.dense_h_to_4h.weight, (FFN // tp, H), 0)
        check_layout(f"{name}.dense_h_to_4h.bias", layer.dense_h_to_4h.bias, (FFN // tp,), 0)
        if gated:
            check_layout(f"{name}.dense_gate.weight", layer.dense_gate.weight, (FFN // tp, H), 0)
        check_layout(f"{name}.dense_4h_to_h.weight", layer.dense_4h_to_h.weight, (H, FFN // tp), 1)
        check_layout(f"{name}.dense_4h_to_h.bias", layer.dense_4h_to_h.bias, (H,), None)
        compare(
            name,
            layer,
            lambda m, x: m(x),
            lambda P, x, gated=gated, act=act: ref_mlp(P, "", x, gated=gated, act=act),
            {"x": x},
            results,
        )


def check_transformer_layer(results: dict) -> None:
    tp = dist.get_tensor_parallel_size()
    x = randn(B, S, H, seed=11)
    enc = randn(B, S_ENC, H, seed=12)
    mask = padding_mask([S, S - 1], S)
    enc_mask = padding_mask([S_ENC, S_ENC - 2], S_ENC)
    cases = [
        ("pre-norm", True, False, 4, 4),
        ("post-norm", False, False, 4, 4),
        ("pre-norm-decoder-gqa", True, True, 8, 4),
        ("post-norm-decoder", False, True, 4, 4),
    ]
    for case, pre_norm, decoder, heads, kvh in cases:
        name = f"TransformerLayer[{case}]"
        layer = build(
            name,
            lambda pre_norm=pre_norm, decoder=decoder, heads=heads, kvh=kvh: TransformerLayer(
                H,
                FFN,
                heads,
                kvh,
                is_decoder=decoder,
                pre_norm=pre_norm,
                attn_mask_type="causal",
            ),
        )
        hd = H // heads
        rows = (heads + 2 * kvh) * hd // tp
        check_layout(f"{name}.qkv", layer.self_attention.query_key_value.weight, (rows, H), 0)
        check_layout(f"{name}.mlp.dense_4h_to_h", layer.mlp.dense_4h_to_h.weight, (H, FFN // tp), 1)
        for norm in ("input_layernorm", "post_cross_attention_layernorm"):
            check_layout(f"{name}.{norm}", getattr(layer, norm).weight, (H,), None)
        if decoder:
            check_layout(
                f"{name}.cross.key_value",
                layer.cross_attention.key_value.weight,
                (2 * kvh * hd // tp, H),
                0,
            )
        inputs = {"x": x, **({"enc": enc} if decoder else {})}

        def run(layer, x, enc=None, decoder=decoder):
            return layer(
                x,
                attention_mask=mask,
                encoder_states=enc,
                encoder_attention_mask=enc_mask if decoder else None,
            )

        def ref(P, x, enc=None, pre_norm=pre_norm, heads=heads, kvh=kvh):
            return ref_transformer_layer(
                P,
                x,
                heads=heads,
                kv_heads=kvh,
                pre_norm=pre_norm,
                mask=mask,
                enc=enc,
                enc_mask=enc_mask,
            )

        compare(name, layer, run, ref, inputs, results)


def check_logits_and_loss(results: dict) -> None:
    tp = dist.get_tensor_parallel_size()
    padded = -(-VOCAB // tp) * tp
    g = torch.Generator().manual_seed(13)
    ids = torch.randint(0, VOCAB, (B, S), generator=g)
    target = torch.randint(0, VOCAB, (B, S), generator=g)
    target[0, :2] = -100
    target[1, -1] = -100
    target[1, 0] = VOCAB - 1  # the last real class, on the last shard next to the padding
    ignored = target == -100
    x = randn(B, S, H, seed=14)

    for bias in (False, True):
        name = f"VocabEmbedding+LMLogits+ParallelCrossEntropyLoss[bias={bias}]"

        class Head(nn.Module):  # the embedding and the tied head, as in GPT
            def __init__(self, bias=bias):
                super().__init__()
                self.emb = VocabEmbedding(VOCAB, H)
                self.lm = LMLogits(self.emb, bias=bias)
                self.loss = ParallelCrossEntropyLoss()

        layer = build(name, Head, randomize=False)
        # O(1) logits (N(0, 0.5) table) so the softmax is far from uniform; padding stays 0
        set_full_value(layer.emb.weight, full(layer.emb.weight) * 25)
        if layer.lm.weight is not None:
            raise AssertionError(f"{name}: head on the embedding's stage must reuse its weight")
        if bias:
            check_layout(f"{name}.lm.bias", layer.lm.bias, (padded // tp,), 0)
            full_bias = torch.cat([randn(VOCAB, seed=15), torch.zeros(padded - VOCAB)])
            set_full_value(layer.lm.bias, full_bias)  # a non-zero bias

        def hidden_of(layer, ids, x):
            return layer.emb(ids) + x

        # logits: local shard is padded/tp wide, padding columns masked, gather drops them
        with torch.no_grad():
            shard = layer.lm(hidden_of(layer, ids, x))
            if shard.shape[-1] != padded // tp:
                raise AssertionError(
                    f"{name}: logits shard width {shard.shape[-1]} != {padded // tp}"
                )
            start = dist.get_tensor_parallel_rank() * (padded // tp)
            pad_cols = torch.arange(start, start + padded // tp) >= VOCAB
            if pad_cols.any() and not (shard[..., pad_cols] == torch.finfo(shard.dtype).min).all():
                raise AssertionError(
                    f"{name}: padded vocab columns are not masked to the dtype min"
                )
            P = {n: full(p) for n, p in layer.named_parameters()}
            E = P["emb.weight"][:VOCAB]
            want_logits = (F.embedding(ids, P["emb.weight"]) + x) @ E.T
            if bias:
                want_logits = want_logits + P["lm.bias"][:VOCAB]
            results[f"{name} logits"] = assert_close(
                f"{name} logits", layer.lm.gather(shard), want_logits
            )
            token_losses = layer.loss.token_losses(shard, target)
            if (token_losses[ignored] != 0).any():
                raise AssertionError(f"{name}: ignored positions have non-zero token loss")
            per_token = F.cross_entropy(
                want_logits.view(-1, VOCAB), target.view(-1).clamp(min=0), reduction="none"
            ).view(B, S)
            assert_close(f"{name} token losses", token_losses[~ignored], per_token[~ignored])
            mean = per_token[~ignored].mean()
            as_class0 = F.cross_entropy(want_logits.view(-1, VOCAB), target.view(-1).clamp(min=0))
            loss = layer.loss(shard, target)
            assert_close(f"{name} mean over non-ignored", loss, mean)
            if abs(loss.item() - as_class0.item()) < 1e-4:
                raise AssertionError(f"{name}: ignored targets seem to be counted as class 0")

        def run(layer, ids, x):
            return layer.loss(layer.lm(hidden_of(layer, ids, x)), target)

        def ref(P, ids, x, bias=bias):
            E = P["emb.weight"]
            logits = (F.embedding(ids, E) + x) @ E[:VOCAB].T
            if bias:
                logits = logits + P["lm.bias"][:VOCAB]
            return F.cross_entropy(logits.view(-1, VOCAB), target.view(-1), ignore_index=-100)

        compare(name, layer, run, ref, {"ids": ids, "x": x}, results)
        # padding rows of the table (and bias) never receive gradient
        grad = full(layer.emb.weight.grad)
        if grad[VOCAB:].abs().sum() != 0:
            raise AssertionError(f"{name}: padding rows of the embedding got gradient")


CHECKS = [
    check_linear,
    check_embeddings,
    check_norms,
    check_attention,
    check_mlp,
    check_transformer_layer,
    check_logits_and_loss,
]


def main() -> None:
    out_dir, _, _ = parse_out_dir()

    def checks() -> dict:
        world = int(os.environ["WORLD_SIZE"])
        tp_sizes = [2] + ([4] if world == 4 else [])
        max_diff, fingerprints, timings = {}, {}, {}
        for tp in tp_sizes:
            start = time.perf_counter()
            dist.setup_dist_util({"tensor_parallel_size": tp})
            layout = dist.get_dist_util().layout
            results: dict[str, float] = {}
            for check in CHECKS:
                check(results)
            key = f"tp{tp}_dp{layout.data_parallel_size}"
            max_diff[key] = results
            fingerprints[key] = dict(FINGERPRINTS)
            timings[key] = time.perf_counter() - start
        return {
            "tp_sizes": tp_sizes,
            "max_diff": max_diff,
            "init_fingerprints": fingerprints,
            "seconds": timings,
        }

    run_checks(out_dir, checks)


if __name__ == "__main__":
    main()
