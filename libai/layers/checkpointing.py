"""Activation checkpointing of one block: ``"full"`` recomputes everything in backward,
``"selective"`` keeps the outputs of the expensive ops and recomputes the cheap ones;
``"full_attn"`` / ``"core_attn"`` (FleetX's granularities, libai's TransformerLayer only)
recompute just the attention sub-layer / the attention core.

The selective policy is torchtitan's op-level idea: matrix multiplies and attention are what
cost time to recompute, elementwise ops, norms and activations are what cost memory to keep.
It keeps the output of every attention kernel and of every second matrix multiply (the
others are recomputed, halving their memory), and recomputes everything else. The gradients
are the same as without checkpointing; only what is stored between forward and backward
changes.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

__all__ = ["MODES", "checkpointed", "resolve_mode"]

MODES = ("full", "selective", "full_attn", "core_attn")
#: modes that recompute a part of a libai TransformerLayer (FleetX's granularities): the
#: attention sub-layer, or the attention core (softmax(q k^T) v)
LAYER_PART_MODES = ("full_attn", "core_attn")
_aten = torch.ops.aten
_MATMULS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}
_ATTENTION = {
    getattr(_aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(_aten, name)
}


def resolve_mode(value) -> str | None:
    """``True`` / ``"full"`` -> "full", another of :data:`MODES` -> itself, falsy -> None."""
    if value is None or value is False:
        return None
    if value is True:
        return "full"
    if value not in MODES:
        raise ValueError(f"train.activation_checkpoint.mode must be one of {MODES}, got {value!r}")
    return value


def _selective_contexts():
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func in _ATTENTION:
            return CheckpointPolicy.MUST_SAVE
        if func in _MATMULS:
            phase = "recompute" if ctx.is_recompute else "forward"
            counts[phase] += 1
            # the same decision in the forward and in its recomputation: every second one
            keep = counts[phase] % 2 == 1
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpointed(fn, mode: str, *args, **kwargs):
    """``fn(*args, **kwargs)`` under non-reentrant checkpointing of ``mode``."""
    if mode == "selective":
        return checkpoint(
            fn,
            *args,
            use_reentrant=False,
            context_fn=functools.partial(_selective_contexts),
            **kwargs,
        )
    return checkpoint(fn, *args, use_reentrant=False, **kwargs)
