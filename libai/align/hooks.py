"""Autograd taps and tensor-tree helpers used by the recorder's module hooks."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

#: ``torch.distributed.pipelining`` runs each stage once on its first step to learn shapes
#: (``_shape_inference`` before torch 2.13)
_PIPELINE_INFERENCE = frozenset(
    {"_forward_metadata_inference", "_backward_metadata_inference", "_shape_inference"}
)


class GradTap(torch.autograd.Function):
    """Identity whose backward hands the incoming gradient to ``sink`` first.

    Applied to a module's differentiable inputs, the gradient it sees is exactly what that
    module sends back to the input (other consumers of the tensor do not add to it). The
    forward returns a copy so in-place ops inside the module cannot hit a custom-function
    view.
    """

    @staticmethod
    def forward(ctx, x, sink: Callable[[torch.Tensor], None]):
        ctx.sink = sink
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.sink(grad)
        return grad, None


class Inject(torch.autograd.Function):
    """Forward: ``value`` instead of ``x``; backward: the gradient goes to ``x`` unchanged.

    ``single_step`` alignment feeds a module the reference model's inputs this way while the
    autograd graph stays connected.
    """

    @staticmethod
    def forward(ctx, x, value):
        return value.detach().to(dtype=x.dtype, device=x.device).clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def flatten_tensors(obj) -> list[torch.Tensor]:
    """Tensors in ``obj`` (tensors, tuples, lists, dicts, ``ModelOutput``s) in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):  # ModelOutput is an OrderedDict of its non-None fields
        return [t for v in obj.values() for t in flatten_tensors(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in flatten_tensors(v)]
    return []


def map_tensors(obj, fn: Callable[[torch.Tensor], torch.Tensor]):
    """``obj`` with every tensor ``t`` (in :func:`flatten_tensors` order) replaced by
    ``fn(t)``; plain tuples, lists and dicts are rebuilt, anything else is kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if type(obj) is dict:
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    if type(obj) in (tuple, list):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def is_differentiable(t: torch.Tensor) -> bool:
    """A floating tensor that takes part in this backward."""
    return torch.is_grad_enabled() and t.is_floating_point() and t.requires_grad


def any_meta(obj) -> bool:
    """Whether ``obj`` holds a ``meta`` tensor (shape inference, not a real call)."""
    return any(t.is_meta for t in flatten_tensors(obj))


def in_pipeline_metadata_inference(max_depth: int = 64) -> bool:
    """Whether the caller runs inside a pipeline stage's shape-inference pass (a forward on
    placeholder tensors that is not part of the step, so it must not be recorded)."""
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name in _PIPELINE_INFERENCE and "pipelining" in code.co_filename:
            return True
        frame = frame.f_back
    return False
