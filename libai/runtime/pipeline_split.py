"""The pipeline split of a model, and its side of the pipeline contract.

:func:`prune_to_stages` cuts a model down to the stages a rank runs (the first transform
of :mod:`libai.runtime.parallelize` under pipeline parallelism); :func:`stage_copies` gives
each local virtual stage its own module sharing the parameters; :func:`pipeline_inputs`,
:func:`pipeline_stage_kwargs` and :func:`pipeline_target` read a batch the way a model's
pipeline contract (:mod:`libai.models.contract`) says.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn

from libai import dist
from libai.models.contract import PipelineInputs, PipelineStageInputs, PipelineTarget

__all__ = [
    "batch_rows",
    "first_rows",
    "pipeline_inputs",
    "pipeline_stage_kwargs",
    "pipeline_target",
    "prune_to_stages",
    "stage_copies",
]


def prune_to_stages(model: nn.Module, stages: set[int], util=None) -> nn.Module:
    """Drop (in place) every submodule whose ``layer_idx`` belongs to a stage not in ``stages``
    (of ``util``'s layout; default the mesh ``model`` was built on).

    Modules in an ``nn.ModuleDict`` are deleted (the other keys, hence parameter names, stay);
    other submodules are replaced by ``None``. Returns ``model``.
    """
    util = util or dist.mesh_of(model)
    for name, child in list(model.named_children()):
        if child is None:
            continue
        layer_idx = getattr(child, "layer_idx", None)
        if layer_idx is not None and util.get_layer_stage(layer_idx) not in stages:
            if isinstance(model, nn.ModuleDict):
                del model[name]
            else:
                setattr(model, name, None)
        else:
            prune_to_stages(child, stages, util)
    return model


def stage_copies(model: nn.Module, stages: list[int], util) -> list[nn.Module]:
    """``model`` pruned (in place) to this rank's ``stages``; with several (interleaved
    schedules) also one structural copy per stage, pruned to it, whose parameters and
    buffers are the model's own objects. Returns the module of each stage."""
    prune_to_stages(model, set(stages), util)
    if len(stages) == 1:
        return [model]
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return [prune_to_stages(copy.deepcopy(model, dict(shared)), {s}, util) for s in stages]


def batch_rows(batch: Mapping[str, torch.Tensor]) -> int:
    """The batch dimension of a batch dict (its first tensor's dim 0)."""
    return next(v for v in batch.values() if isinstance(v, torch.Tensor)).shape[0]


def first_rows(value, rows: int):
    """``value`` (a tensor, or a tuple / list / dict of them) cut to its first ``rows`` rows."""
    if isinstance(value, torch.Tensor):
        return value[:rows]
    if isinstance(value, (tuple, list)):
        return type(value)(first_rows(v, rows) for v in value)
    if isinstance(value, Mapping):
        return {k: first_rows(v, rows) for k, v in value.items()}
    return value


def pipeline_inputs(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple:
    """The first stage's positional inputs: ``model.pipeline_inputs(batch)`` if the model
    defines it (several tensors, e.g. ids and a padding mask), else
    ``(batch[model.pipeline_input_key],)``."""
    if isinstance(model, PipelineInputs):
        return tuple(model.pipeline_inputs(batch))
    return (batch[model.pipeline_input_key],)


def pipeline_stage_kwargs(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> dict:
    """The keyword inputs of every stage's ``pipeline_forward``: ``model.pipeline_stage_kwargs(
    batch)`` if the model defines it, else none.

    They are the per-sample tensors every stage needs that are not activations: padding
    masks, token type ids. Each stage takes them from its own copy of the batch (split into
    the same micro-batches as the inputs), so nothing but activations is sent between
    stages. Integer tensors cannot be sent on every supported release (before torch 2.13,
    ``torch.distributed.pipelining`` marks each received tensor as requiring grad, which
    only floating-point tensors can), and not sending them saves their bytes on every
    micro-batch. ``None`` values are dropped."""
    if not isinstance(model, PipelineStageInputs):
        return {}
    return {k: v for k, v in model.pipeline_stage_kwargs(batch).items() if v is not None}


def pipeline_target(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The last stage's target: ``model.pipeline_target(batch)`` (one tensor; models with
    several targets pack them) if defined, else ``batch[model.pipeline_target_key]``."""
    if isinstance(model, PipelineTarget):
        return model.pipeline_target(batch)
    return batch[model.pipeline_target_key]
