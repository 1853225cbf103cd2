"""Every LR schedule of libai.scheduler through the LiBai door: a user config file that sets
``train.scheduler``. The learning rate equals the closed form written in this file (≤1e-12)
at every iteration, through the warmup ramp, the decay, the floor and after it.

Cosine (with and without warmup, ``train.warmup_ratio`` rounded up to iterations) and
multi-step run the whole door, ``tools/train_net.py``, and read the LR ``metrics.json``
records. The other schedules differ only in the object the same builder makes: they are
built from the same user config file by ``DefaultTrainer.build_lr_scheduler``, the door's own
builder, in this process (each schedule's every setting, alone, is in
tests/unit/optim/test_scheduler_formulas.py)."""

from __future__ import annotations

import bisect
import math
import textwrap

import pytest
from train_net_helpers import ROOT, TINY, read_metrics, run_train_net

ITERS = 12
BASE_LR = 0.01


def warmup(t, factor, steps, method="linear"):
    if t >= steps:
        return 1.0
    if method == "constant":
        return factor
    return factor * (1 - t / steps) + t / steps


def cosine(t, factor, steps, alpha):
    progress = min(1.0, max(0.0, (t - steps) / max(1, ITERS - steps)))
    decay = (1 - alpha) * 0.5 * (1 + math.cos(math.pi * progress)) + alpha
    return BASE_LR * warmup(t, factor, steps) * decay


def multistep(t, factor, steps, milestones, gamma):
    return BASE_LR * warmup(t, factor, steps) * gamma ** bisect.bisect_right(milestones, t)


def user_config(tmp_path, scheduler: str):
    """A user config file that swaps ``scheduler`` (a LazyCall expression) into the GPT-2
    pretraining config, as a LiBai user does."""
    config = tmp_path / "my_config.py"
    config.write_text(
        textwrap.dedent(
            f"""
            from libai.config import LazyCall, LazyConfig
            from libai.scheduler import (
                WarmupCosineAnnealingLR, WarmupCosineLR, WarmupExponentialLR, WarmupLinearLR,
                WarmupMultiStepLR, WarmupPolynomialLR, WarmupStepLR,
            )

            _base = LazyConfig.load({str(ROOT / "configs" / "gpt2_pretrain.py")!r})
            model, graph, optim = _base.model, _base.graph, _base.optim
            dataloader, tokenization, train = _base.dataloader, _base.tokenization, _base.train
            train.scheduler = {scheduler}
            """
        )
    )
    return config


def recorded_lrs(tmp_path, sample_env, scheduler: str, warmup_ratio: float) -> list[float]:
    """Train ITERS iterations with the user config; the LR metrics.json records per
    iteration."""
    config = user_config(tmp_path, scheduler)
    out = tmp_path / "out"
    opts = [
        *TINY,
        f"train.output_dir={out}",
        f"train.train_iter={ITERS}",
        f"train.warmup_ratio={warmup_ratio}",
        f"optim.lr={BASE_LR}",
        "train.evaluation.enabled=False",
        "train.checkpointer.period=1000",
    ]
    run_train_net(config, opts, env=sample_env)
    metrics = read_metrics(out)
    return [metrics[t]["lr"] for t in range(ITERS)]


@pytest.mark.parametrize("alpha, ratio", [(0.01, 0.25), (0.3, 0.0)])
def test_warmup_cosine_equals_its_formula(tmp_path, sample_env, alpha, ratio):
    scheduler = f"LazyCall(WarmupCosineLR)(warmup_factor=0.1, alpha={alpha})"
    got = recorded_lrs(tmp_path, sample_env, scheduler, ratio)
    steps = math.ceil(ITERS * ratio)
    want = [cosine(t, 0.1, steps, alpha) for t in range(ITERS)]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-12, (got, want)


def test_warmup_multistep_equals_its_formula(tmp_path, sample_env):
    scheduler = "LazyCall(WarmupMultiStepLR)(warmup_factor=0.2, milestones=[5, 9], gamma=0.5)"
    got = recorded_lrs(tmp_path, sample_env, scheduler, 2 / ITERS)
    want = [multistep(t, 0.2, 2, [5, 9], 0.5) for t in range(ITERS)]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-12, (got, want)


W = 3  # warmup iterations of the cases below (warmup_ratio 3 / ITERS)
SPAN = ITERS - W


def after(t):
    """Iterations since the warmup ended (0 during it)."""
    return max(0, t - W)


#: scheduler expression -> the LR at iteration t, written out (base LR x warmup x decay)
CASES = {
    "cosine_annealing": (
        "LazyCall(WarmupCosineAnnealingLR)(warmup_factor=0.1, eta_min=0.002)",
        lambda t: (
            warmup(t, 0.1, W)
            * (0.002 + (BASE_LR - 0.002) * 0.5 * (1 + math.cos(math.pi * after(t) / SPAN)))
        ),
    ),
    "linear": (
        "LazyCall(WarmupLinearLR)(warmup_factor=0.1, end_factor=0.25)",
        lambda t: BASE_LR * warmup(t, 0.1, W) * (1 - 0.75 * min(1, after(t) / SPAN)),
    ),
    "step": (
        "LazyCall(WarmupStepLR)(warmup_factor=0.1, step_size=4, gamma=0.3)",
        lambda t: BASE_LR * warmup(t, 0.1, W) * 0.3 ** (t // 4),
    ),
    "polynomial": (
        "LazyCall(WarmupPolynomialLR)(warmup_factor=0.1, end_learning_rate=0.001, power=2.0)",
        lambda t: (
            warmup(t, 0.1, W) * ((BASE_LR - 0.001) * (1 - min(after(t), SPAN) / SPAN) ** 2 + 0.001)
        ),
    ),
    "exponential": (
        "LazyCall(WarmupExponentialLR)(warmup_factor=0.1, gamma=0.8)",
        lambda t: BASE_LR * warmup(t, 0.1, W) * 0.8 ** after(t),
    ),
    "constant_warmup": (
        "LazyCall(WarmupCosineLR)(warmup_factor=0.3, warmup_method='constant')",
        lambda t: cosine(t, 0.3, W, 0.0) / warmup(t, 0.3, W) * warmup(t, 0.3, W, "constant"),
    ),
}


def built_lrs(tmp_path, scheduler: str) -> list[float]:
    """The LR of each of ITERS iterations from the scheduler the door builds out of the user
    config (``train.train_iter`` ITERS, ``train.warmup_iter`` W, ``optim.lr`` BASE_LR)."""
    import torch

    from libai.config import LazyConfig
    from libai.engine import DefaultTrainer

    cfg = LazyConfig.load(str(user_config(tmp_path, scheduler)))
    cfg.train.train_iter, cfg.train.warmup_iter = ITERS, W
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    scheduler = DefaultTrainer.build_lr_scheduler(cfg, optimizer)
    lrs = []
    for _ in range(ITERS):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("case", list(CASES))
def test_every_other_schedule_equals_its_formula(tmp_path, case):
    """The rest of libai.scheduler from a user config: each parameter set away from its
    default, so ignoring it changes the LR."""
    scheduler, formula = CASES[case]
    got = built_lrs(tmp_path, scheduler)
    want = [formula(t) for t in range(ITERS)]
    assert max(abs(g - w) for g, w in zip(got, want)) <= 1e-12, (got, want)
