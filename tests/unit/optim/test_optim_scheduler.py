"""Optimizer parameter groups, build_optimizer, warmup schedulers and their resume."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from libai.config import LazyCall, LazyConfig, get_config, instantiate
from libai.layers import LayerNorm, Linear, RMSLayerNorm
from libai.optim import (
    build_optimizer,
    get_clip_grad_settings,
    get_default_optimizer_params,
    reduce_param_groups,
)
from libai.scheduler import (
    WarmupCosineAnnealingLR,
    WarmupCosineLR,
    WarmupExponentialLR,
    WarmupLinearLR,
    WarmupMultiStepLR,
    WarmupPolynomialLR,
    WarmupStepLR,
    build_lr_scheduler,
)


def _tiny_gpt():
    root = get_config("common/models/gpt.py")
    LazyConfig.apply_overrides(
        root,
        [
            "model.cfg.hidden_layers=2",
            "model.cfg.hidden_size=16",
            "model.cfg.ffn_hidden_size=32",
            "model.cfg.num_attention_heads=2",
            "model.cfg.vocab_size=64",
            "model.cfg.max_seq_length=8",
        ],
    )
    torch.manual_seed(0)
    return instantiate(root.model)


class _Mixed(nn.Module):
    """Every kind of norm plus a Linear used twice (shared parameters)."""

    def __init__(self):
        super().__init__()
        self.proj = Linear(4, 4, bias=True, layer_idx=0)
        self.again = self.proj  # same module, same parameters
        self.ln = LayerNorm(4, layer_idx=0)
        self.rms = RMSLayerNorm(4, layer_idx=0)
        self.torch_ln = nn.LayerNorm(4)
        self.bn = nn.BatchNorm1d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.torch_rms = nn.RMSNorm(4)
        self.emb = nn.Embedding(5, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def _decay_of(groups):
    return {id(p): g.get("weight_decay") for g in groups for p in g["params"]}


# ----------------------------------------------------------------------------- param groups


@pytest.mark.parametrize("norm, bias", [(0.0, 0.0), (0.05, 0.02)])
def test_param_groups_no_decay_on_norms_and_biases(norm, bias):
    """weight_decay_norm for the parameters of normalization layers, weight_decay_bias for
    every bias (a norm's bias too: detectron2 / LiBai apply the bias rule last); the values
    away from 0 make ignoring either visible."""
    model = _Mixed()
    groups = get_default_optimizer_params(
        model, weight_decay=0.1, weight_decay_norm=norm, weight_decay_bias=bias
    )
    decay = _decay_of(groups)
    trainable = [p for p in model.parameters() if p.requires_grad]
    flat = [p for g in groups for p in g["params"]]
    assert len(flat) == len({id(p) for p in flat}) == len(trainable)  # each once
    assert id(model.frozen.weight) not in decay
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            is_norm = name in {"ln", "rms", "torch_ln", "bn", "gn", "torch_rms"}
            expected = bias if pname == "bias" else norm if is_norm else 0.1
            assert decay[id(p)] == expected, f"{name}.{pname}"
    assert len(groups) == len({0.1, norm, bias})  # merged by hyperparameters


def test_param_groups_on_gpt_keep_every_parameter_once():
    model = _tiny_gpt()
    groups = get_default_optimizer_params(model, weight_decay=0.01)
    flat = [p for g in groups for p in g["params"]]
    unique = {id(p) for p in model.parameters()}
    assert len(flat) == len(unique) and {id(p) for p in flat} == unique
    decay = _decay_of(groups)
    named = dict(model.named_parameters())
    for name, p in named.items():
        no_decay = name.endswith("bias") or ".layernorm" in name or "norm" in name.split(".")[-2]
        assert decay[id(p)] == (0.0 if no_decay else 0.01), name
    assert decay[id(named["GPT_model.transformer.layernorm_f.weight"])] == 0.0
    assert decay[id(named["GPT_model.embeddings.token_embeddings.weight"])] == 0.01


def test_param_group_options_and_clip_settings():
    model = _Mixed()
    groups = get_default_optimizer_params(
        model,
        base_lr=0.5,
        weight_decay=0.1,
        weight_decay_norm=None,  # norms keep the default decay
        weight_decay_bias=None,
        clip_grad_max_norm=1.0,
        overrides={"weight": {"lr": 0.25}},
    )
    assert all(g["clip_grad_max_norm"] == 1.0 and g["clip_grad_norm_type"] == 2.0 for g in groups)
    lrs = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert lrs[id(model.ln.weight)] == 0.25 and lrs[id(model.ln.bias)] == 0.5
    assert set(_decay_of(groups).values()) == {0.1}
    optimizer = torch.optim.SGD(groups, lr=1.0)
    assert get_clip_grad_settings(optimizer) == (1.0, 2.0)
    assert get_clip_grad_settings(torch.optim.SGD(model.parameters(), lr=1.0)) is None
    optimizer.param_groups[0]["clip_grad_max_norm"] = 3.0
    with pytest.raises(ValueError, match="disagree"):
        get_clip_grad_settings(optimizer)
    with pytest.raises(ValueError, match="bias"):
        get_default_optimizer_params(model, overrides={"bias": {"lr": 1.0}})
    with pytest.raises(ValueError, match="clip_grad_max_norm"):
        get_default_optimizer_params(model, clip_grad_max_norm=0.0)


def test_reduce_param_groups_merges_and_dedupes():
    a, b, c = (nn.Parameter(torch.zeros(1)) for _ in range(3))
    groups = reduce_param_groups(
        [
            {"params": [a, b], "lr": 1.0, "betas": [0.9, 0.99]},
            {"params": [c], "lr": 1.0, "betas": [0.9, 0.99]},
            {"params": [b], "lr": 2.0},  # b's later group wins
        ]
    )
    assert [[id(p) for p in g["params"]] for g in groups] == [[id(a), id(c)], [id(b)]]
    assert groups[1]["lr"] == 2.0 and groups[1]["betas"] == [0.9, 0.99]


def test_build_optimizer_from_packaged_config():
    optim_cfg = get_config("common/optim.py").optim
    before = LazyConfig.to_dict(optim_cfg)
    model = _tiny_gpt()
    optimizer = build_optimizer(optim_cfg, model)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert LazyConfig.to_dict(optim_cfg) == before  # the config is not modified
    assert sorted({g["weight_decay"] for g in optimizer.param_groups}) == [0.0, 0.01]
    assert all(
        g["lr"] == 1e-4 and tuple(g["betas"]) == (0.9, 0.999) for g in optimizer.param_groups
    )
    assert get_clip_grad_settings(optimizer) == (1.0, 2.0)
    n_params = sum(len(g["params"]) for g in optimizer.param_groups)
    assert n_params == len(list(model.parameters()))
    # a step runs
    out = model(torch.randint(0, 64, (2, 8)), labels=torch.randint(0, 64, (2, 8)))
    out["lm_loss"].backward()
    optimizer.step()
    # without a params node, the default groups are used
    bare = LazyCall(torch.optim.SGD)(lr=0.1)
    assert len(build_optimizer(bare, model).param_groups) == 2


# ----------------------------------------------------------------------------- schedulers

BASE_LR = 2.0
MAX_ITER = 20
WARMUP = 4
FACTOR = 0.1


def _optimizer():
    return torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=BASE_LR)


#: name -> (constructor(optimizer, warmup_method), expected lr at MAX_ITER)
SCHEDULERS = {
    "cosine": (
        lambda o, m: WarmupCosineLR(o, MAX_ITER, FACTOR, WARMUP, alpha=0.05, warmup_method=m),
        0.05 * BASE_LR,
    ),
    "cosine_annealing": (
        lambda o, m: WarmupCosineAnnealingLR(
            o, MAX_ITER, FACTOR, WARMUP, eta_min=0.01, warmup_method=m
        ),
        0.01,
    ),
    "linear": (
        lambda o, m: WarmupLinearLR(o, MAX_ITER, FACTOR, WARMUP, end_factor=0.1, warmup_method=m),
        0.1 * BASE_LR,
    ),
    "step": (
        lambda o, m: WarmupStepLR(
            o, MAX_ITER, FACTOR, WARMUP, step_size=8, gamma=0.5, warmup_method=m
        ),
        BASE_LR * 0.5 ** (MAX_ITER // 8),
    ),
    "multistep": (
        lambda o, m: WarmupMultiStepLR(
            o, MAX_ITER, FACTOR, WARMUP, milestones=[10, 15], gamma=0.1, warmup_method=m
        ),
        BASE_LR * 0.01,
    ),
    "polynomial": (
        lambda o, m: WarmupPolynomialLR(
            o, MAX_ITER, FACTOR, WARMUP, end_learning_rate=0.02, power=2.0, warmup_method=m
        ),
        0.02,
    ),
    "exponential": (
        lambda o, m: WarmupExponentialLR(o, MAX_ITER, 0.9, FACTOR, WARMUP, warmup_method=m),
        BASE_LR * 0.9 ** (MAX_ITER - WARMUP),
    ),
}


def _curve(scheduler, steps):
    lrs = [scheduler.get_last_lr()[0]]
    for _ in range(steps):
        scheduler.optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_curve(name):
    make, final = SCHEDULERS[name]
    lrs = _curve(make(_optimizer(), "linear"), MAX_ITER)
    assert lrs[0] == pytest.approx(BASE_LR * FACTOR)  # warmup starts at warmup_factor
    assert lrs[2] == pytest.approx(BASE_LR * (FACTOR + (1 - FACTOR) * 2 / WARMUP))  # linear
    assert all(a < b for a, b in zip(lrs[:WARMUP], lrs[1 : WARMUP + 1]))  # rising
    assert lrs[WARMUP] == pytest.approx(BASE_LR)  # end of warmup = base lr
    assert lrs[MAX_ITER] == pytest.approx(final)
    assert all(a >= b - 1e-12 for a, b in zip(lrs[WARMUP:], lrs[WARMUP + 1 :]))  # decaying
    constant = _curve(make(_optimizer(), "constant"), WARMUP)
    assert constant[:WARMUP] == pytest.approx([BASE_LR * FACTOR] * WARMUP)
    assert constant[WARMUP] == pytest.approx(BASE_LR)


def test_scheduler_midpoints_and_beyond_max_iter():
    cos = _curve(WarmupCosineLR(_optimizer(), 12, 0.0, 2, alpha=0.0), 14)
    assert cos[7] == pytest.approx(BASE_LR * 0.5)  # halfway through the decay
    assert cos[13] == pytest.approx(0.0)  # held at the final value
    lin = _curve(WarmupLinearLR(_optimizer(), 12, 0.0, 2), 12)
    assert lin[7] == pytest.approx(BASE_LR * 0.5)
    multi = _curve(WarmupMultiStepLR(_optimizer(), 20, 1.0, 0, milestones=[5, 10]), 12)
    assert multi[4] == multi[0] == BASE_LR and multi[5] == pytest.approx(BASE_LR * 0.1)
    assert multi[10] == pytest.approx(BASE_LR * 0.01)
    poly = _curve(
        WarmupPolynomialLR(_optimizer(), 10, 1.0, 0, end_learning_rate=0.0, cycle=True), 15
    )
    assert poly[10] == pytest.approx(0.0)
    assert poly[15] == pytest.approx(BASE_LR * 0.25)  # second cycle spans 20 iterations
    no_warmup = _curve(WarmupCosineLR(_optimizer(), 10, 0.1, 0), 1)
    assert no_warmup[0] == pytest.approx(BASE_LR)


def test_scheduler_bad_arguments():
    with pytest.raises(ValueError, match="warmup_method"):
        WarmupCosineLR(_optimizer(), 10, 0.1, 2, warmup_method="exp")
    with pytest.raises(ValueError, match="max_iter"):
        WarmupCosineLR(_optimizer(), 0, 0.1, 0)
    with pytest.raises(ValueError, match="milestones"):
        WarmupMultiStepLR(_optimizer(), 10, 0.1, 2, milestones=[5, 3])


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_scheduler_state_dict_resume_continues_identically(name):
    make, _ = SCHEDULERS[name]
    full = _curve(make(_optimizer(), "linear"), 12)

    first = make(_optimizer(), "linear")
    _curve(first, 5)
    state = first.state_dict()
    resumed = make(_optimizer(), "linear")  # a fresh process: new optimizer and scheduler
    resumed.load_state_dict(state)
    assert resumed.last_epoch == 5
    assert _curve(resumed, 7)[1:] == pytest.approx(full[6:])


def test_build_lr_scheduler_from_train_config():
    train = get_config("common/train.py").train
    optimizer = _optimizer()
    scheduler = build_lr_scheduler(train.scheduler, optimizer, max_iter=10, warmup_iter=2)
    assert isinstance(scheduler, WarmupCosineLR)
    assert scheduler.max_iter == 10 and scheduler.warmup_iter == 2
    assert scheduler.alpha == 0.01 and scheduler.warmup_factor == 0.001
    assert "max_iter" not in train.scheduler  # the config is not modified
    lrs = _curve(scheduler, 10)
    assert lrs[0] == pytest.approx(BASE_LR * 0.001)
    assert lrs[2] == pytest.approx(BASE_LR)
    assert lrs[10] == pytest.approx(BASE_LR * 0.01)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(lrs[10])
    assert math.isclose(optimizer.param_groups[0]["initial_lr"], BASE_LR)
