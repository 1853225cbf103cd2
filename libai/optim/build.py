"""Optimizer parameter groups (LiBai's ``get_default_optimizer_params``) and the builder."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from libai.config import instantiate
from libai.config.instantiate import is_lazy_node
from libai.layers import LayerNorm, RMSLayerNorm

__all__ = [
    "NORM_MODULE_TYPES",
    "build_optimizer",
    "get_clip_grad_settings",
    "get_default_optimizer_params",
    "reduce_param_groups",
]

#: modules whose parameters get ``weight_decay_norm`` instead of the default weight decay
NORM_MODULE_TYPES: tuple[type[nn.Module], ...] = (
    LayerNorm,
    RMSLayerNorm,
    nn.modules.batchnorm._NormBase,  # BatchNorm*d, SyncBatchNorm, InstanceNorm*d
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


def get_default_optimizer_params(
    model: nn.Module,
    base_lr: float | None = None,
    weight_decay: float | None = None,
    weight_decay_norm: float | None = 0.0,
    weight_decay_bias: float | None = 0.0,
    clip_grad_max_norm: float | None = None,
    clip_grad_norm_type: float | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Parameter groups for a ``torch.optim`` optimizer (LiBai's rules).

    Args:
        model: the module whose trainable parameters are grouped (each one exactly once,
            even when shared between modules, e.g. tied embeddings).
        base_lr / weight_decay: per-group ``lr`` / ``weight_decay``; ``None`` leaves the
            optimizer's own default.
        weight_decay_norm: weight decay of every parameter of a normalization layer
            (:data:`NORM_MODULE_TYPES`); ``None`` = no special case.
        weight_decay_bias: weight decay of every parameter named ``bias``; ``None`` = no
            special case.
        clip_grad_max_norm / clip_grad_norm_type: stored in every group (as LiBai does) for
            the trainer to read with :func:`get_clip_grad_settings`; the norm type defaults
            to 2.0 when only the max norm is given.
        overrides: ``{param_name: {hyper: value}}`` keyed by the parameter's name inside
            its module, e.g. ``{"embedding": {"lr": 0.01}}``.

    Returns a list of ``{"params": [...], **hyperparameters}`` dicts, one per distinct set
    of hyperparameters, in the order the parameters first appear.
    """
    overrides = copy.deepcopy(dict(overrides or {}))
    defaults: dict[str, Any] = {}
    if base_lr is not None:
        defaults["lr"] = base_lr
    if weight_decay is not None:
        defaults["weight_decay"] = weight_decay
    if clip_grad_max_norm is not None:
        if clip_grad_max_norm <= 0:
            raise ValueError(f"clip_grad_max_norm must be > 0, got {clip_grad_max_norm}")
        defaults["clip_grad_max_norm"] = float(clip_grad_max_norm)
        norm_type = 2.0 if clip_grad_norm_type is None else float(clip_grad_norm_type)
        defaults["clip_grad_norm_type"] = norm_type
    if weight_decay_bias is not None:
        if "bias" in overrides:
            raise ValueError("conflicting overrides for 'bias': weight_decay_bias and overrides")
        overrides["bias"] = {"weight_decay": weight_decay_bias}

    groups = []
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            hyper = dict(defaults)
            if weight_decay_norm is not None and isinstance(module, NORM_MODULE_TYPES):
                hyper["weight_decay"] = weight_decay_norm
            hyper.update(overrides.get(name, {}))
            groups.append({"params": [param], **hyper})
    return reduce_param_groups(groups)


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple((k, _hashable(v)) for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def reduce_param_groups(groups: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Merge groups with identical hyperparameters; a parameter listed twice keeps the
    hyperparameters of its last group. Order follows first appearance."""
    per_param: dict[int, dict[str, Any]] = {}
    for group in groups:
        hyper = {k: v for k, v in group.items() if k != "params"}
        for param in group["params"]:
            entry = per_param.setdefault(id(param), {"param": param, "hyper": {}})
            entry["hyper"].update(hyper)
    merged: dict[tuple, dict[str, Any]] = {}
    for entry in per_param.values():
        key = tuple((k, _hashable(v)) for k, v in sorted(entry["hyper"].items()))
        merged.setdefault(key, {**entry["hyper"], "params": []})["params"].append(entry["param"])
    return list(merged.values())


def get_clip_grad_settings(optimizer: torch.optim.Optimizer) -> tuple[float, float] | None:
    """``(max_norm, norm_type)`` stored in the param groups, or ``None`` (no clipping).

    Clipping is by one global norm over all parameters, so every group must agree.
    """
    settings = {
        (g.get("clip_grad_max_norm"), g.get("clip_grad_norm_type", 2.0))
        for g in optimizer.param_groups
    }
    if len(settings) > 1:
        raise ValueError(
            f"param groups disagree on (clip_grad_max_norm, clip_grad_norm_type): {settings}; "
            "gradients are clipped by one global norm"
        )
    ((max_norm, norm_type),) = settings
    if max_norm is None:
        return None
    return float(max_norm), float(2.0 if norm_type is None else norm_type)


def build_optimizer(optim_cfg: Any, model: nn.Module) -> torch.optim.Optimizer:
    """Instantiate ``optim_cfg`` (``cfg.optim``) for ``model``.

    ``optim_cfg.params`` is a ``LazyCall`` node (normally of
    :func:`get_default_optimizer_params`) whose ``model`` argument is filled here, as LiBai
    fills ``cfg.optim.params.model``. Without ``params``, the default groups are used.
    ``optim_cfg`` is not modified.
    """
    params_cfg = optim_cfg.get("params") if isinstance(optim_cfg, Mapping) else None
    if params_cfg is None:
        params = get_default_optimizer_params(model)
    elif is_lazy_node(params_cfg):
        params = instantiate(params_cfg, model=model)
    else:
        raise TypeError(
            "optim.params must be a LazyCall node such as "
            "LazyCall(get_default_optimizer_params)(...), got "
            f"{type(params_cfg).__name__}"
        )
    return instantiate(optim_cfg, params=params, **_fused_default(optim_cfg, model))


def _fused_default(optim_cfg: Any, model: nn.Module) -> dict:
    """``fused=True`` for a torch Adam / AdamW / SGD on CUDA parameters when the config does
    not choose (one kernel for all parameters instead of one per tensor)."""
    import inspect

    if not isinstance(optim_cfg, Mapping) or "fused" in optim_cfg:
        return {}
    target = optim_cfg.get("_target_")
    if isinstance(target, str):
        from libai.config import locate

        target = locate(target)
    if target not in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        return {}
    if "fused" not in inspect.signature(target).parameters:
        return {}
    first = next(model.parameters(), None)
    return {"fused": True} if first is not None and first.device.type == "cuda" else {}
