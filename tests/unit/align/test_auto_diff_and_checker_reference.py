"""auto_diff and the parameter checkers against references known by construction: tiny
hand-built torch models with differences planted on purpose, numbers worked out by hand."""

from __future__ import annotations

import importlib

import pytest
import torch
from align_dumps import write_params
from torch import nn

from libai.align.auto_diff import auto_diff
from libai.align.checker import check_weights
from libai.align.dump_format import (
    step_dir,
)
from libai.align.recorder import create_model
from libai.align.tree_log import HERE

# the package re-exports the function under the module's name
auto_diff_module = importlib.import_module("libai.align.auto_diff")
DEFAULT_CONF = "compare_mode=strict atol=1e-06 rtol=1e-05"


# ---------------------------------------------------------------------------- helpers


def _linear(w=(1.0, -2.0), b=0.5) -> nn.Linear:
    """``y = w . x + b`` with known numbers."""
    lin = nn.Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([list(w)]))
        lin.bias.fill_(b)
    return lin


def _params(bias=0.5, head=4.0):
    return {
        "fc.weight": ("model.fc.weight", torch.tensor([[1.0, 2.0]]), None),
        "fc.bias": ("model.fc.bias", torch.tensor([bias]), None),
        "head.weight": ("model.head.weight", torch.tensor([[head]]), None),
    }


# ------------------------------------------------------------------------------ auto_diff


def test_run_step_default_is_forward_without_autograd(tmp_path):
    """A forward-only step (backward=False) with the default single_step runs its forward
    with autograd off, as torch.no_grad would; the reference is plain torch's grad mode."""
    rec = create_model(_linear(), "base")
    seen = {}

    def loss_fn(out):
        seen["grad_mode"] = torch.is_grad_enabled()
        seen["requires_grad"] = out.requires_grad
        return out.mean()

    try:
        auto_diff_module._run_step(
            rec, {"input": torch.ones(1, 2)}, loss_fn, None, str(tmp_path), False
        )
    finally:
        rec.close()
    assert seen == {"grad_mode": False, "requires_grad": False}
    assert torch.is_grad_enabled()


def test_loss_fns_not_a_pair_is_named_in_the_error(tmp_path):
    """A bad ``loss_fns`` raises a TypeError naming the ``loss_fns`` argument."""
    with pytest.raises(TypeError, match=r"^loss_fns must be a pair \(base, raw\), got function"):
        auto_diff(
            _linear(),
            _linear(),
            ({"input": torch.ones(1, 2)}, {"input": torch.ones(1, 2)}),
            loss_fns=lambda out: out.mean(),
            dump_root=str(tmp_path),
        )


def test_weights_check_uses_the_given_tolerances(tmp_path, capsys):
    """Planted optimizer difference: base SGD lr 0.1, raw lr 0.101, input x = (1, 3),
    loss = y.mean() so dL/dw = x = (1, 3) and dL/db = 1 (by hand). Grads agree; the updated
    weights differ by 0.001 * (1, 3, 1), max 0.003: within atol=0.01, beyond atol=0.001."""
    x = torch.tensor([[1.0, 3.0]])
    for atol, expected in ((0.01, True), (0.001, False)):
        base, raw = _linear(), _linear(w=(7.0, 7.0), b=7.0)  # auto_init copies base over raw
        opts = (
            torch.optim.SGD(base.parameters(), lr=0.1),
            torch.optim.SGD(raw.parameters(), lr=0.101),
        )
        root = str(tmp_path / f"atol_{atol}")
        ok = auto_diff(
            base, raw, ({"input": x}, {"input": x}), optimizers=opts, atol=atol, dump_root=root
        )
        assert ok is expected
        # plain torch reference of the updated weights
        w0 = torch.tensor([[1.0, -2.0]])
        torch.testing.assert_close(base.weight.detach(), w0 - 0.1 * x)
        torch.testing.assert_close(raw.weight.detach(), w0 - 0.101 * x)
        out = capsys.readouterr().out
        verdict = "ok" if expected else "DIFF"
        conf = f"compare_mode=strict atol={atol:g} rtol=1e-05"
        assert f"[libai.align] grads step 0 rank 0: ok ({conf})" in out
        assert f"[libai.align] weights step 0 rank 0: {verdict} ({conf})" in out


def test_user_recorders_come_back_without_single_step_state(tmp_path):
    """After a single_step run the caller's recorders are left as a fresh recorder is:
    no longer keeping inputs / output grads and not fed from another recorder."""
    x = torch.tensor([[1.0, 3.0]])
    base, raw = create_model(_linear(), "base"), create_model(_linear(), "raw")
    fresh = create_model(_linear(), "fresh")
    try:
        ok = auto_diff(
            base, raw, ({"input": x}, {"input": x}), single_step=True, dump_root=str(tmp_path)
        )
        assert ok is True
        for rec in (base, raw):
            assert (rec._keep_io, rec._feed) == (fresh._keep_io, fresh._feed)
    finally:
        for rec in (base, raw, fresh):
            rec.close()


# ------------------------------------------------------------------------ parameter checks


def test_weights_summary_log_and_title_by_hand(tmp_path, capsys):
    """Planted: fc.bias 0.5 vs 0.75 (max_abs 0.25, max_rel 0.25/0.75), head.weight 4 vs 5
    (max_abs 1, max_rel 0.2); fc.weight equal. The printed summary, one item a line, and the
    log rows are written out by hand."""
    a_dir, b_dir = step_dir(str(tmp_path), "a", 0, 0), step_dir(str(tmp_path), "b", 0, 0)
    write_params(a_dir, _params(), grads=False)
    write_params(b_dir, _params(bias=0.75, head=5.0), grads=False)
    assert check_weights(str(tmp_path / "a"), str(tmp_path / "b")) is False
    log_path = str(tmp_path / "align_log" / "weights_step_0_rank_0.log")
    assert capsys.readouterr().out.splitlines() == [
        f"[libai.align] weights step 0 rank 0: DIFF ({DEFAULT_CONF})",
        f"  A: {a_dir}",
        f"  B: {b_dir}",
        "  weights: DIFF in 2 of 3 parameters; first key 'fc.bias'",
        "    A: model.fc.bias",
        "    B: model.fc.bias",
        "      max_abs=0.25 max_rel=0.3333",
        "      A: shape [1] float32  mean=0.5 std=0 min=0.5 max=0.5",
        "      B: shape [1] float32  mean=0.75 std=0 min=0.75 max=0.75",
        "    also 'head.weight' (A: model.head.weight, B: model.head.weight): "
        "DIFF max_abs=1 max_rel=0.2",
        f"  log: {log_path}",
    ]
    with open(log_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    rows = lines[lines.index("[weights]") + 1 :]
    assert rows == [
        "fc.weight  A: model.fc.weight  |  B: model.fc.weight   [ok]",
        f"fc.bias  A: model.fc.bias  |  B: model.fc.bias   [DIFF max_abs=0.25 max_rel=0.3333]  {HERE}",
        "head.weight  A: model.head.weight  |  B: model.head.weight   [DIFF max_abs=1 max_rel=0.2]",
    ]


def test_weights_ok_title_and_lone_key_names_its_parameter(tmp_path, capsys):
    """Equal weights print the verdict ``ok``; across models (rename rules) a key only side A
    has is listed in the log with its parameter name."""
    a_dir, b_dir = step_dir(str(tmp_path), "a", 0, 0), step_dir(str(tmp_path), "b", 0, 0)
    params_b = _params()
    del params_b["head.weight"]
    write_params(a_dir, _params(), rename="Tiny", grads=False)
    write_params(b_dir, params_b, rename="TinyPort", grads=False)
    assert check_weights(str(tmp_path / "a"), str(tmp_path / "b")) is True
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"[libai.align] weights step 0 rank 0: ok ({DEFAULT_CONF})"
    assert out[3] == "  weights: ok (2 parameters compared)"
    with open(tmp_path / "align_log" / "weights_step_0_rank_0.log", encoding="utf-8") as f:
        text = f.read()
    assert "  side A only: 'head.weight' (model.head.weight)" in text.splitlines()
