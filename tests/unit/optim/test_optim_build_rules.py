"""The rules of :mod:`libai.optim.build` on hand-computed cases: which configs get torch's
fused kernel (decided from the parameters' device, checked with fake CUDA tensors), the clip
settings the trainer reads from the groups, parameters shared between modules or partly
frozen, and how groups with list- or dict-valued hyperparameters merge."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from libai.config import LazyCall
from libai.optim import (
    build_optimizer,
    get_clip_grad_settings,
    get_default_optimizer_params,
    reduce_param_groups,
)
from libai.optim.build import _fused_default
from libai.optim.oneflow_optim import AdamW as OneFlowAdamW


def _cuda_linear() -> nn.Linear:
    """A Linear whose parameters report device ``cuda:0`` (fake tensors: no CUDA needed)."""
    with FakeTensorMode():
        weight, bias = torch.empty(2, 3, device="cuda"), torch.empty(2, device="cuda")
    lin = nn.Linear(3, 2, device="meta")
    lin.weight, lin.bias = nn.Parameter(weight), nn.Parameter(bias)
    assert lin.weight.device.type == "cuda"
    return lin


@pytest.mark.parametrize(
    "target, fused",
    [
        (torch.optim.AdamW, True),
        (torch.optim.Adam, True),
        (torch.optim.SGD, True),
        ("torch.optim.AdamW", True),  # a dotted path, as LazyConfig files save it
        ("torch.optim.SGD", True),
        (torch.optim.RMSprop, False),  # no fused kernel
        (OneFlowAdamW, False),  # only torch's own classes
    ],
)
def test_fused_kernel_for_torch_adam_and_sgd_on_cuda(target, fused):
    cfg = {"_target_": target, "lr": 0.1}
    assert _fused_default(cfg, _cuda_linear()) == ({"fused": True} if fused else {})
    # CPU parameters and a model without parameters never get it
    assert _fused_default(cfg, nn.Linear(3, 2)) == {}
    assert _fused_default(cfg, nn.Module()) == {}


@pytest.mark.parametrize("choice", [False, True, None])
def test_fused_kernel_follows_the_configs_own_choice(choice):
    cfg = LazyCall(torch.optim.AdamW)(lr=0.1, fused=choice)
    assert _fused_default(cfg, _cuda_linear()) == {}
    optimizer = build_optimizer(cfg, _cuda_linear())
    assert optimizer.param_groups[0]["fused"] is choice


def test_build_optimizer_passes_the_fused_choice():
    cfg = LazyCall(torch.optim.AdamW)(lr=0.1)
    on_cuda = build_optimizer(cfg, _cuda_linear())
    assert [g["fused"] for g in on_cuda.param_groups] == [True, True]  # weight, bias groups
    on_cpu = build_optimizer(cfg, nn.Linear(3, 2))
    assert [g["fused"] for g in on_cpu.param_groups] == [None, None]  # torch's default
    assert "fused" not in cfg  # the config is not modified
    # a non-config (here the optimizer class itself) is not a Mapping: no fused decision
    assert _fused_default(torch.optim.AdamW, _cuda_linear()) == {}


def test_build_optimizer_refuses_a_non_config():
    with pytest.raises(TypeError, match="_target_"):
        build_optimizer(torch.optim.SGD, nn.Linear(3, 2))


def _sgd(*groups):
    params = iter(nn.Parameter(torch.zeros(1)) for _ in range(len(groups)))
    return torch.optim.SGD([{"params": [next(params)], **g} for g in groups], lr=0.1)


@pytest.mark.parametrize(
    "groups, want",
    [
        ([{"clip_grad_max_norm": 0.5, "clip_grad_norm_type": 1.0}] * 2, (0.5, 1.0)),
        ([{"clip_grad_max_norm": 0.5, "clip_grad_norm_type": float("inf")}], (0.5, float("inf"))),
        ([{"clip_grad_max_norm": 0.5}], (0.5, 2.0)),  # the norm type defaults to 2
        (
            [{"clip_grad_max_norm": 0.5}, {"clip_grad_max_norm": 0.5, "clip_grad_norm_type": 2.0}],
            (0.5, 2.0),
        ),  # a missing type and 2.0 agree
        ([{"clip_grad_max_norm": 0.5, "clip_grad_norm_type": None}], (0.5, 2.0)),
        ([{"clip_grad_max_norm": 3, "clip_grad_norm_type": 1}], (3.0, 1.0)),
        ([{}, {}], None),
        ([{"clip_grad_norm_type": 1.0}], None),  # no max norm: no clipping
    ],
)
def test_clip_grad_settings_from_the_groups(groups, want):
    got = get_clip_grad_settings(_sgd(*groups))
    assert got == want
    if got is not None:
        assert all(type(x) is float for x in got)


def test_clip_grad_settings_disagreeing_norm_types_are_refused():
    with pytest.raises(ValueError, match="disagree"):
        get_clip_grad_settings(
            _sgd(
                {"clip_grad_max_norm": 0.5}, {"clip_grad_max_norm": 0.5, "clip_grad_norm_type": 1.0}
            )
        )


def test_param_groups_store_the_given_clip_norm_type():
    model = nn.Linear(2, 2)
    groups = get_default_optimizer_params(model, clip_grad_max_norm=0.5, clip_grad_norm_type=1)
    pairs = [(g["clip_grad_max_norm"], g["clip_grad_norm_type"]) for g in groups]
    assert pairs == [(0.5, 1.0), (0.5, 1.0)]  # the weight's group, the bias's (no decay)
    assert get_clip_grad_settings(torch.optim.SGD(groups, lr=0.1)) == (0.5, 1.0)


def test_param_shared_between_modules_keeps_its_first_rule():
    """A parameter reached through two modules is grouped once, with the rule of the module
    it first appears in (LiBai / detectron2 keep a memo of parameters already seen)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    model[1].weight = model[0].bias  # the Linear's bias is also the norm's weight
    groups = get_default_optimizer_params(
        model, weight_decay=0.1, weight_decay_norm=0.2, weight_decay_bias=0.3
    )
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay == {
        id(model[0].weight): 0.1,
        id(model[0].bias): 0.3,  # first seen as the Linear's "bias"
        id(model[1].bias): 0.3,
    }
    assert [len(g["params"]) for g in groups] == [1, 2]
    # the other order: first seen as the norm's weight
    model = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 4))
    model[1].bias = model[0].weight
    groups = get_default_optimizer_params(
        model, weight_decay=0.1, weight_decay_norm=0.2, weight_decay_bias=0.3
    )
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay[id(model[0].weight)] == 0.2 and decay[id(model[0].bias)] == 0.3
    assert sum(len(g["params"]) for g in groups) == 3


def test_frozen_parameter_skips_only_itself():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[0].weight.requires_grad_(False)
    model[1].bias = model[0].bias  # shared: seen before, yet the next module's weight stays
    model.extra = nn.LayerNorm(3)
    model.extra.weight = model[1].weight
    groups = get_default_optimizer_params(model, weight_decay=0.1, weight_decay_bias=0.0)
    grouped = [p for g in groups for p in g["params"]]
    want = [model[0].bias, model[1].weight, model.extra.bias]
    assert sorted(map(id, grouped)) == sorted(map(id, want))
    assert len(grouped) == 3


def test_param_groups_copy_the_override_values():
    """The groups hold their own copies of mutable override values: changing the caller's
    list afterwards does not change the optimizer's hyperparameters."""
    betas = [0.8, 0.9]
    overrides = {"weight": {"betas": betas}}
    model = nn.Linear(2, 2)
    groups = get_default_optimizer_params(model, overrides=overrides)
    betas[0] = 0.5
    weight_group = next(g for g in groups if g["params"][0] is model.weight)
    assert weight_group["betas"] == [0.8, 0.9]
    assert overrides == {"weight": {"betas": [0.5, 0.9]}}  # the caller's dict not modified


def test_reduce_param_groups_keys_on_list_and_dict_values():
    a, b, c, d, e = (nn.Parameter(torch.zeros(1)) for _ in range(5))
    groups = reduce_param_groups(
        [
            {"params": [a], "betas": [0.9, 0.99]},
            {"params": [b], "betas": [0.9, 0.95]},  # another list: another group
            {"params": [c], "betas": (0.9, 0.99), "extra": {"x": 1, "y": [1, 2]}},
            {"params": [d], "betas": (0.9, 0.99), "extra": {"y": [1, 2], "x": 1}},  # same
            {"params": [e], "betas": (0.9, 0.99), "extra": {"x": 1, "y": [1, 3]}},
        ]
    )
    assert [[id(p) for p in g["params"]] for g in groups] == [
        [id(a)],
        [id(b)],
        [id(c), id(d)],
        [id(e)],
    ]
    groups = reduce_param_groups(
        [
            {"params": [a], "extra": {"x": 1}},
            {"params": [b], "extra": {"x": 2}},  # same key, another value
            {"params": [c], "extra": {"x": 1}},
        ]
    )
    assert [[id(p) for p in g["params"]] for g in groups] == [[id(a), id(c)], [id(b)]]
