"""Every LR scheduler of ``libai.scheduler`` against its closed form written out here, at
every step (through warmup, the decay and past its end), in every param group, with
non-default settings and with the defaults, and when resumed with ``last_epoch``.

LiBai's warmup schedulers follow the module's documented rule ``base_lr × warmup(t) ×
decay(t)``; FleetX's schedules are PaddleFleetX's ``ppfleetx/optims/lr_scheduler.py``
(``CosineAnnealingWithWarmupDecay``, ``LinearDecayWithWarmup``, ``ViTLRScheduler``),
transcribed below. Tolerance 1e-12: closed forms of the step counter."""

from __future__ import annotations

import logging
import math
import warnings

import pytest
import torch
from torch import nn

from libai.config import LazyCall
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
from libai.scheduler.fleetx import (
    CosineAnnealingWithWarmupDecay,
    LinearDecayWithWarmup,
    ViTLRScheduler,
)

TOL = 1e-12
BASES = (0.5, 2.0)  # two param groups with different base LRs


def _optimizer(bases=BASES, lr=None):
    """SGD with one group per base LR; ``lr`` overrides every group's current LR."""
    groups = [{"params": [nn.Parameter(torch.zeros(1))], "lr": b} for b in bases]
    opt = torch.optim.SGD(groups, lr=1.0)
    if lr is not None:
        for g in opt.param_groups:
            g["lr"] = lr
    return opt


def _run(scheduler, steps):
    """The LRs of every group after construction and after each of ``steps`` steps."""
    rows = [[g["lr"] for g in scheduler.optimizer.param_groups]]
    for _ in range(steps):
        scheduler.optimizer.step()
        scheduler.step()
        rows.append([g["lr"] for g in scheduler.optimizer.param_groups])
    return rows


def _assert_close(got, want):
    assert len(got) == len(want)
    err = max(abs(g - w) for row_g, row_w in zip(got, want) for g, w in zip(row_g, row_w))
    assert err <= TOL, (got, want)


# ------------------------------------------------------------------- LiBai: the reference


def _warmup(t, factor, w, method):
    if t >= w:
        return 1.0
    return factor if method == "constant" else factor + (1.0 - factor) * t / w


def _done(t, w, m):
    """Fraction of the post-warmup decay done at ``t`` (every case here has ``m > w``)."""
    return min(1.0, max(0.0, (t - w) / (m - w)))


def libai_lr(name, base, t, *, max_iter, warmup_factor, warmup_iter, warmup_method, **a):
    m, w = max_iter, warmup_iter
    if name == "cosine":
        alpha = a.get("alpha", 0.0)
        lr = base * (alpha + (1 - alpha) * 0.5 * (1 + math.cos(math.pi * _done(t, w, m))))
    elif name == "cosine_annealing":  # periodic past max_iter, as torch's CosineAnnealingLR
        eta = a.get("eta_min", 0.0)
        lr = eta + (base - eta) * 0.5 * (1 + math.cos(math.pi * max(0, t - w) / (m - w)))
    elif name == "linear":
        lr = base * (1 - (1 - a.get("end_factor", 0.0)) * _done(t, w, m))
    elif name == "step":  # absolute iterations
        lr = base * a.get("gamma", 0.1) ** (t // a["step_size"])
    elif name == "multistep":
        lr = base * a.get("gamma", 0.1) ** sum(1 for s in a["milestones"] if s <= t)
    elif name == "polynomial":
        end, power = a.get("end_learning_rate", 1e-4), a.get("power", 1.0)
        first, done = m - w, max(0, t - w)
        if a.get("cycle", False):  # restarts over 1, 2, 3, ... times the first span
            span = first * (math.ceil(done / first) if done > 0 else 1)
        else:
            span, done = first, min(done, first)
        lr = (base - end) * (1 - done / span) ** power + end
    elif name == "exponential":
        lr = base * a["gamma"] ** max(0, t - w)
    else:
        raise AssertionError(name)
    return lr * _warmup(t, warmup_factor, w, warmup_method)


CLASSES = {
    "cosine": WarmupCosineLR,
    "cosine_annealing": WarmupCosineAnnealingLR,
    "linear": WarmupLinearLR,
    "step": WarmupStepLR,
    "multistep": WarmupMultiStepLR,
    "polynomial": WarmupPolynomialLR,
    "exponential": WarmupExponentialLR,
}

#: every scheduler's own settings, away from their defaults (and from each other)
SETTINGS = [
    ("cosine", dict(alpha=0.2)),
    ("cosine_annealing", dict(eta_min=0.03)),
    ("linear", dict(end_factor=0.3)),
    ("step", dict(step_size=1, gamma=0.7)),  # the smallest step size: a drop at every step
    ("step", dict(step_size=5, gamma=0.7)),
    ("multistep", dict(milestones=[2, 5, 9], gamma=0.6)),
    ("polynomial", dict(end_learning_rate=0.05, power=1.5)),
    ("polynomial", dict(end_learning_rate=0.05, power=1.5, cycle=True)),
    ("exponential", dict(gamma=0.8)),
]

#: (max_iter, warmup_iter, warmup_factor, warmup_method)
SHAPES = [
    (12, 3, 0.25, "linear"),
    (12, 3, 0.25, "constant"),
    (4, 3, 0.4, "linear"),  # a one-iteration decay
    (1, 0, 0.5, "linear"),  # the shortest run
]


def _args(shape, settings):
    m, w, f, method = shape
    return dict(max_iter=m, warmup_iter=w, warmup_factor=f, warmup_method=method, **settings)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("name, settings", SETTINGS, ids=lambda x: str(x))
def test_libai_scheduler_equals_its_formula(name, settings, shape):
    args = _args(shape, settings)
    steps = shape[0] + 6  # past max_iter: held (or periodic / cycling)
    got = _run(CLASSES[name](_optimizer(), **args), steps)
    want = [[libai_lr(name, b, t, **args) for b in BASES] for t in range(steps + 1)]
    _assert_close(got, want)


@pytest.mark.parametrize("name, settings", SETTINGS, ids=lambda x: str(x))
def test_libai_scheduler_resumed_with_last_epoch(name, settings):
    """``last_epoch=k`` on an optimizer whose groups carry ``initial_lr`` (as a loaded
    optimizer state does, with its current LR elsewhere) continues at ``k + 1``."""
    args = _args(SHAPES[0], settings)
    opt = _optimizer(lr=123.0)
    for g, b in zip(opt.param_groups, BASES):
        g["initial_lr"] = b
    scheduler = CLASSES[name](opt, last_epoch=4, **args)
    assert scheduler.last_epoch == 5
    want = [[libai_lr(name, b, t, **args) for b in BASES] for t in range(5, 15)]
    _assert_close(_run(scheduler, 9), want)


def test_libai_scheduler_defaults():
    """Only the required arguments: the documented defaults (linear warmup, alpha 0, eta_min
    0, end_factor 0, gamma 0.1, end_learning_rate 1e-4, power 1, no cycling)."""
    m, w, f = 6, 2, 0.3
    ref = dict(max_iter=m, warmup_iter=w, warmup_factor=f, warmup_method="linear")
    cases = [
        ("cosine", WarmupCosineLR(_optimizer(), m, f, w), {}),
        ("cosine_annealing", WarmupCosineAnnealingLR(_optimizer(), m, f, w), {}),
        ("linear", WarmupLinearLR(_optimizer(), m, f, w), {}),
        ("step", WarmupStepLR(_optimizer(), m, f, w, step_size=3), {"step_size": 3}),
        ("multistep", WarmupMultiStepLR(_optimizer(), m, f, w, [1, 4]), {"milestones": [1, 4]}),
        ("polynomial", WarmupPolynomialLR(_optimizer(), m, f, w), {}),
        ("exponential", WarmupExponentialLR(_optimizer(), m, 0.9, f, w), {"gamma": 0.9}),
    ]
    for name, scheduler, extra in cases:
        want = [[libai_lr(name, b, t, **ref, **extra) for b in BASES] for t in range(m + 5)]
        _assert_close(_run(scheduler, m + 4), want)
    # the polynomial schedule holds 1e-4 after max_iter (cycling would climb back)
    held = _run(WarmupPolynomialLR(_optimizer(), m, f, w), m + 3)[m:]
    assert all(lr == pytest.approx(1e-4, abs=TOL) for row in held for lr in row)


def test_libai_scheduler_step_with_an_epoch_uses_the_closed_form():
    """torch's (deprecated) ``step(epoch)`` jumps to ``epoch`` through
    ``_get_closed_form_lr``."""
    args = _args(SHAPES[0], dict(alpha=0.2))
    scheduler = WarmupCosineLR(_optimizer(), **args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for epoch in (7, 2, 15):
            scheduler.optimizer.step()
            scheduler.step(epoch)
            want = [libai_lr("cosine", b, epoch, **args) for b in BASES]
            _assert_close([scheduler.get_last_lr()], [want])


def test_libai_scheduler_warns_only_when_warmup_exceeds_max_iter():
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    log = logging.getLogger("libai.scheduler.lr_scheduler")
    log.addHandler(handler)
    try:
        WarmupLinearLR(_optimizer(), 5, 0.1, 5)  # warmup ends exactly at max_iter: fine
        assert records == []
        WarmupLinearLR(_optimizer(), 5, 0.1, 6)
        assert len(records) == 1 and "larger than max_iter" in records[0].getMessage()
    finally:
        log.removeHandler(handler)


def test_libai_scheduler_smallest_valid_arguments_and_bad_ones():
    WarmupCosineLR(_optimizer(), 1, 0.1, 0)  # max_iter=1 is a run
    WarmupStepLR(_optimizer(), 5, 0.1, 0, step_size=1)
    with pytest.raises(ValueError, match="step_size"):
        WarmupStepLR(_optimizer(), 5, 0.1, 0, step_size=0)
    with pytest.raises(ValueError, match="warmup_iter"):
        WarmupCosineLR(_optimizer(), 5, 0.1, -1)


def test_build_lr_scheduler_fills_max_iter_and_no_warmup_by_default():
    cfg = LazyCall(WarmupCosineLR)(warmup_factor=0.1, alpha=0.2)
    scheduler = build_lr_scheduler(cfg, _optimizer(), max_iter=8.0)
    assert scheduler.warmup_iter == 0 and scheduler.max_iter == 8
    ref = dict(max_iter=8, warmup_iter=0, warmup_factor=0.1, warmup_method="linear", alpha=0.2)
    want = [[libai_lr("cosine", b, t, **ref) for b in BASES] for t in range(10)]
    _assert_close(_run(scheduler, 9), want)  # starts at the base LR, not warmup_factor × it


# ------------------------------------------------------------------ FleetX: the reference


def fleetx_cosine(t, max_lr, min_lr, warmup_rate, decay_steps):
    warmup_step = warmup_rate * decay_steps
    if warmup_step > 0 and t <= warmup_step:
        return float(max_lr) * t / warmup_step
    if t > decay_steps:
        return min_lr
    decay_ratio = float(t - warmup_step) / float(decay_steps - warmup_step)
    return min_lr + 0.5 * (math.cos(math.pi * decay_ratio) + 1.0) * (max_lr - min_lr)


def fleetx_linear(t, learning_rate, total_steps, warmup=0):
    steps = warmup if isinstance(warmup, int) else int(math.floor(warmup * total_steps))
    if t < steps:
        return learning_rate * t / max(1, steps)
    return learning_rate * max(0.0, 1.0 - t / total_steps)


def fleetx_vit(t, learning_rate, total_steps, decay_type="cosine", linear_end=1e-5, warmup_steps=0):
    if warmup_steps >= total_steps:
        warmup_steps = total_steps - 1
    progress = (t - warmup_steps) / float(total_steps - warmup_steps)
    progress = min(1.0, max(0.0, progress))
    if decay_type == "linear":
        lr = linear_end + (learning_rate - linear_end) * (1.0 - progress)
    else:
        lr = 0.5 * learning_rate * (1.0 + math.cos(math.pi * progress))
    if warmup_steps:
        lr = lr * min(1.0, t / warmup_steps)
    return lr


COSINE = dict(max_lr=0.1, min_lr=0.01, warmup_rate=0.3, decay_steps=8)


@pytest.mark.parametrize(
    "args, increment",
    [
        (COSINE, None),  # the default increment: t counts steps
        (dict(max_lr=0.1, min_lr=0.01, warmup_rate=0.25, decay_steps=30), 3),  # t counts samples
        (dict(max_lr=0.1, min_lr=0.02, warmup_rate=0.1, decay_steps=5), None),  # a half step
        (dict(max_lr=0.1, min_lr=0.02, warmup_rate=0.0, decay_steps=1), None),  # shortest
    ],
)
def test_fleetx_cosine_equals_fleetx(args, increment):
    extra = {} if increment is None else {"increment": increment}
    scheduler = CosineAnnealingWithWarmupDecay(_optimizer(lr=0.7), **args, **extra)
    steps = 14
    inc = increment or 1
    want = [[fleetx_cosine(s * inc, **args)] * len(BASES) for s in range(steps + 1)]
    _assert_close(_run(scheduler, steps), want)


def test_fleetx_cosine_warmup_end_is_fleetx_bit_for_bit():
    """FleetX's warmup includes its last step (``t <= w``): at ``t == w`` the LR is
    ``max_lr × t / w``, which for these values rounds to 0.10000000000000002, where the
    cosine branch would give 0.1. The same float operations in the same order: exact."""
    args = dict(max_lr=0.1, min_lr=0.01, warmup_rate=0.375, decay_steps=8)  # w = 3.0
    lrs = _run(CosineAnnealingWithWarmupDecay(_optimizer(), **args), 10)
    assert [row[0] for row in lrs] == [fleetx_cosine(t, **args) for t in range(11)]
    assert lrs[3][0] == 0.1 * 3 / 3.0 != 0.1


def test_fleetx_cosine_resumed_and_jumped():
    scheduler = CosineAnnealingWithWarmupDecay(_optimizer(lr=0.7), **COSINE, last_epoch=3)
    assert [g["initial_lr"] for g in scheduler.optimizer.param_groups] == [0.1, 0.1]
    assert scheduler.base_lrs == [0.1, 0.1]
    want = [[fleetx_cosine(t, **COSINE)] * len(BASES) for t in range(4, 12)]
    _assert_close(_run(scheduler, 7), want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step(2)
    _assert_close([scheduler.get_last_lr()], [[fleetx_cosine(2, **COSINE)] * len(BASES)])


def test_fleetx_cosine_arguments():
    CosineAnnealingWithWarmupDecay(_optimizer(), 0.1, 0.0, 0.999, 1)
    for rate in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="warmup_rate"):
            CosineAnnealingWithWarmupDecay(_optimizer(), 0.1, 0.0, rate, 10)
    with pytest.raises(ValueError, match="decay_steps"):
        CosineAnnealingWithWarmupDecay(_optimizer(), 0.1, 0.0, 0.1, 0)
    with pytest.raises(ValueError, match="increment"):
        CosineAnnealingWithWarmupDecay(_optimizer(), 0.1, 0.0, 0.1, 5, increment=0)


@pytest.mark.parametrize(
    "args",
    [
        dict(learning_rate=0.1, total_steps=10),  # the default: no warmup
        dict(learning_rate=0.1, total_steps=10, warmup=3),
        dict(learning_rate=0.1, total_steps=10, warmup=0.25),
        dict(learning_rate=0.1, total_steps=1),  # shortest
    ],
)
def test_fleetx_linear_equals_fleetx(args):
    scheduler = LinearDecayWithWarmup(_optimizer(lr=0.7), **args)
    want = [[fleetx_linear(t, **args)] * len(BASES) for t in range(14)]
    _assert_close(_run(scheduler, 13), want)


def test_fleetx_linear_resumed():
    args = dict(learning_rate=0.1, total_steps=10, warmup=3)
    scheduler = LinearDecayWithWarmup(_optimizer(lr=0.7), **args, last_epoch=1)
    assert [g["initial_lr"] for g in scheduler.optimizer.param_groups] == [0.1, 0.1]
    assert scheduler.base_lrs == [0.1, 0.1]
    want = [[fleetx_linear(t, **args)] * len(BASES) for t in range(2, 12)]
    _assert_close(_run(scheduler, 9), want)
    with pytest.raises(ValueError, match="total_steps"):
        LinearDecayWithWarmup(_optimizer(), 0.1, 0)


VIT_CASES = [
    dict(learning_rate=0.2, total_steps=10),  # the defaults: cosine, no warmup
    dict(learning_rate=0.2, total_steps=10, warmup_steps=3),
    dict(learning_rate=0.2, total_steps=10, decay_type="linear", linear_end=0.02, warmup_steps=4),
    dict(learning_rate=0.2, total_steps=10, decay_type="linear"),  # the default linear_end
    dict(learning_rate=0.2, total_steps=10, warmup_steps=10),  # capped at total_steps - 1
    dict(learning_rate=0.2, total_steps=10, decay_type="linear", warmup_steps=25),
    dict(learning_rate=0.2, total_steps=1),  # shortest
]


@pytest.mark.parametrize("args", VIT_CASES)
def test_fleetx_vit_equals_fleetx(args):
    scheduler = ViTLRScheduler(_optimizer(lr=0.7), **args)
    steps = args["total_steps"] + 4  # past the end: held
    want = [[fleetx_vit(t, **args)] * len(BASES) for t in range(steps + 1)]
    _assert_close(_run(scheduler, steps), want)
    if args != VIT_CASES[0]:  # each setting moves the schedule
        base = [fleetx_vit(t, **VIT_CASES[0]) for t in range(steps + 1)]
        assert max(abs(b - w[0]) for b, w in zip(base, want)) > 1e-4


def test_fleetx_vit_resumed_and_bad_arguments():
    args = dict(learning_rate=0.2, total_steps=10, warmup_steps=3)
    scheduler = ViTLRScheduler(_optimizer(lr=0.7), **args, last_epoch=1)
    assert [g["initial_lr"] for g in scheduler.optimizer.param_groups] == [0.2, 0.2]
    assert scheduler.base_lrs == [0.2, 0.2]
    want = [[fleetx_vit(t, **args)] * len(BASES) for t in range(2, 13)]
    _assert_close(_run(scheduler, 10), want)
    with pytest.raises(ValueError, match="decay_type"):
        ViTLRScheduler(_optimizer(), 0.2, 10, decay_type="step")
    with pytest.raises(ValueError, match="total_steps"):
        ViTLRScheduler(_optimizer(), 0.2, 0)
