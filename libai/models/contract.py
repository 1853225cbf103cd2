"""The model contract: what the runtime and the generation code rely on a model to provide,
written as ``typing.Protocol``s (checked with ``isinstance``; a model needs no base class).

Every model: ``model(**batch)`` returns a dict whose entries with "loss" in their key sum to
the training loss. Beyond that, optional capabilities:

* :class:`PipelineModel` — runs split over pipeline stages. The first stage's inputs come
  from :class:`PipelineInputs` (a method) or ``pipeline_input_key`` (one batch key); the last
  stage's target from :class:`PipelineTarget` (a method) or ``pipeline_target_key``; per-sample
  non-activation tensors every stage reads (padding masks) from :class:`PipelineStageInputs`.
* :class:`Generator` — decodes step by step with a KV cache (``decode_stage``);
  :class:`EncoderDecoderGenerator` also encodes once (``encode_stage``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

__all__ = [
    "EncoderDecoderGenerator",
    "Generator",
    "PipelineInputs",
    "PipelineModel",
    "PipelineStageInputs",
    "PipelineTarget",
    "missing_pipeline_members",
    "total_loss",
]


@runtime_checkable
class PipelineModel(Protocol):
    """A model the runtime can split into pipeline stages."""

    def pipeline_forward(self, *activations: torch.Tensor, **stage_inputs) -> torch.Tensor:
        """The layers this stage holds, on the previous stage's output (or the inputs)."""

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss on the last stage's output."""


@runtime_checkable
class PipelineInputs(Protocol):
    def pipeline_inputs(self, batch: Mapping[str, torch.Tensor]) -> tuple:
        """The first stage's positional inputs (several tensors)."""


@runtime_checkable
class PipelineTarget(Protocol):
    def pipeline_target(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The last stage's target (one tensor; several targets packed into it)."""


@runtime_checkable
class PipelineStageInputs(Protocol):
    def pipeline_stage_kwargs(self, batch: Mapping[str, torch.Tensor]) -> dict:
        """Keyword inputs of every stage, taken from each stage's own batch (never sent)."""


@runtime_checkable
class Generator(Protocol):
    def decode_stage(self, x, *args, **kwargs):
        """One decoding step of this stage's layers with the KV cache."""


@runtime_checkable
class EncoderDecoderGenerator(Generator, Protocol):
    def encode_stage(self, x, *args, **kwargs):
        """The encoder layers this stage holds, run once per prompt."""


def missing_pipeline_members(model) -> list[str]:
    """What ``model`` lacks to run under pipeline parallelism (empty: nothing)."""
    missing = [] if isinstance(model, PipelineModel) else ["pipeline_forward / pipeline_loss"]
    if not (isinstance(model, PipelineInputs) or hasattr(model, "pipeline_input_key")):
        missing.append("pipeline_input_key or pipeline_inputs(batch)")
    if not (isinstance(model, PipelineTarget) or hasattr(model, "pipeline_target_key")):
        missing.append("pipeline_target_key or pipeline_target(batch)")
    return missing


def loss_terms(outputs: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """The entries of a model's output dict with "loss" in their key (``None`` entries
    skipped): the terms the trainer logs one by one (LiBai logs BERT's ``lm_loss`` and
    ``sop_loss``, for example). ``TypeError`` when ``outputs`` is not a mapping."""
    if not isinstance(outputs, Mapping):
        raise TypeError(
            f"the model returned a {type(outputs).__name__}, not a dict of outputs: training "
            "needs forward(**batch) to return a mapping with its loss under a key containing "
            '"loss" (e.g. {"loss": ...}), or a loss_fn(batch) returning the loss'
        )
    return {k: v for k, v in outputs.items() if "loss" in k and v is not None}


def total_loss(outputs: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
    """The training loss of a model's output dict: the sum of its :func:`loss_terms`.
    ``KeyError`` naming the keys when there is none."""
    losses = list(loss_terms(outputs).values())
    if not losses:
        raise KeyError(f"the model returned no loss (keys: {sorted(outputs)})")
    return sum(losses[1:], losses[0])
