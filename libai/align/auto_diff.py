"""``auto_diff``: run two models on the same data, dump both and compare them."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

import torch

from libai.align import checker
from libai.align.assign import assign_weight
from libai.align.compare import COMPARE_MODES
from libai.align.hooks import flatten_tensors
from libai.align.recorder import ModelRecorder, create_model

PHASES = ("both", "forward", "backward")


def default_loss(output) -> torch.Tensor:
    """The first floating tensor of ``output``, averaged to a scalar."""
    for t in flatten_tensors(output):
        if t.is_floating_point():
            return t.float().mean()
    raise TypeError(f"the model output {type(output).__name__} holds no floating tensor")


def _pair(value, what: str, check) -> tuple:
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise TypeError(f"{what} must be a pair (base, raw), got {type(value).__name__}")
    for v in value:
        check(v)
    return tuple(value)


def _check_inputs(inputs) -> tuple[Mapping, Mapping]:
    def is_dict(v):
        if not isinstance(v, Mapping):
            raise TypeError(
                f"inputs must be a pair of dicts (base kwargs, raw kwargs), got a pair with "
                f"{type(v).__name__}"
            )

    return _pair(inputs, "inputs", is_dict)


def _check_callable(v):
    if not callable(v):
        raise TypeError(f"expected a callable, got {type(v).__name__}")


def _check_optimizer(v):
    if not hasattr(v, "step") or not hasattr(v, "zero_grad"):
        raise TypeError(f"expected an optimizer (step / zero_grad), got {type(v).__name__}")


def _as_recorder(model, name: str) -> tuple[ModelRecorder, bool]:
    if isinstance(model, ModelRecorder):
        return model, False
    return create_model(model, name), True


def auto_diff(
    base_model,
    raw_model,
    inputs,
    loss_fns=None,
    optimizers=None,
    *,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    auto_init: bool = True,
    compare_mode: str = "strict",
    diff_phase: str = "both",
    single_step: bool = False,
    steps: int = 1,
    dump_root: str | None = None,
) -> bool:
    """Run ``base_model`` and ``raw_model`` (modules or recorders from ``create_model``) for
    ``steps`` steps on ``inputs = (base_kwargs, raw_kwargs)``, dump both and compare: the
    forward outputs and input gradients of every matched module, the parameter gradients, and
    with ``optimizers = (base_opt, raw_opt)`` the weights after each step. Returns whether
    everything agrees; the first difference of each check is printed with its tree log.

    Args:
        loss_fns: ``(base_fn, raw_fn)`` mapping a model output to a scalar loss (default: the
            mean of the first floating output tensor).
        auto_init: copy the base weights into the raw model first (:func:`assign_weight`).
        single_step: feed every raw module the base module's recorded inputs (forward) and
            output gradients (backward), so an error shows at its module and does not spread.
        diff_phase: ``"both"``, ``"forward"`` (no backward is run) or ``"backward"``.
        dump_root: where the dumps and logs go (default: a new temporary directory).

    Dropout must be off (``eval()`` or p=0) in both models for the runs to be comparable.
    Recorders created here are closed before returning, also when a step raises.
    """
    base_inputs, raw_inputs = _check_inputs(inputs)
    loss_fns = (
        (default_loss, default_loss)
        if loss_fns is None
        else _pair(loss_fns, "loss_fns", _check_callable)
    )
    if optimizers is not None:
        optimizers = _pair(optimizers, "optimizers", _check_optimizer)
    if diff_phase not in PHASES:
        raise ValueError(f"diff_phase must be one of {PHASES}, got {diff_phase!r}")
    if compare_mode not in COMPARE_MODES:
        raise ValueError(f"compare_mode must be one of {COMPARE_MODES}, got {compare_mode!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    root = dump_root or tempfile.mkdtemp(prefix="libai_align_")
    base, own_base = _as_recorder(base_model, "base")
    raw, own_raw = _as_recorder(raw_model, "raw")
    if base.name == raw.name:
        raise ValueError(f"both models are named {base.name!r}: give them different names")
    backward = diff_phase != "forward"
    try:
        if auto_init:
            assign_weight(base, raw)
        base._keep_io, raw._feed = single_step, base if single_step else None
        for _ in range(steps):
            for rec, kwargs, loss_fn, opt in zip(
                (base, raw),
                (base_inputs, raw_inputs),
                loss_fns,
                optimizers or (None, None),
            ):
                _run_step(rec, kwargs, loss_fn, opt, root, backward, single_step)
            for rec in (base, raw):
                rec.clear_report()
                rec.step += 1
    finally:
        base._keep_io, raw._feed = False, None
        for rec, own in ((base, own_base), (raw, own_raw)):
            if own:
                rec.close()
    cfg = {"atol": atol, "rtol": rtol, "compare_mode": compare_mode, "diff_phase": diff_phase}
    cfg["log_dir"] = os.path.join(root, "align_log")
    path_a, path_b = (os.path.join(root, rec.name) for rec in (base, raw))
    ok = checker.check_report(path_a, path_b, cfg)
    if backward:
        ok = checker.check_grads(path_a, path_b, cfg) and ok
    if optimizers is not None:
        ok = checker.check_weights(path_a, path_b, cfg) and ok
    print(f"auto_diff: {'PASS' if ok else 'FAIL'} (dumps and logs in {root})")
    return ok


def _run_step(
    rec: ModelRecorder,
    kwargs,
    loss_fn,
    optimizer,
    root: str,
    backward: bool,
    single_step: bool = False,
) -> None:
    """One recorded step of one model: forward, loss, backward, optimizer step, dumps (the
    step's gradients, which the optimizer step leaves in place, and the updated weights)."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        rec.model.zero_grad(set_to_none=True)
    # single_step feeds the base inputs through the differentiable-input taps, so the
    # forward runs with autograd on even when no backward follows
    with torch.set_grad_enabled(backward or single_step):
        output = rec(**kwargs)
        loss = loss_fn(output)
    if backward:
        rec.backward(loss)
    rec.dump_report(root)
    if backward:
        if optimizer is not None:
            optimizer.step()
        rec.dump_params(root)
    else:
        rec.dump_weights(root)
