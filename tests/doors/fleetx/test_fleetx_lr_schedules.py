"""FleetX's LR schedules through the YAML door: the learning rate the Engine reports at
every optimizer step equals PaddleFleetX's closed form (``ppfleetx/optims/lr_scheduler.py``,
written out in this file) to 1e-12, through warmup (an unrounded warmup length), the
decay, the floor and the steps after the decay ends; and each setting moves the numbers."""

from __future__ import annotations

import math

import pytest
from engine_helpers import RecordingModule, make_engine, simple_cfg
from omegaconf import OmegaConf

STEPS = 12


def fleetx_cosine(t, max_lr, min_lr, warmup_rate, decay_steps):
    warmup = warmup_rate * decay_steps
    if warmup > 0 and t <= warmup:
        return max_lr * t / warmup
    if t > decay_steps:
        return min_lr
    ratio = (t - warmup) / (decay_steps - warmup)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)


def fleetx_linear(t, learning_rate, total_steps, warmup):
    steps = warmup if isinstance(warmup, int) else int(math.floor(warmup * total_steps))
    if t < steps:
        return learning_rate * t / max(1, steps)
    return learning_rate * max(0.0, 1.0 - t / total_steps)


def reported_lrs(tmp_path, lr_section) -> list[float]:
    """The LR of every step of a SimpleNet run with ``Optimizer.lr = lr_section`` (a section
    or a bare number)."""
    cfg = simple_cfg(
        tmp_path, f"Engine.max_steps={STEPS}", "Engine.num_train_epochs=6", "Engine.logging_freq=1"
    )
    cfg.Engine.eval_freq = 10 * STEPS
    cfg.Optimizer.lr = OmegaConf.create(lr_section) if isinstance(lr_section, dict) else lr_section
    engine = make_engine(cfg, module_cls=RecordingModule)
    engine.fit()
    ends = [p for name, p in engine.module.calls if name == "training_step_end"]
    assert len(ends) == STEPS
    return [p["lr"] for p in ends]


COSINE = dict(max_lr=0.1, min_lr=0.01, warmup_rate=0.3, decay_steps=8)  # warmup 2.4 steps


@pytest.mark.parametrize(
    "change", [{}, {"warmup_rate": 0.0}, {"min_lr": 0.0}, {"decay_steps": 12}, {"max_lr": 0.2}]
)
def test_cosine_with_warmup_decay_equals_fleetx(tmp_path, change):
    args = {**COSINE, **change}
    got = reported_lrs(tmp_path, {"name": "CosineAnnealingWithWarmupDecay", **args})
    want = [fleetx_cosine(t, **args) for t in range(STEPS)]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-12, (got, want)
    if change:  # each setting changes the schedule (so ignoring it cannot pass)
        base = [fleetx_cosine(t, **COSINE) for t in range(STEPS)]
        assert max(abs(b - w) for b, w in zip(base, want)) > 1e-4


@pytest.mark.parametrize("absent", ["min_lr", "warmup_rate"])
def test_cosine_without_min_lr_or_warmup_rate_takes_zero(tmp_path, absent):
    """FleetX's class requires ``min_lr`` and ``warmup_rate``; absent here
    (docs/integrate_a_model.md), each is 0: a floor of 0 (torch's ``eta_min`` default), no
    warmup."""
    args = {k: v for k, v in COSINE.items() if k != absent}
    got = reported_lrs(tmp_path, {"name": "CosineAnnealingWithWarmupDecay", **args})
    want = [fleetx_cosine(t, **{absent: 0.0}, **args) for t in range(STEPS)]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-12, (got, want)


@pytest.mark.parametrize("warmup", [0, 3, 0.25])
def test_linear_decay_with_warmup_equals_fleetx(tmp_path, warmup):
    section = dict(name="LinearDecayWithWarmup", learning_rate=0.1, total_steps=10, warmup=warmup)
    got = reported_lrs(tmp_path, section)
    want = [fleetx_linear(t, 0.1, 10, warmup) for t in range(STEPS)]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-12, (got, want)


@pytest.mark.parametrize("section", [{"name": "Constant", "learning_rate": 0.03}, 0.03])
def test_constant_learning_rate(tmp_path, section):
    """``Optimizer.lr: {name: Constant, learning_rate: x}`` or a bare number: x at every step."""
    assert reported_lrs(tmp_path, section) == [0.03] * STEPS
