"""Sequence parallel in the runner (``train.dist.sequence_parallel``): which models and batches
run it, and the gradient all-reduce of the parameters that live in the sequence-parallel
region.

The layers split the sequence themselves (:mod:`libai.layers.collectives`). What they cannot
do alone is the gradient of a *replicated* parameter used on a sequence shard (norm weights
and biases, row-parallel biases, GPT-2's position table): each tp rank computes it from its
own positions only, a partial sum. Megatron marks these parameters ``sequence_parallel`` and
all-reduces their gradients over tp once per step; the layers mark them with
:func:`~libai.layers.param.mark_sequence_parallel` and :func:`all_reduce_sequence_parallel_grads`
sums them, in one flat buffer per dtype.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as torch_dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

from libai.layers.collectives import check_sequence_split


def check_sequence_parallel_support(model: nn.Module, layout) -> None:
    """Raise (before any collective) if sequence parallel is on in ``layout`` (a
    :class:`~libai.dist.DistLayout`) and ``model`` cannot run it; a model declares support
    with the class attribute ``supports_sequence_parallel = True``."""
    if layout.sequence_parallel and not getattr(model, "supports_sequence_parallel", False):
        raise ValueError(
            f"train.dist.sequence_parallel=True, but {type(model).__name__} does not support "
            "sequence parallelism (GPT-2 and Llama/Qwen2 do). Set "
            "train.dist.sequence_parallel=False for this model."
        )


def sequence_parallel_parameter_names(model: nn.Module) -> set[str]:
    """Names of ``model``'s parameters marked ``libai_sequence_parallel`` (names survive
    parameter re-wrapping, e.g. by FSDP; attributes on the parameter objects may not)."""
    return {
        name for name, p in model.named_parameters() if getattr(p, "libai_sequence_parallel", False)
    }


def all_reduce_sequence_parallel_grads(model: nn.Module, names: set[str], group) -> None:
    """Sum the gradients of the parameters ``names`` of ``model`` over the tp ``group``
    (partial sums of each rank's sequence shard -> the gradient of the whole sequence)."""
    if group is None or not names:
        return
    grads: dict[torch.dtype, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if name in names and p.grad is not None:
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            grads.setdefault(grad.dtype, []).append(grad)
    for bucket in grads.values():
        flat = _flatten_dense_tensors(bucket)
        torch_dist.all_reduce(flat, group=group)
        for grad, summed in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            grad.copy_(summed)


def check_sequence_parallel_batch(batch, layout) -> None:
    """Raise on every rank if the batch's sequences do not split over ``layout``'s tp.

    Under pipeline parallel only the first stage sees the token ids, and a later stage would
    wait for activations that never come; so each rank checks dim 1 of the batch's
    ``[batch, seq, ...]`` tensors (ids, labels, masks) before the schedule runs.
    """
    if not layout.sequence_parallel or not isinstance(batch, Mapping):
        return
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            check_sequence_split(value.shape[1], layout.tensor_parallel_size)
