"""Custom autocast op lists change the dtype of exactly the listed ops (CPU, fast)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from libai.runtime.amp_lists import TORCH_FUNCTIONS, AutocastOpLists, resolve_op_names

BLACK_KEY = "Engine.mix_precision.custom_black_list"


def _cpu_autocast_supports(dtype):
    try:
        with torch.autocast("cpu", dtype=dtype):
            return F.linear(torch.ones(2, 2), torch.ones(2, 2)).dtype == dtype
    except Exception:
        return False


LOW_DTYPES = [
    torch.bfloat16,
    pytest.param(
        torch.float16,
        marks=pytest.mark.skipif(
            not _cpu_autocast_supports(torch.float16), reason="no fp16 CPU autocast"
        ),
    ),
]


#: weights of the softmax outputs in the loss: a softmax's plain sum is 1 for every input,
#: its gradient exactly zero, and a test of it would only see rounding noise
SCORE = torch.linspace(-1.0, 1.0, 8)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.linear = nn.Linear(8, 8)

    def forward(self, ids):
        return (F.softmax(self.linear(self.embed(ids)), dim=-1) * SCORE).sum()


def run(lists: AutocastOpLists, low_dtype=torch.bfloat16, seed=0):
    """Forward + backward of Tiny; returns (model, {module: output dtype}, loss)."""
    torch.manual_seed(seed)
    model = Tiny()
    dtypes = {}
    for name in ("embed", "linear"):
        getattr(model, name).register_forward_hook(
            lambda m, i, o, name=name: dtypes.__setitem__(name, o.dtype)
        )
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    if lists is None:  # the fp32 reference: no autocast at all
        loss = model(ids)
    else:
        with torch.autocast("cpu", dtype=low_dtype), lists.mode("cpu", low_dtype):
            loss = model(ids)
    loss.backward()
    return model, dtypes, loss


def fp32_grads(seed=0) -> dict[str, torch.Tensor]:
    model, dtypes, _ = run(None, seed=seed)
    assert set(dtypes.values()) == {torch.float32}
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("low", LOW_DTYPES)
def test_defaults_without_lists(low):
    _, dtypes, _ = run(AutocastOpLists(), low)
    assert dtypes == {"embed": torch.float32, "linear": low}


@pytest.mark.parametrize("low", LOW_DTYPES)
@pytest.mark.parametrize("name", ["matmul", "matmul_v2", "mul", "linear"])
def test_black_linear_runs_fp32(name, low):
    model, dtypes, _ = run(AutocastOpLists(black=[name]), low)
    assert dtypes["linear"] == torch.float32
    want = fp32_grads()
    assert want["linear.weight"].abs().max() > 1e-3  # a loss with a real gradient
    # every op of the black-listed run is fp32: the gradients are the fp32 run's
    for n, p in model.named_parameters():
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, want[n], rtol=1e-5, atol=1e-7, msg=n)
    # control: without the list the linear runs in the low dtype, and its gradient moves
    default, _, _ = run(AutocastOpLists(), low)
    assert (default.linear.weight.grad - want["linear.weight"]).abs().max() > 1e-5


@pytest.mark.parametrize("low", LOW_DTYPES)
def test_white_embedding_runs_low(low):
    model, dtypes, _ = run(AutocastOpLists(white=["lookup_table_v2"]), low)
    assert dtypes["embed"] == low
    grad, want = model.embed.weight.grad, fp32_grads()["embed.weight"]
    assert grad.dtype == torch.float32 and want.abs().max() > 1e-3
    # the fp32 gradient to the low dtype's precision (bf16: 8 bits of mantissa)
    torch.testing.assert_close(grad, want, rtol=3e-2, atol=3e-2 * want.abs().max().item())


@pytest.mark.parametrize("low", LOW_DTYPES)
def test_black_sum_and_white_softmax(low):
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=low), AutocastOpLists(black=["reduce_sum"]).mode("cpu", low):
        assert x.to(low).sum().dtype == torch.float32
        assert torch.sum(x.to(low), dim=0).dtype == torch.float32
        assert x.to(low).mean().dtype == low  # not listed: unchanged
    with torch.autocast("cpu", dtype=low), AutocastOpLists(white=["softmax"]).mode("cpu", low):
        assert F.softmax(x, dim=-1).dtype == low
        assert x.softmax(-1).dtype == low
        assert F.log_softmax(x, dim=-1).dtype == torch.float32  # not listed: unchanged


def test_black_elementwise_and_operators():
    a, b = torch.randn(4, 4).bfloat16(), torch.randn(4, 4).bfloat16()
    lists = AutocastOpLists(black=["elementwise_div", "elementwise_add", "bmm", "pow"])
    with torch.autocast("cpu", dtype=torch.bfloat16), lists.mode("cpu", torch.bfloat16):
        assert (a / b).dtype == (1 / a).dtype == torch.div(a, b).dtype == torch.float32
        assert (a + b).dtype == (1 + a).dtype == torch.float32
        assert (a - b).dtype == (a * b).dtype == torch.bfloat16
        assert torch.bmm(a[None], b[None]).dtype == torch.float32
        assert (a**2).dtype == (2**a).dtype == torch.float32
        out = F.scaled_dot_product_attention(a[None], a[None], a[None])
        assert out.dtype == torch.bfloat16  # not listed


def test_kwargs_and_nested_sequences_are_cast():
    from libai.runtime.amp_lists import _cast

    a, i = torch.randn(2).bfloat16(), torch.tensor([1])
    cast = _cast((a, [a, (a, i)], 3), (torch.bfloat16,), torch.float32)
    assert [cast[0].dtype, cast[1][0].dtype, cast[1][1][0].dtype] == [torch.float32] * 3
    assert cast[1][1][1] is i and cast[2] == 3 and isinstance(cast[1][1], tuple)
    x, w = torch.randn(3, 4).bfloat16(), torch.randn(4, 4).bfloat16()
    with AutocastOpLists(black=["linear"]).mode("cpu", torch.bfloat16):
        assert F.linear(input=x, weight=w).dtype == torch.float32


def test_black_sdpa_via_paddle_name():
    q = torch.randn(1, 2, 4, 8).bfloat16()
    with AutocastOpLists(black=["flash_attn"]).mode("cpu", torch.bfloat16):
        assert F.scaled_dot_product_attention(q, q, q).dtype == torch.float32


def test_unknown_name_and_conflict():
    with pytest.raises(ValueError, match=r"Engine\.mix_precision\.custom_black_list.*softmax"):
        AutocastOpLists(black=["softmaxx"])
    with pytest.raises(ValueError, match="custom_white_list"):
        AutocastOpLists(white=["lookup_tabel"])
    with pytest.raises(ValueError, match="custom_black_list.*custom_white_list"):
        AutocastOpLists(black=["softmax"], white=["softmax"])
    with pytest.raises(ValueError, match="both"):
        AutocastOpLists(black=["matmul"], white=["linear"])  # Paddle matmul covers linear
    with pytest.raises(ValueError, match="my.key"):
        resolve_op_names(["nope_op"], "my.key")


def test_resolve_names():
    assert resolve_op_names(["lookup_table", "embedding"], BLACK_KEY) == {"embedding"}
    assert resolve_op_names(["c_softmax_with_cross_entropy"], BLACK_KEY) == {"cross_entropy"}
    assert resolve_op_names(["swish", "fused_attention"], BLACK_KEY) == {
        "silu",
        "scaled_dot_product_attention",
    }
    assert "linear" in resolve_op_names(["matmul"], BLACK_KEY)
    assert resolve_op_names([], BLACK_KEY) == frozenset()


def test_table_callables_are_what_the_mode_receives():
    seen = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(4, 4) + 2, torch.randn(4, 4)
    calls = {
        "linear": lambda: nn.Linear(4, 4)(x),
        "matmul": lambda: x @ w,
        "div": lambda: x / w,
        "sum": lambda: x.sum(),
        "softmax": lambda: F.softmax(x, -1),
        "tanh": lambda: F.tanh(x),
        "pow": lambda: x**2,
        "sub": lambda: 1 - x,
    }
    for name, call in calls.items():
        seen.clear()
        with Record():
            call()
        assert seen[-1] in TORCH_FUNCTIONS[name], name


def test_empty_lists_are_a_null_context_and_bitwise_identical():
    lists = AutocastOpLists([], [])
    assert not lists and isinstance(lists.mode("cpu", torch.bfloat16), contextlib.nullcontext)
    assert AutocastOpLists(black=["relu"])
    m1, _, loss1 = run(lists, seed=3)
    torch.manual_seed(3)
    m2 = Tiny()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss2 = m2(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    loss2.backward()
    assert torch.equal(loss1, loss2)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1.grad, p2.grad)


def test_black_linear_equals_fp32_exactly():
    torch.manual_seed(0)
    x, w, b = torch.randn(5, 8), torch.randn(8, 8), torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.linear(x, w, b).dtype == torch.bfloat16
        with AutocastOpLists(black=["linear"]).mode("cpu", torch.bfloat16):
            out = F.linear(x, w, b)
    assert out.dtype == torch.float32 and torch.equal(out, F.linear(x, w, b))


def test_mode_is_off_inside_its_own_torch_function():
    """The inner call of a listed op is not intercepted again (no recursion, one dispatch)."""
    from libai.runtime import amp_lists

    calls = []
    orig = amp_lists._OpListMode.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return orig(self, func, types, args, kwargs)

    mode = AutocastOpLists(black=["layer_norm"]).mode("cpu", torch.bfloat16)
    mode.__class__ = type("Counting", (amp_lists._OpListMode,), {"__torch_function__": counting})
    x = torch.randn(2, 8).bfloat16()
    with mode:
        out = F.layer_norm(x, (8,))  # F.layer_norm calls torch.layer_norm internally
    assert out.dtype == torch.float32 and calls == [F.layer_norm]


@pytest.mark.not_under_mutation(
    reason="a fullgraph torch.compile cannot trace mutmut's trampolines (they read a ContextVar)"
)
def test_torch_compile_honours_the_mode():
    def f(x, w):
        return F.linear(x, w) * 2

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compiled(x, w).dtype == torch.bfloat16
        with AutocastOpLists(black=["linear"]).mode("cpu", torch.bfloat16):
            out = compiled(x, w)
    assert out.dtype == torch.float32 and torch.equal(out, f(x, w))
