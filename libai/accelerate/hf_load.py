"""``--load DIR``: a checkpoint to resume, or a Hugging Face model directory whose weights the
run starts from (Rapidformer's templates load ``from_pretrained(args.load)``).

A Hugging Face model directory holds ``config.json`` and its weights (``model.safetensors``,
sharded safetensors with an index, or ``pytorch_model.bin``) and no checkpoint of a run
(no DCP ``.metadata``, no ``last_checkpoint``). Its weights are copied into the model before
the run's switches are applied: a transformers module by parameter name (the names
``save_pretrained`` writes), a model of libai's zoo through its Hugging Face loader.
"""

from __future__ import annotations

import json
import logging
import os

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["is_hf_model_dir", "load_hf_weights"]

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_hf_model_dir(path: str) -> bool:
    """Whether ``path`` is a Hugging Face model directory and not a run's checkpoint."""
    if not os.path.isdir(path):
        return False
    names = set(os.listdir(path))
    if ".metadata" in names or "last_checkpoint" in names:
        return False
    return "config.json" in names and any(w in names for w in WEIGHT_FILES)


def _read_state(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's weights (data only: safetensors, or torch's
    ``weights_only`` loader)."""
    from safetensors.torch import load_file

    def read(name: str) -> dict[str, torch.Tensor]:
        full = os.path.join(path, name)
        if name.endswith(".safetensors"):
            return load_file(full)
        return torch.load(full, map_location="cpu", weights_only=True)

    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if os.path.isfile(os.path.join(path, index)):
            with open(os.path.join(path, index), encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for name in files:
                state.update(read(name))
            return state
    name = "model.safetensors" if os.path.isfile(os.path.join(path, "model.safetensors")) else None
    return read(name or "pytorch_model.bin")


def _transformers_module(model: nn.Module):
    """The transformers ``PreTrainedModel`` of ``model`` (itself, or held under ``hf`` /
    ``module`` by libai's wrappers), else ``None``."""
    from transformers import PreTrainedModel

    for candidate in (model, getattr(model, "hf", None), getattr(model, "module", None)):
        if isinstance(candidate, PreTrainedModel):
            return candidate
    return None


def load_hf_weights(model: nn.Module, path: str, flag: str = "--load") -> None:
    """Copy the weights of the Hugging Face directory ``path`` into ``model`` (see the module
    doc). Raises naming the tensors when nothing matches or a shape contradicts the model."""
    hf = _transformers_module(model)
    if hf is None:
        _load_into_zoo_model(model, path)
        return
    state = _read_state(path)
    own = hf.state_dict()
    prefix = hf.base_model_prefix
    matched, mismatched = {}, []
    for name, value in state.items():
        target = name if name in own else None
        if target is None and prefix and f"{prefix}.{name}" in own:  # a base model's weights
            target = f"{prefix}.{name}"
        if target is None:
            continue
        if tuple(own[target].shape) != tuple(value.shape):
            mismatched.append(f"{name}: {list(value.shape)} vs {list(own[target].shape)}")
            continue
        matched[target] = value
    if mismatched:
        raise ValueError(f"{flag} {path}: shapes that contradict the model: {mismatched}")
    if not matched:
        raise ValueError(
            f"{flag} {path}: none of its tensors names a parameter of {type(hf).__name__}"
        )
    with torch.no_grad():
        for name, value in matched.items():
            own[name].copy_(value.to(own[name].dtype))
    left = sorted(set(own) - set(matched))
    logger.info(
        "%s %s: a Hugging Face model directory: %d tensors loaded into %s (no resume: the run "
        "starts at step 0)%s",
        flag,
        path,
        len(matched),
        type(hf).__name__,
        f"; kept as they were: {left}" if left else "",
    )


def _load_into_zoo_model(model: nn.Module, path: str) -> None:
    """A libai zoo model: its class loaded from ``path`` by the Hugging Face loader (on the
    same mesh), then copied over parameter by parameter."""
    from libai.models.utils import load_huggingface

    loaded = load_huggingface(path, type(model))
    source = dict(loaded.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = source[name]
            if value.shape != p.shape:
                raise ValueError(
                    f"--load {path}: {name} has shape {list(value.shape)}, the model "
                    f"{list(p.shape)}"
                )
            p.copy_(value)
    logger.info(
        "--load %s: a Hugging Face model directory: weights loaded into libai's %s (no "
        "resume: the run starts at step 0)",
        path,
        type(model).__name__,
    )
