"""The optimizers LiBai's configs name through OneFlow (``flow.optim.AdamW`` / ``Adam`` /
``LAMB``, :mod:`libai.optim.oneflow_optim`) against their update rules written out here:
every OneFlow argument with a value away from its default, each default left out once, the
argument checks at their bounds, and LAMB on a parameter sharded over two ranks (torchrun)."""

from __future__ import annotations

import pytest
import torch
from launch import torchrun
from torch import nn

from libai.optim.oneflow_optim import LAMB, Adam, AdamW

TOL = {"rtol": 1e-6, "atol": 1e-7}


def _case(seed=0, shape=(4, 3), steps=3):
    """A start value and gradients whose entries differ in size by ~100x (so ``eps`` and the
    per-entry scaling of Adam's moments show) and shrink after the first step (so AMSGrad's
    running maximum differs from the second moment)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(shape, generator=gen)
    scale = torch.logspace(-2, 0, start.numel()).reshape(shape)
    grads = [
        torch.randn(shape, generator=gen) * scale * (1.0 if t == 0 else 0.2) for t in range(steps)
    ]
    return start, grads


def _run(optimizer_cls, start, grads, *args, **kwargs):
    p = nn.Parameter(start.clone())
    opt = optimizer_cls([p], *args, **kwargs)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


def _differs(a, b):
    return not torch.allclose(a, b, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- Adam / AdamW


def adam_reference(start, grads, lr, betas, eps, weight_decay, amsgrad, decoupled):
    """Adam (Kingma & Ba 2015) with bias correction; AdamW's decoupled weight decay
    (Loshchilov & Hutter 2019) or Adam's L2 term on the gradient; AMSGrad's running maximum
    of the second moment (Reddi et al. 2018)."""
    b1, b2 = betas
    w, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    v_max = torch.zeros_like(start)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            w = w * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        v_max = torch.maximum(v_max, v)
        second = v_max if amsgrad else v
        denom = second.sqrt() / (1 - b2**t) ** 0.5 + eps
        w = w - lr / (1 - b1**t) * m / denom
    return w


#: every argument away from torch's / OneFlow's default and from the others
ADAM_ARGS = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1, "amsgrad": True}
#: torch's defaults (OneFlow's too, but AdamW's weight decay: OneFlow 0, torch 0.01)
ADAM_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False}


@pytest.mark.parametrize("cls, decoupled, default_wd", [(AdamW, True, 0.01), (Adam, False, 0.0)])
def test_adam_and_adamw_equal_their_formula(cls, decoupled, default_wd):
    start, grads = _case()
    want = adam_reference(start, grads, **ADAM_ARGS, decoupled=decoupled)
    by_name = _run(cls, start, grads, **ADAM_ARGS, do_bias_correction=True)
    torch.testing.assert_close(by_name, want, **TOL)
    # torch's positional order (lr, betas, eps, weight_decay, amsgrad) passes through
    positional = _run(cls, start, grads, *ADAM_ARGS.values())
    torch.testing.assert_close(positional, want, **TOL)
    assert isinstance(cls([nn.Parameter(start.clone())]), torch.optim.Adam)
    # each argument matters: the formula with it at its default is another result
    for key, default in {**ADAM_DEFAULTS, "weight_decay": 0.0}.items():
        assert _differs(
            want, adam_reference(start, grads, **{**ADAM_ARGS, key: default}, decoupled=decoupled)
        ), key
    # the other weight-decay style is another result too
    assert _differs(want, adam_reference(start, grads, **ADAM_ARGS, decoupled=not decoupled))
    # nothing given: torch's defaults (do_bias_correction=True)
    defaults = _run(cls, start, grads)
    want = adam_reference(
        start, grads, **ADAM_DEFAULTS, weight_decay=default_wd, decoupled=decoupled
    )
    torch.testing.assert_close(defaults, want, **TOL)


@pytest.mark.parametrize("cls", [AdamW, Adam])
def test_adam_without_bias_correction_is_refused_by_name(cls):
    p = nn.Parameter(torch.zeros(2))
    name = cls.__name__
    with pytest.raises(ValueError, match=rf"^optim {name}\(do_bias_correction=False\) has no"):
        cls([p], lr=0.1, do_bias_correction=False)
    with pytest.raises(ValueError, match=rf"^optim {name}\(do_bias_correction=False\)"):
        cls([p], 0.1, do_bias_correction=0)  # any false value


# ----------------------------------------------------------------------------- LAMB


def lamb_reference(
    start,
    grads,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    adam_w_mode=True,
    do_bias_correction=True,
):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2) with
    OneFlow's options and defaults: ``adam_w_mode`` adds the weight decay to the update
    (False: to the gradient), ``do_bias_correction`` divides the moments by ``1 - beta^t``;
    the trust ratio ||w|| / ||update|| is 1 when either norm is 0."""
    b1, b2 = betas
    w, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    for t, g in enumerate(grads, start=1):
        if not adam_w_mode:
            g = g + weight_decay * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = (m / (1 - b1**t), v / (1 - b2**t)) if do_bias_correction else (m, v)
        u = m_hat / (v_hat.sqrt() + eps)
        if adam_w_mode:
            u = u + weight_decay * w
        w_norm, u_norm = w.norm().item(), u.norm().item()
        trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        w = w - lr * trust * u
    return w


#: OneFlow's documented defaults of flow.optim.LAMB
LAMB_DEFAULTS = {
    "lr": 1e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.0,
    "adam_w_mode": True,
    "do_bias_correction": True,
}
#: every argument away from its default; adam_w_mode / do_bias_correction flipped in the cases
LAMB_ARGS = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1}


@pytest.mark.parametrize(
    "flags",
    [
        {"adam_w_mode": True, "do_bias_correction": True},
        {"adam_w_mode": False, "do_bias_correction": True},
        {"adam_w_mode": True, "do_bias_correction": False},
        {"adam_w_mode": False, "do_bias_correction": False},
    ],
)
def test_lamb_equals_the_formula(flags):
    start, grads = _case(seed=1)
    kwargs = {**LAMB_ARGS, **flags}
    got = _run(LAMB, start, grads, **kwargs, amsgrad=False)
    want = lamb_reference(start, grads, **kwargs)
    torch.testing.assert_close(got, want, **TOL)
    # each argument matters here: the formula with it changed is another result
    for key, value in LAMB_DEFAULTS.items():
        other = (not flags[key]) if key in flags else value
        assert _differs(want, lamb_reference(start, grads, **{**kwargs, key: other})), key


@pytest.mark.parametrize("left_out", [*LAMB_DEFAULTS, "all"])
def test_lamb_defaults_are_oneflows(left_out):
    """Each argument left out once (the others away from their defaults) takes OneFlow's
    default; with none given, LAMB is the formula at OneFlow's defaults."""
    start, grads = _case(seed=2)
    given = {**LAMB_ARGS, "adam_w_mode": False, "do_bias_correction": False}
    if left_out == "all":
        given = {}
    else:
        del given[left_out]
    want = lamb_reference(start, grads, **{**LAMB_DEFAULTS, **given})
    torch.testing.assert_close(_run(LAMB, start, grads, **given), want, **TOL)
    if left_out != "all":  # the default is visible: the value given elsewhere differs
        other = {**LAMB_DEFAULTS, **LAMB_ARGS, "adam_w_mode": False, "do_bias_correction": False}
        assert _differs(want, lamb_reference(start, grads, **other)), left_out


def test_lamb_trust_ratio_is_one_for_a_zero_parameter_and_skips_missing_grads():
    zero, grads = torch.zeros(2, 3), [torch.tensor([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]])]
    got = _run(LAMB, zero, grads, lr=0.1, eps=0.0)
    # step 1 with bias correction: u = g / |g| = sign(g); ||w|| = 0 -> ratio 1
    torch.testing.assert_close(got, -0.1 * grads[0].sign(), **TOL)
    torch.testing.assert_close(got, lamb_reference(zero, grads, lr=0.1, eps=0.0), **TOL)
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    opt = LAMB([a, b], lr=0.1, betas=[0.5, 0.5])  # a list works as betas
    assert opt.param_groups[0]["betas"] == (0.5, 0.5)
    a.grad = torch.tensor([1.0, -1.0, 2.0])
    opt.step()
    assert torch.equal(b.detach(), torch.ones(3)) and b not in opt.state
    torch.testing.assert_close(
        a.detach(), lamb_reference(torch.ones(3), [a.grad], lr=0.1, betas=(0.5, 0.5)), **TOL
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": -0.01},
        {"eps": -1e-8},
        {"betas": (1.0, 0.999)},
        {"betas": (0.9, 1.0)},
        {"betas": (0.9, 1.5)},
        {"betas": (-0.1, 0.999)},
    ],
)
def test_lamb_refuses_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="optim LAMB: invalid"):
        LAMB([nn.Parameter(torch.ones(2))], **kwargs)


def test_lamb_refuses_amsgrad():
    with pytest.raises(ValueError, match=r"LAMB\(amsgrad=True\)"):
        LAMB([nn.Parameter(torch.ones(2))], amsgrad=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.0},
        {"lr": 0.5},
        {"eps": 0.0},
        {"eps": 0.5},
        {"betas": (0.0, 0.0)},
        {"betas": (0.0, 0.999)},
        {"betas": (0.999, 0.5)},
    ],
)
def test_lamb_accepts_the_bounds(kwargs):
    """lr, eps and betas of 0 are valid (as in OneFlow and torch), and any value of lr / eps
    up to 1 and beyond: the step is the formula's."""
    start, grads = _case(seed=3, steps=2)
    got = _run(LAMB, start, grads, weight_decay=0.05, **kwargs)
    want = lamb_reference(start, grads, weight_decay=0.05, **kwargs)
    torch.testing.assert_close(got, want, **TOL)


# ----------------------------------------------------------------------------- LAMB sharded


def test_lamb_on_sharded_parameters_equals_the_formula_on_the_whole(tmp_path):
    """Tensor-parallel parameters are DTensors: LAMB's trust ratio uses the norms of the whole
    parameter and update (all shards), so 2 ranks give the formula on the full tensor. The
    rows differ in size, so one shard's norm would give another step."""
    cases = {}
    for name, shape in {"rows": (4, 3), "cols": (2, 6), "replicated": (3,)}.items():
        start, grads = _case(seed=4, shape=shape, steps=2)
        start[: shape[0] // 2] *= 10.0  # the first shard of "rows" is much larger
        cases[name] = {"start": start, "grads": grads}
    kwargs = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1}
    path = tmp_path / "lamb_cases.pt"
    torch.save({"cases": cases, "kwargs": kwargs}, path)
    results = torchrun("lamb_sharded.py", 2, str(path))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
    for name, case in cases.items():
        want = lamb_reference(case["start"], case["grads"], **kwargs)
        for rank, result in enumerate(results):
            got = torch.tensor(result["params"][name])
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=f"{name} {rank}")
    # the layout: each rank held half of the sharded parameters
    assert [r["local_shapes"]["rows"] for r in results] == [[2, 3], [2, 3]]
    assert [r["local_shapes"]["cols"] for r in results] == [[2, 3], [2, 3]]
    assert [r["local_shapes"]["replicated"] for r in results] == [[3], [3]]
