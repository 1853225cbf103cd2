"""Custom autocast op lists: FleetX's ``Engine.mix_precision.custom_black_list`` and
``custom_white_list``.

``torch.autocast`` has fixed op lists, so the custom lists are a ``TorchFunctionMode`` entered
inside ``torch.autocast``: a black-listed call runs with autocast off and its fp16/bf16 tensor
arguments cast to fp32; a white-listed call runs with autocast off and its fp32 tensor
arguments cast to the low dtype. Casts are ``.to(dtype)``, so fp32 parameters get fp32 grads.

Accepted Paddle op names (torch names from :data:`TORCH_FUNCTIONS` are accepted as well;
where a name is both, the Paddle meaning wins, which only matters for ``mul``):

=============================================  ==================================================
Paddle name                                    torch functions
=============================================  ==================================================
matmul, matmul_v2                              matmul, linear, mm, addmm, bmm, baddbmm
mul (the fc matmul, *not* elementwise)         linear, mm, addmm
bmm                                            bmm, baddbmm
lookup_table, lookup_table_v2                  embedding
softmax / log_softmax                          softmax / log_softmax
softmax_with_cross_entropy,                    cross_entropy
c_softmax_with_cross_entropy
cross_entropy, cross_entropy2                  cross_entropy, nll_loss
reduce_sum / reduce_mean                       sum / mean
elementwise_add / _sub / _mul / _div           add / sub / mul / div
layer_norm, gelu, relu, tanh, sigmoid,         the torch function of the same name
exp, log, pow, sqrt, rsqrt, dropout
silu, swish                                    silu
fused_attention, flash_attn                    scaled_dot_product_attention
=============================================  ==================================================

What the lists can express: the precision of each *Python-level* call of these torch functions,
including calls inside ``torch.compile``'d code (dynamo traces the mode: with torch 2.13 on CPU
``torch.compile(..., fullgraph=True)`` with the eager, aot_eager and inductor backends honours it,
whether the mode is entered outside or inside the compiled function). What they cannot express:
ops run inside a custom C++/Triton kernel, ops inside a composite that is itself passed through
(a mode is off while its ``__torch_function__`` runs, so e.g. the ``log_softmax`` inside
``F.cross_entropy`` is never seen), in-place variants (``add_``), and backward ops.
"""

from __future__ import annotations

import contextlib
import difflib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

T = torch.Tensor

# Canonical name -> the callables ``__torch_function__`` receives as ``func`` (probed with torch
# 2.13). Operators arrive as the plain method: ``a @ b`` as ``Tensor.matmul``, ``a + b`` / ``1 + a``
# as ``Tensor.add``, ``a / b`` as ``Tensor.div``, ``a * b`` as ``Tensor.mul``, ``a - b`` as
# ``Tensor.sub`` -- so ``Tensor.__matmul__``, ``__add__``, ``__truediv__`` ... are never received
# and are not listed. Reflected operators that are Python functions do arrive as themselves
# (``__rsub__``, ``__rdiv__`` == ``__rtruediv__``, ``__rpow__``, ``__rmatmul__``), and ``a ** 2``
# arrives as ``Tensor.__pow__``. ``F.tanh`` / ``F.sigmoid`` arrive as ``Tensor.tanh`` /
# ``Tensor.sigmoid``; ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm``, ``nn.Dropout``, ``nn.GELU``
# arrive as their ``F.`` function.
TORCH_FUNCTIONS: dict[str, tuple] = {
    "linear": (F.linear,),
    "matmul": (torch.matmul, T.matmul, T.__rmatmul__),
    "mm": (torch.mm, T.mm),
    "bmm": (torch.bmm, T.bmm),
    "addmm": (torch.addmm, T.addmm),
    "baddbmm": (torch.baddbmm, T.baddbmm),
    "embedding": (F.embedding, torch.embedding),
    "softmax": (F.softmax, torch.softmax, T.softmax),
    "log_softmax": (F.log_softmax, torch.log_softmax, T.log_softmax),
    "cross_entropy": (F.cross_entropy,),
    "nll_loss": (F.nll_loss,),
    "sum": (torch.sum, T.sum),
    "mean": (torch.mean, T.mean),
    "add": (torch.add, T.add),
    "sub": (torch.sub, torch.subtract, T.sub, T.subtract, T.__rsub__),
    "mul": (torch.mul, torch.multiply, T.mul, T.multiply),
    "div": (torch.div, torch.divide, torch.true_divide, T.div, T.divide, T.true_divide, T.__rdiv__),
    "layer_norm": (F.layer_norm, torch.layer_norm),
    "gelu": (F.gelu,),
    "relu": (F.relu, torch.relu, T.relu),
    "silu": (F.silu,),
    "tanh": (torch.tanh, T.tanh),
    "sigmoid": (torch.sigmoid, T.sigmoid),
    "exp": (torch.exp, T.exp),
    "log": (torch.log, T.log),
    "pow": (torch.pow, T.pow, T.__pow__, T.__rpow__),
    "sqrt": (torch.sqrt, T.sqrt),
    "rsqrt": (torch.rsqrt, T.rsqrt),
    "dropout": (F.dropout, torch.dropout),
    "scaled_dot_product_attention": (F.scaled_dot_product_attention,),
    "where": (torch.where, T.where),  # FleetX's generation files black-list it
}

_MATMULS = ("matmul", "linear", "mm", "addmm", "bmm", "baddbmm")
PADDLE_OPS: dict[str, tuple[str, ...]] = {
    "matmul": _MATMULS,
    "matmul_v2": _MATMULS,
    "mul": ("linear", "mm", "addmm"),
    "bmm": ("bmm", "baddbmm"),
    "lookup_table": ("embedding",),
    "lookup_table_v2": ("embedding",),
    "softmax_with_cross_entropy": ("cross_entropy",),
    "c_softmax_with_cross_entropy": ("cross_entropy",),
    "cross_entropy": ("cross_entropy", "nll_loss"),
    "cross_entropy2": ("cross_entropy", "nll_loss"),
    "reduce_sum": ("sum",),
    "reduce_mean": ("mean",),
    "elementwise_add": ("add",),
    "elementwise_sub": ("sub",),
    "elementwise_mul": ("mul",),
    "elementwise_div": ("div",),
    "swish": ("silu",),
    "fused_attention": ("scaled_dot_product_attention",),
    "flash_attn": ("scaled_dot_product_attention",),
    **{
        name: (name,)
        for name in "softmax log_softmax layer_norm gelu relu silu tanh sigmoid exp log pow "
        "sqrt rsqrt dropout where".split()
    },
}


def resolve_op_names(names, key: str) -> frozenset[str]:
    """Paddle op names or torch function names -> canonical names (keys of TORCH_FUNCTIONS).

    ``key`` is the config key the names came from; an unknown name raises ``ValueError``
    naming it and the closest valid names.
    """
    if isinstance(names, str):
        names = [names]
    resolved = set()
    for name in names or ():
        if name in PADDLE_OPS:
            resolved.update(PADDLE_OPS[name])
        elif name in TORCH_FUNCTIONS:
            resolved.add(name)
        else:
            valid = sorted(set(PADDLE_OPS) | set(TORCH_FUNCTIONS))
            close = difflib.get_close_matches(str(name), valid, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"valid names: {valid}"
            raise ValueError(f"{key}: unknown op name {name!r}; {hint}")
    return frozenset(resolved)


def _cast(obj, src: tuple[torch.dtype, ...], dst: torch.dtype):
    """``obj`` with every tensor of a dtype in ``src`` cast to ``dst`` (inside lists/tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dst) if obj.dtype in src else obj
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):  # namedtuples kept as is
        return type(obj)(_cast(o, src, dst) for o in obj)
    return obj


class _OpListMode(TorchFunctionMode):
    """Runs listed functions with autocast off and their float arguments cast."""

    def __init__(self, actions: dict, device_type: str):
        super().__init__()
        self.actions, self.device_type = actions, device_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        action = self.actions.get(func)
        if action is None:
            return func(*args, **kwargs)
        src, dst = action
        args = _cast(args, src, dst)
        kwargs = {k: v if k == "out" else _cast(v, src, dst) for k, v in kwargs.items()}
        # this mode is off while __torch_function__ runs, so ``func`` is not intercepted again
        with torch.autocast(self.device_type, enabled=False):
            return func(*args, **kwargs)


class AutocastOpLists:
    """The resolved custom black (fp32) and white (low dtype) lists.

    ``bool(lists)`` is False when both are empty; :meth:`mode` gives the context manager to
    enter inside ``torch.autocast``.
    """

    def __init__(self, black=(), white=(), *, key_prefix: str = "Engine.mix_precision"):
        black_key, white_key = f"{key_prefix}.custom_black_list", f"{key_prefix}.custom_white_list"
        self.black = resolve_op_names(black, black_key)
        self.white = resolve_op_names(white, white_key)
        both = self.black & self.white
        if both:
            raise ValueError(f"ops {sorted(both)} are in both {black_key} and {white_key}")

    def __bool__(self) -> bool:
        return bool(self.black or self.white)

    def __repr__(self) -> str:
        return f"AutocastOpLists(black={sorted(self.black)}, white={sorted(self.white)})"

    def mode(self, device_type: str, low_dtype: torch.dtype):
        """Context manager to enter inside ``torch.autocast(device_type, dtype=low_dtype)``:
        the TorchFunctionMode, or a null context when both lists are empty."""
        if not self:
            return contextlib.nullcontext()
        low = (torch.float16, torch.bfloat16)
        actions = {}
        for names, action in (
            (self.black, (low, torch.float32)),
            (self.white, ((torch.float32,), low_dtype)),
        ):
            for name in names:
                actions.update(dict.fromkeys(TORCH_FUNCTIONS[name], action))
        return _OpListMode(actions, device_type)
