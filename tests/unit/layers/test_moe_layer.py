"""The Mixture-of-Experts layer against independent references, on one process:

- the sparse blocks of transformers' Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and DeepSeek-V3 on
  the same weights (output and every gradient);
- the routers' choices against a per-token loop over the scoring rules;
- the balancing losses (Switch/GShard, sequence-wise, z-loss) against their formulas
  written out with loops, and their gradients against autograd of ``out + c * formula``;
- the expert-bias update against its formula; capacity dropping against GShard's priority
  walked token by token, and the drop count against ``sum max(0, N - C)``;
- capacity mode padded to static shapes against the unpadded one (the same numbers, every
  expert exactly its capacity's rows, no graph break, exportable);
- grouped and looped experts (the same numbers); bad configs.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from layer_helpers import randn, single_process  # noqa: F401 (single_process: autouse)

from libai.layers import MoE, MoEConfig
from libai.layers.moe import collect_moe_losses, update_expert_biases
from libai.layers.moe_dispatch import capacity_keep, expert_capacity

H, F, E = 32, 16, 8
HF_MODELS = transformers.models


def _perturb(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _copy_experts(moe: MoE, gate_up, down):
    with torch.no_grad():
        moe.experts.w_gate.copy_(gate_up[:, :F])
        moe.experts.w_up.copy_(gate_up[:, F:])
        moe.experts.w_down.copy_(down)


def _copy_mlp(mlp, hf_mlp):
    with torch.no_grad():
        mlp.dense_gate.weight.copy_(hf_mlp.gate_proj.weight)
        mlp.dense_h_to_4h.weight.copy_(hf_mlp.up_proj.weight)
        mlp.dense_4h_to_h.weight.copy_(hf_mlp.down_proj.weight)


def _family(name: str):
    """``(transformers block, our MoE on its weights, the gradient pairs to compare)``."""
    common = dict(hidden_size=H, num_experts_per_tok=2)
    if name == "mixtral":
        hf = HF_MODELS.mixtral.modeling_mixtral.MixtralSparseMoeBlock(
            transformers.MixtralConfig(**common, intermediate_size=F, num_local_experts=E)
        )
        ours = MoE(H, F, MoEConfig(num_experts=E))
    elif name == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(
            **common,
            moe_intermediate_size=F,
            num_experts=E,
            shared_expert_intermediate_size=24,
            norm_topk_prob=False,
        )
        hf = HF_MODELS.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(config)
        moe = dict(norm_topk_prob=False, shared_expert_ffn_hidden_size=24, shared_expert_gate=True)
        ours = MoE(H, F, MoEConfig(num_experts=E, **moe))
    elif name == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(
            **common, moe_intermediate_size=F, num_experts=E, norm_topk_prob=True
        )
        hf = HF_MODELS.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config)
        ours = MoE(H, F, MoEConfig(num_experts=E, norm_topk_prob=True))
    elif name == "olmoe":
        config = transformers.OlmoeConfig(
            **common, intermediate_size=F, num_experts=E, norm_topk_prob=False
        )
        hf = HF_MODELS.olmoe.modeling_olmoe.OlmoeSparseMoeBlock(config)
        ours = MoE(H, F, MoEConfig(num_experts=E, norm_topk_prob=False))
    else:  # deepseek_v3: sigmoid, group-limited, expert bias, scaling, two shared experts
        config = transformers.DeepseekV3Config(
            **common,
            moe_intermediate_size=F,
            n_routed_experts=E,
            n_group=4,
            topk_group=2,
            n_shared_experts=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        )
        hf = HF_MODELS.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE(config)
        moe = dict(
            score_func="sigmoid",
            num_groups=4,
            topk_groups=2,
            routed_scaling_factor=2.5,
            expert_bias=True,
            shared_expert_ffn_hidden_size=2 * F,
        )
        ours = MoE(H, F, MoEConfig(num_experts=E, **moe))
    _perturb(hf, seed=len(name))
    with torch.no_grad():
        ours.router.weight.copy_(hf.gate.weight)
        if name == "deepseek_v3":
            bias = torch.randn(E, generator=torch.Generator().manual_seed(1)) * 0.1
            hf.gate.e_score_correction_bias.copy_(bias)
            ours.router.expert_bias.copy_(bias)
    _copy_experts(ours, hf.experts.gate_up_proj, hf.experts.down_proj)
    pairs = [
        ("router.weight", lambda: hf.gate.weight.grad),
        ("experts.w_gate", lambda: hf.experts.gate_up_proj.grad[:, :F]),
        ("experts.w_up", lambda: hf.experts.gate_up_proj.grad[:, F:]),
        ("experts.w_down", lambda: hf.experts.down_proj.grad),
    ]
    shared = getattr(hf, "shared_expert", None) or getattr(hf, "shared_experts", None)
    if shared is not None:
        _copy_mlp(ours.shared_experts, shared)
        pairs.append(("shared_experts.dense_4h_to_h.weight", lambda: shared.down_proj.weight.grad))
    if getattr(hf, "shared_expert_gate", None) is not None:
        with torch.no_grad():
            ours.shared_expert_gate.weight.copy_(hf.shared_expert_gate.weight)
        pairs.append(("shared_expert_gate.weight", lambda: hf.shared_expert_gate.weight.grad))
    return hf, ours, pairs


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3"])
def test_sparse_blocks_equal_transformers(name):
    hf, ours, pairs = _family(name)
    x = randn(3, 5, H, seed=7)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = hf(x_hf), ours(x_ours)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    g = randn(3, 5, H, seed=8)
    want.backward(g)
    got.backward(g)
    torch.testing.assert_close(x_ours.grad, x_hf.grad, atol=1e-6, rtol=1e-5)
    params = dict(ours.named_parameters())
    for ours_name, hf_grad in pairs:
        torch.testing.assert_close(params[ours_name].grad, hf_grad(), atol=1e-6, rtol=1e-5)


def test_top1_is_not_top2():
    """A planted fault (one expert per token instead of two) is visible against transformers."""
    hf, ours, _ = _family("mixtral")
    ours.router.top_k = 1
    x = randn(3, 5, H, seed=7)
    assert (ours(x) - hf(x)).abs().max() > 1e-2


# ---- the routers' rules, token by token ------------------------------------------------------
def _route_by_hand(logits, k, score_func, norm, scale, bias=None, groups=1, topk_groups=1):
    experts, weights = [], []
    for row in logits:
        s = row.softmax(-1) if score_func == "softmax" else row.sigmoid()
        choice = s + (bias if bias is not None else 0)
        eligible = list(range(E))
        if groups > 1:
            per = E // groups
            group_score = [
                sorted(choice[g * per : (g + 1) * per].tolist())[-2:] for g in range(groups)
            ]
            best = sorted(range(groups), key=lambda g: -sum(group_score[g]))[:topk_groups]
            eligible = [e for e in range(E) if e // per in best]
        chosen = sorted(eligible, key=lambda e: -float(choice[e]))[:k]
        w = torch.stack([s[e] for e in chosen])
        if norm:
            w = w / w.sum()
        experts.append(sorted(chosen))
        weights.append({e: float(v) * scale for e, v in zip(chosen, w)})
    return experts, weights


@pytest.mark.parametrize(
    "settings",
    [
        dict(score_func="softmax", norm_topk_prob=True, top_k=2),
        dict(score_func="softmax", norm_topk_prob=False, top_k=3),
        dict(
            score_func="sigmoid",
            norm_topk_prob=True,
            top_k=2,
            routed_scaling_factor=2.5,
            num_groups=4,
            topk_groups=2,
            expert_bias=True,
        ),
        # groups of 4 experts (a group scores its best two) and of 1 (its only one)
        dict(score_func="sigmoid", top_k=3, num_groups=2, topk_groups=1, expert_bias=True),
        dict(score_func="sigmoid", top_k=2, num_groups=8, topk_groups=3),
    ],
)
def test_router_choices_follow_the_rules(settings):
    moe = MoE(H, F, MoEConfig(num_experts=E, **settings))
    if settings.get("expert_bias"):
        moe.router.expert_bias.copy_(randn(E, seed=3) * 0.3)
    x = randn(20, H, seed=4)
    routing = moe.router(x)
    want_experts, want_weights = _route_by_hand(
        routing.logits,
        settings["top_k"],
        settings["score_func"],
        settings.get("norm_topk_prob", True),
        settings.get("routed_scaling_factor", 1.0),
        moe.router.expert_bias,
        settings.get("num_groups", 1),
        settings.get("topk_groups", 1),
    )
    for t in range(20):
        got = routing.experts[t].tolist()
        assert sorted(got) == want_experts[t], t
        for e, w in zip(got, routing.weights[t].tolist()):
            assert math.isclose(w, want_weights[t][e], rel_tol=1e-5), (t, e)


# ---- the balancing losses ------------------------------------------------------------------
def _losses_by_hand(routing, batch, k):
    """The three formulas with loops over tokens and sequences."""
    T = routing.logits.shape[0]
    probs = routing.balance_probs
    counts = [0.0] * E
    for t in range(T):
        for e in routing.experts[t].tolist():
            counts[e] += 1
    aux = E / (k * T * T) * sum(counts[e] * probs[:, e].sum() for e in range(E))
    seq = T // batch
    per_sequence = []
    for b in range(batch):
        rows = range(b * seq, (b + 1) * seq)
        n = [sum(routing.experts[t].tolist().count(e) for t in rows) for e in range(E)]
        p = [sum(probs[t, e] for t in rows) for e in range(E)]
        per_sequence.append(E / (k * seq * seq) * sum(n[e] * p[e] for e in range(E)))
    z = sum(torch.logsumexp(routing.logits[t], -1) ** 2 for t in range(T)) / T
    return aux, sum(per_sequence) / batch, z


COEFFS = dict(aux_loss_coeff=0.3, seq_aux_loss_coeff=0.2, z_loss_coeff=0.1)


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_balancing_losses_equal_their_formulas_and_reach_the_gradients(score_func):
    torch.manual_seed(0)
    moe = MoE(H, F, MoEConfig(num_experts=E, score_func=score_func, **COEFFS))
    x = randn(3, 5, H, seed=9).requires_grad_()
    out = moe(x)
    terms = collect_moe_losses(moe)
    routing = moe.router(x.detach().reshape(-1, H))
    aux, seq_aux, z = _losses_by_hand(routing, 3, 2)
    assert math.isclose(float(terms["moe_aux_loss"]), 0.3 * float(aux), rel_tol=1e-5)
    assert math.isclose(float(terms["moe_seq_aux_loss"]), 0.2 * float(seq_aux), rel_tol=1e-5)
    assert math.isclose(float(terms["moe_z_loss"]), 0.1 * float(z), rel_tol=1e-5)
    # the gradient: as if 0.3 aux + 0.2 seq_aux + 0.1 z were added to the loss
    out.sum().backward()
    got = moe.router.weight.grad.clone()
    moe.zero_grad()
    plain = MoE(H, F, MoEConfig(num_experts=E, score_func=score_func))
    plain.load_state_dict(moe.state_dict())
    out = plain(x.detach())
    routing = plain.router(x.detach().reshape(-1, H))
    aux, seq_aux, z = _losses_by_hand(routing, 3, 2)
    (out.sum() + 0.3 * aux + 0.2 * seq_aux + 0.1 * z).backward()
    torch.testing.assert_close(got, plain.router.weight.grad, atol=1e-6, rtol=1e-5)


def test_a_dropped_loss_term_changes_the_gradient():
    """The planted fault of dropping the z-loss from backward (logged, not applied) shows."""
    moe = MoE(H, F, MoEConfig(num_experts=E, z_loss_coeff=0.1))
    x = randn(3, 5, H, seed=9)
    moe(x).sum().backward()
    with_z = moe.router.weight.grad.clone()
    moe.zero_grad()
    moe.config = MoEConfig(num_experts=E)
    moe(x).sum().backward()
    assert (with_z - moe.router.weight.grad).abs().max() > 1e-4


def test_expert_bias_update_follows_the_formula():
    moe = MoE(
        H,
        F,
        MoEConfig(num_experts=E, score_func="sigmoid", expert_bias=True, bias_update_rate=0.01),
    )
    x = randn(4, 6, H, seed=11)
    moe(x).sum().backward()  # training: the router counts its assignments
    load = torch.bincount(moe.router(x.reshape(-1, H)).experts.flatten(), minlength=E).float()
    moe.router.tokens_per_expert.copy_(load)  # the second (counting) call above doubled it
    before = moe.router.expert_bias.clone()
    update_expert_biases(moe)
    want = before + 0.01 * torch.sign(load.mean() - load)
    torch.testing.assert_close(moe.router.expert_bias, want)
    assert moe.router.tokens_per_expert.sum() == 0  # counting restarts
    assert (moe.router.expert_bias != before).any()  # skipping the update would show


def test_a_recomputed_block_counts_its_tokens_once():
    """Activation checkpointing reruns the router in backward: the balancing counts must
    not see those tokens again."""
    from libai.layers import TransformerLayer

    config = MoEConfig(num_experts=E, score_func="sigmoid", expert_bias=True)
    block = TransformerLayer(
        H, F, 4, norm_type="rmsnorm", gated_mlp=True, activation="silu", moe=config
    )
    block.activation_checkpointing = "full"
    block(randn(2, 5, H, seed=1).requires_grad_()).sum().backward()
    assert int(block.mlp.router.tokens_per_expert.sum()) == 2 * 5 * 2


# ---- capacity ------------------------------------------------------------------------------
def _keep_by_hand(experts, capacity):
    batch, seq, k = experts.shape
    keep = torch.zeros_like(experts, dtype=torch.bool)
    for b in range(batch):
        taken = [0] * E
        for j in range(k):  # first choices of every token before second choices
            for t in range(seq):
                e = int(experts[b, t, j])
                if taken[e] < capacity:
                    keep[b, t, j], taken[e] = True, taken[e] + 1
    return keep


def test_capacity_drops_follow_gshard_priority_and_the_formula():
    experts = torch.stack(
        [torch.randperm(E, generator=torch.Generator().manual_seed(i))[:2] for i in range(3 * 10)]
    ).view(3, 10, 2)
    experts[0, :, 0] = 5  # one overloaded expert
    capacity = expert_capacity(0.5, 10, 2, E)
    assert capacity == math.ceil(0.5 * 10 * 2 / E)
    keep = capacity_keep(experts, E, capacity)
    assert torch.equal(keep, _keep_by_hand(experts, capacity))
    counts = torch.nn.functional.one_hot(experts, E).sum((1, 2))  # [batch, E]
    assert int((~keep).sum()) == int((counts - capacity).clamp(min=0).sum())


def test_capacity_mode_in_the_layer_drops_what_the_formula_says():
    moe = MoE(H, F, MoEConfig(num_experts=E, capacity_factor=0.5))
    x = randn(3, 10, H, seed=2)
    out = moe(x)
    experts = moe.router(x.reshape(-1, H)).experts.view(3, 10, 2)
    counts = torch.nn.functional.one_hot(experts, E).sum((1, 2))
    assert moe.last_dropped == int((counts - expert_capacity(0.5, 10, 2, E)).clamp(min=0).sum())
    assert moe.last_dropped > 0
    dropless = MoE(H, F, MoEConfig(num_experts=E))
    dropless.load_state_dict(moe.state_dict())
    assert (dropless(x) - out).abs().max() > 1e-4


def _padded_and_unpadded(**extra):
    config = dict(num_experts=E, capacity_factor=0.5, aux_loss_coeff=0.1, z_loss_coeff=0.01)
    unpadded = MoE(H, F, MoEConfig(**config, **extra))
    _perturb(unpadded, seed=5)
    padded = MoE(H, F, MoEConfig(**config, **extra, pad_to_capacity=True))
    padded.load_state_dict(unpadded.state_dict())
    return unpadded, padded


@pytest.mark.parametrize("extra", [{}, {"ffn_bias": True, "shared_expert_ffn_hidden_size": 8}])
def test_padding_to_capacity_gives_the_same_numbers_in_static_buffers(extra):
    """``pad_to_capacity``: every expert runs exactly ``batch * capacity`` rows (its kept
    tokens, zeros after), and output, drops and every gradient equal the unpadded
    capacity mode's."""
    unpadded, padded = _padded_and_unpadded(**extra)
    buffers = []
    run = padded.experts.forward_padded
    padded.experts.forward_padded = lambda rows: buffers.append(rows.detach()) or run(rows)
    grads = {}
    for name, moe in (("unpadded", unpadded), ("padded", padded)):
        x = randn(3, 10, H, seed=2).requires_grad_()
        out = moe(x)
        out.backward(randn(3, 10, H, seed=3))
        grads[name] = [out, x.grad] + [p.grad for p in moe.parameters()]
    assert padded.last_dropped == unpadded.last_dropped > 0
    for a, b in zip(grads["unpadded"], grads["padded"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    capacity = expert_capacity(0.5, 10, 2, E)
    (buffer,) = buffers
    assert buffer.shape == (E, 3 * capacity, H)
    # the rows with a token are exactly the kept assignments, packed at each sequence's start
    filled = buffer.abs().sum(-1) > 0  # [E, batch * capacity]
    assert int(filled.sum()) == 3 * 10 * 2 - padded.last_dropped
    experts = padded.router(randn(3, 10, H, seed=2).reshape(-1, H)).experts.view(3, 10, 2)
    counts = torch.nn.functional.one_hot(experts, E).sum(2)  # [batch, seq, E] -> per sequence
    kept = counts.sum(1).clamp(max=capacity)  # [batch, E]
    assert torch.equal(filled.view(E, 3, capacity).sum(-1).T, kept)


@pytest.mark.not_under_mutation(
    reason="traces the layer whole: mutmut's trampolines around each function break the trace"
)
def test_a_padded_layer_traces_without_graph_breaks_and_exports():
    """Static shapes: ``torch.compile(fullgraph=True)`` traces the padded capacity mode in
    training (losses included) and torch.export exports it with the eager numbers; the
    unpadded mode, whose buffers depend on the routing, does not trace whole."""
    unpadded, padded = _padded_and_unpadded()
    x = randn(2, 8, H, seed=4)
    compiled = torch.compile(padded, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), padded(x), atol=1e-6, rtol=1e-5)
    with pytest.raises(Exception, match="(?i)graph break|data.dependent|item|Unsupported"):
        torch.compile(unpadded, backend="eager", fullgraph=True)(x)
    graph = torch.export.export(padded.eval(), (x,)).module()
    torch.testing.assert_close(graph(x), padded(x), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="pad_to_capacity=True needs moe.capacity_factor"):
        MoEConfig(num_experts=E, pad_to_capacity=True)


# ---- grouped and looped experts, bad configs ----------------------------------------------------
def test_grouped_and_looped_experts_agree():
    """Where torch._grouped_mm runs (torch 2.13's CPU build does fp32), grouped and looped
    experts agree; where it does not, asking for it is a one-line error."""
    from libai.layers.moe_experts import grouped_mm_supported

    if not grouped_mm_supported("cpu", torch.float32, H, F):
        with pytest.raises(ValueError, match="torch._grouped_mm does not run"):
            MoE(H, F, MoEConfig(num_experts=E, expert_impl="grouped"))(randn(2, 3, H))
        pytest.skip(f"torch {torch.__version__} has no CPU grouped matmul")
    layers = {
        impl: MoE(H, F, MoEConfig(num_experts=E, expert_impl=impl))
        for impl in ("grouped", "looped")
    }
    layers["looped"].load_state_dict(layers["grouped"].state_dict())
    x = randn(4, 6, H, seed=1)
    outs = {}
    for impl, moe in layers.items():
        xi = x.clone().requires_grad_()
        out = moe(xi)
        out.backward(randn(4, 6, H, seed=2))
        outs[impl] = (out, xi.grad, moe.experts.w_down.grad)
    for a, b in zip(outs["grouped"], outs["looped"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_experts_run_in_autocasts_dtype():
    """Under bf16 autocast the experts' matmuls run in bf16 as a Linear's would (autocast
    does not cover ``torch._grouped_mm``: the layer casts), grouped and looped alike, and
    the block stays close to transformers' under the same autocast."""
    hf, ours, _ = _family("mixtral")
    x = randn(3, 5, H, seed=7)
    outs = {}
    for impl in ("grouped", "looped"):
        ours.experts.impl = impl
        widths = set()  # (last dim, dtype) of what the experts' matmuls keep for backward

        def pack(t, widths=widths):
            widths.add((t.shape[-1], t.dtype))
            return t

        with torch.autocast("cpu", torch.bfloat16):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                outs[impl] = ours(x)
        assert (F, torch.bfloat16) in widths and (F, torch.float32) not in widths, (impl, widths)
    with torch.autocast("cpu", torch.bfloat16):
        want = hf(x)
    assert outs["grouped"].dtype == outs["looped"].dtype == torch.float32  # as the input
    torch.testing.assert_close(outs["grouped"], outs["looped"], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(outs["grouped"], want.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize(
    "mode",
    [{}, {"capacity_factor": 0.5}, {"capacity_factor": 0.5, "pad_to_capacity": True}],
    ids=["dropless", "capacity", "padded"],
)
def test_a_bf16_layer_returns_bf16_close_to_fp32(mode):
    """A layer whose weights are bf16 returns its input's dtype (dropless sums a token's rows
    in fp32, then casts back; capacity mode casts each weighted row) and stays close to the
    same layer in fp32; dropless drops nothing."""
    torch.manual_seed(0)
    moe = MoE(H, F, MoEConfig(num_experts=E, **mode))
    _perturb(moe, seed=5)
    x = randn(2, 10, H, seed=6)
    want = moe(x)
    dropped = moe.last_dropped
    got = moe.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert got.dtype == torch.bfloat16
    assert (dropped == 0) == (not mode)
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=5e-2)


def test_an_exported_graph_runs_every_expert_with_the_same_numbers():
    """Under torch.export (ONNX's path) the layer computes every expert densely: the same
    output as the routed eager run; capacity mode cannot export (one line)."""
    moe = MoE(H, F, MoEConfig(num_experts=E, shared_expert_ffn_hidden_size=24)).eval()
    x = randn(2, 5, H, seed=3)
    dims = {"hidden": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
    graph = torch.export.export(moe, (x,), dynamic_shapes=dims).module()
    torch.testing.assert_close(graph(x), moe(x), atol=1e-6, rtol=1e-5)
    other = randn(3, 7, H, seed=4)  # the graph is not tied to the routing it was traced on
    torch.testing.assert_close(graph(other), moe(other), atol=1e-6, rtol=1e-5)
    capacity = MoE(H, F, MoEConfig(num_experts=E, capacity_factor=1.0)).eval()
    with pytest.raises(ValueError, match="exporting a Mixture-of-Experts layer needs dropless"):
        torch.export.export(capacity, (x,))


def test_bad_configs_fail_with_one_line():
    with pytest.raises(ValueError, match=r"unknown moe key\(s\) 'topk' \(did you mean top_k\?\)"):
        MoEConfig.of({"num_experts": 4, "topk": 2})
    assert MoEConfig.of({"num_experts": 0}) is None  # dense
    with pytest.raises(ValueError, match="moe.expert_impl must be one of"):
        MoEConfig(num_experts=4, expert_impl="fast")
    with pytest.raises(ValueError, match=r"moe.capacity_factor must be > 0"):
        MoEConfig(num_experts=4, capacity_factor=0)
    with pytest.raises(ValueError, match=r"num_groups \(3\) to divide num_experts \(8\)"):
        MoE(H, F, MoEConfig(num_experts=E, num_groups=3))
    with pytest.raises(ValueError, match="score_func must be one of"):
        MoE(H, F, MoEConfig(num_experts=E, score_func="relu"))
