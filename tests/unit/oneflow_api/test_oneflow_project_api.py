"""OneFlow's API for LiBai project code (libai.oneflow_api): each mapped name against what
OneFlow computes (a formula, or the torch call OneFlow's docs give as its equal), the
import scope (project code only, never shadowing ``oneflow`` elsewhere), and the one-line
errors. Multi-rank placements: tests/distributed/test_oneflow_api_placements.py."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate, Shard

from libai.oneflow_api import UnmappedOneFlowImport, UnmappedOneFlowName, project_module
from libai.oneflow_api.fused import FUSED_OPS
from libai.oneflow_api.global_tensors import Placement

flow = project_module("oneflow")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- names ------------------------------------------------------------------------------------


def test_dtypes_modules_and_classes_are_torchs():
    assert (flow.long, flow.float, flow.bool, flow.int, flow.float16) == (
        torch.int64,
        torch.float32,
        torch.bool,
        torch.int32,
        torch.float16,
    )
    assert flow.nn.Module is torch.nn.Module and flow.nn.Linear is torch.nn.Linear
    assert flow.nn.functional.gelu is F.gelu and flow.nn.init.normal_ is torch.nn.init.normal_
    assert flow.utils.data.Dataset is torch.utils.data.Dataset
    assert flow.linalg.norm is torch.linalg.norm and flow.Tensor is torch.Tensor
    assert flow.cat is torch.cat and flow.no_grad is torch.no_grad


def test_optimizers_are_libais_oneflow_flavoured_ones():
    from libai.optim import oneflow_optim

    assert flow.optim.AdamW is oneflow_optim.AdamW and flow.optim.LAMB is oneflow_optim.LAMB
    assert flow.optim.SGD is torch.optim.SGD
    assert flow.optim.lr_scheduler.CosineAnnealingLR is torch.optim.lr_scheduler.CosineAnnealingLR


def test_sbp_names_are_dtensor_placements():
    assert flow.sbp.split(1) == Shard(1)
    assert flow.sbp.broadcast == Replicate() and flow.sbp.partial_sum == Partial()


def test_an_unmapped_name_is_one_line_naming_it():
    with pytest.raises(UnmappedOneFlowName) as err:
        flow.mock_torch  # noqa: B018 (OneFlow's, no torch counterpart)
    message = str(err.value)
    assert "oneflow.mock_torch (used at " in message and "\n" not in message
    assert not hasattr(flow.nn, "NoSuchLayer")
    with pytest.raises(UnmappedOneFlowImport, match="oneflow.utils.data.NoSuchLoader"):
        project_module("oneflow.utils.data", ("Dataset", "NoSuchLoader"))


@pytest.mark.not_under_mutation(reason="the mutation tool's trampoline is the calling frame")
def test_an_unmapped_name_names_the_line_that_used_it():
    with pytest.raises(UnmappedOneFlowName) as err:
        flow.mock_torch  # noqa: B018
    assert f"(used at {__file__}:" in str(err.value)


# ---- tensors ----------------------------------------------------------------------------------


def test_creation_takes_sbp_and_placement_and_keeps_the_values():
    """One process: the arguments describe the whole tensor, which this rank holds; a plain
    tensor's placement puts the new one on its device."""
    labels = flow.tensor([3, 1, 2], dtype=flow.long)
    assert labels.dtype == torch.int64 and labels.tolist() == [3, 1, 2]
    use_row = flow.tensor([0, 2], sbp=labels.sbp, placement=labels.placement)
    assert use_row.tolist() == [0, 2] and use_row.device == labels.device
    eye = flow.eye(3, sbp=[flow.sbp.broadcast, flow.sbp.broadcast], placement=None)
    torch.testing.assert_close(eye, torch.eye(3))
    ar = flow.arange(1, 7, 2, sbp=[], placement=Placement("cpu", [0]), dtype=flow.float)
    assert ar.tolist() == [1.0, 3.0, 5.0]


def test_plain_tensors_are_their_own_local_view():
    x = randn(2, 3)
    assert x.to_global(sbp=[flow.sbp.partial_sum, flow.sbp.broadcast]) is x
    assert flow.to_global(x, placement=x.placement) is x
    assert x.to_local() is x and x.to_consistent() is x
    assert x.sbp == () and not x.is_global
    assert x.placement == Placement("cpu", [0], device="cpu")


def test_placement_checks_its_device_type_and_spans_the_run():
    assert Placement("cpu", [[0, 1], [2, 3]]).ranks == (0, 1, 2, 3)
    assert Placement.all("cpu").ranks == (0,)
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        Placement("npu", [0])


def test_save_and_load_take_data_and_refuse_code(tmp_path):
    data = {"ids": torch.arange(4), "names": ["a", "b"], "scale": 0.5}
    flow.save(data, tmp_path / "data.pt")
    back = flow.load(tmp_path / "data.pt")
    assert back["names"] == ["a", "b"] and back["ids"].tolist() == [0, 1, 2, 3]

    flow.save([Placement("cpu", [0])], tmp_path / "objects.pt")  # a class: code to unpickle
    with pytest.raises(ValueError, match="holds Python objects") as err:
        flow.load(tmp_path / "objects.pt")
    assert "\n" not in str(err.value) and "Placement" in str(err.value)


# ---- oneflow._C --------------------------------------------------------------------------------


def test_fused_ops_equal_their_formulas():
    x, y, bias = randn(2, 3, 4), randn(2, 4, 5, seed=1), randn(4, seed=2)
    C = flow._C
    assert C.amp_white_identity(x) is x and C.amp_black_identity(x) is x
    torch.testing.assert_close(
        C.matmul(x, y.transpose(1, 2), transpose_b=True, alpha=2.0), 2 * x @ y
    )
    torch.testing.assert_close(C.matmul(x.transpose(1, 2), y, transpose_a=True), x @ y)
    w, ids = randn(10, 4, seed=3), torch.tensor([[1, 9], [0, 1]])
    torch.testing.assert_close(C.gather(w, ids, axis=0), w[ids])
    torch.testing.assert_close(C.gather(w, torch.tensor([3, 0]), axis=1), w[:, [3, 0]])
    torch.testing.assert_close(C.fused_bias_add_dropout(x, bias, p=0.0, axis=2), x + bias)
    mid = randn(3, seed=4)
    torch.testing.assert_close(
        C.fused_bias_add_dropout(x, mid, p=0.0, axis=1), x + mid[None, :, None]
    )
    erf_gelu = 0.5 * (x + bias) * (1 + torch.erf((x + bias) / math.sqrt(2)))
    torch.testing.assert_close(C.fused_bias_add_gelu(x, bias, axis=2), erf_gelu)
    torch.testing.assert_close(C.quick_gelu(x), x / (1 + torch.exp(-1.702 * x)))
    tanh_gelu = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(C.fused_fast_gelu_mul(x, y[:, :3, :4]), tanh_gelu * y[:, :3, :4])


def test_norms_equal_their_formulas():
    x, w, b = randn(2, 3, 4), randn(4, seed=1), randn(4, seed=2)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    normed = (x - mean) / torch.sqrt(var + 1e-5)
    torch.testing.assert_close(
        flow._C.layer_norm_affine(x, w, b, begin_norm_axis=2, begin_params_axis=2, epsilon=1e-5),
        normed * w + b,
    )
    torch.testing.assert_close(flow._C.layer_norm(x, begin_norm_axis=-1, epsilon=1e-5), normed)
    rms = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(flow._C.rms_norm(x, w, (4,), 1e-6), rms)
    half = flow._C.rms_norm(x.half(), w.half(), (4,), 1e-6)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), rms, atol=2e-3, rtol=2e-3)


def test_cross_entropy_on_one_process_is_torchs():
    """(Over several ranks it is the global batch's mean: tests/distributed.)"""
    logits, labels = randn(6, 4), torch.tensor([0, 3, 1, 1, 2, 0])
    weight = torch.tensor([0.5, 1.0, 2.0, 1.5])
    for kwargs in ({}, {"ignore_index": 0}, {"weight": weight}, {"label_smoothing": 0.1}):
        want = F.cross_entropy(logits, labels, **kwargs)
        torch.testing.assert_close(flow._C.cross_entropy(logits, labels, **kwargs), want)
        torch.testing.assert_close(flow.nn.functional.cross_entropy(logits, labels, **kwargs), want)
        torch.testing.assert_close(flow.nn.CrossEntropyLoss(**kwargs)(logits, labels), want)
    assert issubclass(flow.nn.CrossEntropyLoss, torch.nn.CrossEntropyLoss)


def test_losses_and_masks_equal_their_formulas():
    logits, labels = randn(5, 3), torch.tensor([0, 2, 1, 1, 0])
    per_row = -logits.log_softmax(-1)[torch.arange(5), labels]
    torch.testing.assert_close(flow._C.sparse_softmax_cross_entropy(logits, labels), per_row)
    torch.testing.assert_close(flow._C.cross_entropy(logits, labels), per_row.mean())
    scores = randn(2, 3, 3)
    got = flow._C.fused_scale_tril(scores, diagonal=0, fill_value=-9.0, scale=0.5)
    want = torch.where(torch.ones(3, 3).tril().bool(), scores * 0.5, torch.tensor(-9.0))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(flow._C.transpose(scores, perm=(2, 0, 1)), scores.permute(2, 0, 1))
    assert flow._C.global_arange(0, 4, sbp=[], placement=None).tolist() == [0, 1, 2, 3]


def test_every_fused_op_is_tested_here():
    source = Path(__file__).read_text(encoding="utf-8")
    untested = [name for name in FUSED_OPS if f"C.{name}(" not in source]
    assert untested == ["relu", "softmax"]  # torch's own functions, given as they are


# ---- the import scope --------------------------------------------------------------------------

_SCOPE = """
import sys, types
sys.path.insert(0, {root!r})
from libai.config import LazyConfig

# a LiBai checkout: a config importing a project module that imports oneflow (one of them
# lazily, inside a function, after the config has loaded)
LazyConfig.load({config!r})
import projects.demo.model as model
print("project", model.flow.__name__, model.Dataset is __import__("torch").utils.data.Dataset)
print("lazy", model.lazy().__name__)
try:
    import oneflow  # not project code: Python's own machinery, no oneflow installed here
except ModuleNotFoundError as e:
    print("outside", e.name)
print("in sys.modules", "oneflow" in sys.modules)
"""


def test_oneflow_is_mapped_for_project_code_only(tmp_path):
    project = tmp_path / "projects" / "demo"
    project.mkdir(parents=True)
    (project / "model.py").write_text(
        textwrap.dedent(
            """
            import oneflow as flow
            from oneflow.utils.data import Dataset

            def lazy():
                import oneflow.nn as nn
                return nn
            """
        )
    )
    (tmp_path / "config.py").write_text("from projects.demo import model\nx = dict(a=1)\n")
    code = _SCOPE.format(root=str(tmp_path), config=str(tmp_path / "config.py"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines == [
        "project oneflow True",
        "lazy oneflow.nn",
        "outside oneflow",
        "in sys.modules False",
    ]


# ---- OneFlow's WarmupLR, NumPy's removed aliases -------------------------------------------------


def _lrs(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _sgd(lr=0.001):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_warmup_lr_equals_onflows_documented_examples():
    """OneFlow's WarmupLR docstring: constant 0.5 for 5 steps then 0.001; linear from
    0.0005 by 0.0001 a step; with a wrapped scheduler the warmup rises to its factor."""
    constant = flow.optim.lr_scheduler.WarmUpLR(
        _sgd(), warmup_factor=0.5, warmup_iters=5, warmup_method="constant"
    )
    assert _lrs(constant, 7) == pytest.approx([0.0005] * 5 + [0.001] * 2)
    linear = flow.optim.lr_scheduler.WarmupLR(
        _sgd(), warmup_factor=0.5, warmup_iters=5, warmup_method="linear"
    )
    assert _lrs(linear, 7) == pytest.approx([0.0005, 0.0006, 0.0007, 0.0008, 0.0009, 0.001, 0.001])
    opt = _sgd()
    cosine = flow.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    wrapped = flow.optim.lr_scheduler.WarmupLR(cosine, warmup_factor=0.0, warmup_iters=4)

    def cos(t):
        return 0.001 * 0.5 * (1 + math.cos(math.pi * t / 10))

    want = [cos(4) * t / 4 for t in range(4)] + [cos(t) for t in range(4, 12)]
    assert _lrs(wrapped, 12) == pytest.approx(want)
    prefixed = flow.optim.lr_scheduler.WarmupLR(
        flow.optim.lr_scheduler.CosineAnnealingLR(_sgd(), T_max=10),
        warmup_factor=0.0,
        warmup_iters=4,
        warmup_prefix=True,
    )
    want = [0.001 * t / 4 for t in range(4)] + [cos(t - 4) for t in range(4, 12)]
    assert _lrs(prefixed, 12) == pytest.approx(want)


def test_warmup_lr_resumes_from_plain_data(tmp_path):
    cosine = flow.optim.lr_scheduler.CosineAnnealingLR(_sgd(), T_max=10)
    first = flow.optim.lr_scheduler.WarmupLR(cosine, warmup_factor=0.1, warmup_iters=3)
    _lrs(first, 5)
    torch.save(first.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)  # no objects inside
    second = flow.optim.lr_scheduler.WarmupLR(
        flow.optim.lr_scheduler.CosineAnnealingLR(_sgd(), T_max=10),
        warmup_factor=0.1,
        warmup_iters=3,
    )
    second.load_state_dict(state)
    assert _lrs(second, 4) == pytest.approx(_lrs(first, 4))
    with pytest.raises(ValueError, match="'linear' or 'constant'"):
        flow.optim.lr_scheduler.WarmupLR(_sgd(), warmup_method="cosine")


def test_numpy_of_project_code_has_the_removed_aliases():
    import numpy

    from libai.oneflow_api.imports import project_numpy

    np = project_numpy("numpy")
    assert np.float is float and np.int is int and np.object is object
    assert np.bool is numpy.bool  # (NumPy 2 has its own again: that one)
    assert np.arange is numpy.arange and np.random is numpy.random
    assert np.arange(3, dtype=np.float).dtype == numpy.float64
    assert not hasattr(numpy, "float")  # numpy itself is unchanged
