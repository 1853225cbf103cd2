"""``oneflow._C``: the fused and functional ops LiBai and its projects call, on torch.

Each entry computes what OneFlow's kernel computes (the fusion is OneFlow's speed, not its
numbers); ``tests/unit/oneflow_api`` checks each against its formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from libai.oneflow_api.global_tensors import creation
from libai.oneflow_api.losses import cross_entropy

__all__ = ["FUSED_OPS"]


def _identity(x: torch.Tensor) -> torch.Tensor:
    """``amp_white_identity`` / ``amp_black_identity``: OneFlow's autocast markers (compute
    this in low / full precision under AMP); the value passes through unchanged."""
    return x


def _matmul(a, b, transpose_a: bool = False, transpose_b: bool = False, alpha: float = 1.0):
    """``alpha * op(a) @ op(b)``, ``op`` transposing the last two dims when asked."""
    a = a.transpose(-1, -2) if transpose_a else a
    b = b.transpose(-1, -2) if transpose_b else b
    out = torch.matmul(a, b)
    return out if alpha == 1.0 else out * alpha


def _gather(weight: torch.Tensor, indices: torch.Tensor, axis: int = 0) -> torch.Tensor:
    """TensorFlow-style gather: the slices of ``weight`` along ``axis`` at ``indices``
    (``weight[indices]`` for ``axis=0``, an embedding lookup)."""
    return torch.index_select(weight, axis, indices.reshape(-1)).reshape(
        *weight.shape[:axis], *indices.shape, *weight.shape[axis + 1 :]
    )


def _bias_add(x: torch.Tensor, bias: torch.Tensor, axis: int) -> torch.Tensor:
    shape = [1] * x.ndim
    shape[axis] = -1
    return x + bias.reshape(shape)


def _fused_bias_add_dropout(x, bias, p: float = 0.0, axis: int = -1, **_training):
    """``dropout(x + bias, p)`` (bias broadcast along ``axis``), in training mode as
    OneFlow's kernel (callers pass p=0 in eval)."""
    return F.dropout(_bias_add(x, bias, axis % x.ndim), p=p, training=p > 0)


def _fused_bias_add_gelu(x, bias, axis: int = -1):
    """``gelu(x + bias)`` with the exact (erf) GELU."""
    return F.gelu(_bias_add(x, bias, axis % x.ndim))


def _fused_fast_gelu_mul(x, multiplier):
    """``gelu_tanh(x) * multiplier`` (the gated MLP's fused activation)."""
    return F.gelu(x, approximate="tanh") * multiplier


def _quick_gelu(x):
    """``x * sigmoid(1.702 x)`` (CLIP's GELU approximation)."""
    return x * torch.sigmoid(1.702 * x)


def _layer_norm_affine(x, weight, bias, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-5):
    """LayerNorm over the dims from ``begin_norm_axis`` on, then ``* weight + bias``."""
    shape = x.shape[begin_norm_axis % x.ndim :]
    return F.layer_norm(x, shape, weight, bias, epsilon)


def _layer_norm(x, begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-5):
    """LayerNorm without weight and bias."""
    return F.layer_norm(x, x.shape[begin_norm_axis % x.ndim :], None, None, epsilon)


def _rms_norm(x, weight, normalized_shape, epsilon: float = 1e-6):
    """``x / sqrt(mean(x^2) + eps) * weight`` over ``normalized_shape`` (T5's / Llama's
    RMSNorm), computed in float32 as OneFlow does for half inputs."""
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dims, keepdim=True) + epsilon)
    return (normed * weight.float()).to(x.dtype) if weight is not None else normed.to(x.dtype)


def _fused_scale_tril(x, diagonal: int = 0, fill_value: float = 0.0, scale: float = 1.0):
    """``tril(x * scale, diagonal)`` with ``fill_value`` above the diagonal."""
    keep = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).tril(diagonal)
    return (x * scale).masked_fill(~keep, fill_value)


def _transpose(x, perm):
    """``x.permute(perm)`` (OneFlow's transpose takes the whole permutation)."""
    return x.permute(*perm)


def _sparse_softmax_cross_entropy(logits, labels):
    """Per-row cross entropy of ``logits`` against class indices ``labels`` (no reduction)."""
    return F.cross_entropy(logits.flatten(0, -2), labels.reshape(-1), reduction="none").view(
        labels.shape
    )


#: ``oneflow._C.<name>`` -> its torch computation
FUSED_OPS = {
    "amp_white_identity": _identity,
    "amp_black_identity": _identity,
    "matmul": _matmul,
    "gather": _gather,
    "fused_bias_add_dropout": _fused_bias_add_dropout,
    "fused_bias_add_gelu": _fused_bias_add_gelu,
    "fused_fast_gelu_mul": _fused_fast_gelu_mul,
    "quick_gelu": _quick_gelu,
    "layer_norm_affine": _layer_norm_affine,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "fused_scale_tril": _fused_scale_tril,
    "transpose": _transpose,
    "cross_entropy": cross_entropy,
    "sparse_softmax_cross_entropy": _sparse_softmax_cross_entropy,
    "relu": F.relu,
    "softmax": F.softmax,
    "global_arange": creation(torch.arange),
}
