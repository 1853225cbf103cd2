"""Optimizer construction: LiBai's parameter groups and ``build_optimizer``."""

from libai.optim.build import (
    NORM_MODULE_TYPES,
    build_optimizer,
    get_clip_grad_settings,
    get_default_optimizer_params,
    reduce_param_groups,
)

__all__ = [
    "NORM_MODULE_TYPES",
    "build_optimizer",
    "get_clip_grad_settings",
    "get_default_optimizer_params",
    "reduce_param_groups",
]
