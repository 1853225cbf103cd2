"""The optimizer and LR schedule of a FleetX ``Optimizer`` section, built with LiBai's
parameter groups (:func:`~libai.optim.get_default_optimizer_params`) and schedulers.

::

    Optimizer:
      name: AdamW               # any torch.optim class or dotted path; FleetX's FusedAdamW
                                # (AdamW, fused kernels on CUDA) and Momentum (SGD) too
      weight_decay: 0.01        # no decay on norms and biases (weight_decay_norm /
      beta1: 0.9                # weight_decay_bias, default 0.0); FleetX's beta1, beta2,
      beta2: 0.999              # epsilon are torch's betas and eps
      epsilon: 1.0e-8
      lr:                       # a number (constant), or a schedule:
        name: CosineAnnealingWithWarmupDecay   # max_lr, min_lr, warmup_rate, decay_steps
        # or LinearDecayWithWarmup (learning_rate, warmup, total_steps), or any libai
        # scheduler (WarmupCosineLR, WarmupLinearLR, ...) with learning_rate and
        # warmup_iter or warmup_ratio; max_iter defaults to the run's step count
      grad_clip: {name: ClipGradByGlobalNorm, clip_norm: 1.0}   # or ClipGradForMOEByGlobalNorm

Schedules count optimizer steps; with FleetX's ``use_increments: True`` the cosine schedule
counts samples (the global batch size per step), as FleetX does.
"""

from __future__ import annotations

import math

import torch
from omegaconf import OmegaConf

from libai.fleetx.yaml_config import YAMLConfigError
from libai.fleetx.yaml_loaders import check_arguments
from libai.optim import get_default_optimizer_params
from libai.scheduler import fleetx as fleetx_schedulers
from libai.scheduler import lr_scheduler as schedulers

__all__ = ["build_yaml_lr_scheduler", "build_yaml_optimizer", "base_lr"]

#: FleetX ``Optimizer`` keys for Paddle machinery (their log line says why they do nothing)
PADDLE_ONLY_KEYS = ("tensor_fusion", "multi_precision")
#: FleetX's names for torch's optimizer arguments
RENAMES = {"epsilon": "eps", "momentum_rate": "momentum"}
GROUP_KEYS = ("weight_decay_norm", "weight_decay_bias")
LIBAI_SCHEDULERS = {
    name: getattr(schedulers, name)
    for name in (
        "WarmupCosineLR",
        "WarmupCosineAnnealingLR",
        "WarmupLinearLR",
        "WarmupStepLR",
        "WarmupMultiStepLR",
        "WarmupPolynomialLR",
        "WarmupExponentialLR",
    )
}
FLEETX_SCHEDULERS = (
    "CosineAnnealingWithWarmupDecay",
    "LinearDecayWithWarmup",
    "Constant",
    "ViTLRScheduler",
)


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


def _lr_section(opt: dict) -> dict:
    lr = opt.get("lr")
    if isinstance(lr, (int, float)):
        return {"name": "Constant", "learning_rate": float(lr)}
    if not isinstance(lr, dict):
        raise YAMLConfigError("Optimizer.lr must be a number or a mapping with a name")
    return {"name": "Constant", **lr}


def base_lr(opt_cfg) -> float:
    """The peak learning rate of the section (``learning_rate`` or ``max_lr``)."""
    lr = _lr_section(_plain(opt_cfg))
    value = lr.get("max_lr", lr.get("learning_rate"))
    if value is None:
        raise YAMLConfigError(f"Optimizer.lr ({lr['name']}) needs learning_rate or max_lr")
    return float(value)


def build_yaml_optimizer(opt_cfg, model: torch.nn.Module, device_type: str = "cpu"):
    """The optimizer of ``Optimizer`` over ``model``'s parameters (global-norm clipping
    settings are stored in its param groups, as LiBai does)."""
    opt = _plain(opt_cfg)
    name = opt.pop("name", "AdamW")
    opt.pop("lr", None)
    for key in PADDLE_ONLY_KEYS:  # named by libai.fleetx.fleetx_keys as having no effect
        opt.pop(key, None)
    clip = opt.pop("grad_clip", None) or {}
    group_args = {k: opt.pop(k) for k in GROUP_KEYS if k in opt}
    fused = False
    if name == "FusedAdamW":
        name, fused = "AdamW", device_type == "cuda"
    elif name == "Momentum":
        name = "SGD"
        opt.setdefault("momentum", 0.9)
    if "beta1" in opt or "beta2" in opt:
        opt["betas"] = (float(opt.pop("beta1", 0.9)), float(opt.pop("beta2", 0.999)))
    opt = {RENAMES.get(k, k): v for k, v in opt.items()}
    cls = getattr(torch.optim, name, None) if "." not in name else None
    if cls is None:
        from libai.fleetx.yaml_loaders import resolve_name

        cls = resolve_name(
            name, {n: getattr(torch.optim, n) for n in _torch_optimizers()}, "Optimizer.name"
        )
    check_arguments(cls, opt, "Optimizer", reserved=("params", "lr"))
    clip_name = clip.get("name", "ClipGradByGlobalNorm")
    # FleetX's MoE files name ClipGradForMOEByGlobalNorm (the norm summed over the expert
    # group for the experts' gradients): the runtime's global norm counts every expert
    # once on every layout (libai.runtime.grad_clip), which is that norm
    if clip_name not in ("ClipGradByGlobalNorm", "ClipGradForMOEByGlobalNorm"):
        raise YAMLConfigError(
            f"Optimizer.grad_clip.name={clip_name!r}: ClipGradByGlobalNorm (or FleetX's "
            "ClipGradForMOEByGlobalNorm) is supported"
        )
    unknown = set(clip) - {"name", "clip_norm"}
    if unknown:
        raise YAMLConfigError(f"unknown config key(s) Optimizer.grad_clip.{sorted(unknown)}")
    max_norm = clip.get("clip_norm")
    params = get_default_optimizer_params(
        model,
        weight_decay_norm=group_args.get("weight_decay_norm", 0.0),
        weight_decay_bias=group_args.get("weight_decay_bias", 0.0),
        clip_grad_max_norm=float(max_norm) if max_norm else None,
        clip_grad_norm_type=2.0 if max_norm else None,
    )
    if fused:
        opt["fused"] = True
    return cls(params, lr=base_lr(opt_cfg), **opt)


def _torch_optimizers() -> list[str]:
    return [
        n
        for n in dir(torch.optim)
        if isinstance(getattr(torch.optim, n), type)
        and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
        and n != "Optimizer"
    ]


def build_yaml_lr_scheduler(
    opt_cfg, optimizer, train_iter: int, samples_per_step: int | None = None
):
    """The LR schedule of ``Optimizer.lr`` over ``train_iter`` optimizer steps.

    ``use_increments: True`` (FleetX's pretraining files) counts the cosine schedule's
    ``decay_steps`` and warmup in samples: each step advances it by ``samples_per_step``
    (the global batch size), as FleetX's engine steps its schedule by the global batch."""
    lr = _lr_section(_plain(opt_cfg))
    name = lr.pop("name")
    lr.pop("learning_rate", None)
    increments = bool(lr.pop("use_increments", False))
    if increments and name != "CosineAnnealingWithWarmupDecay":
        raise YAMLConfigError(
            f"Optimizer.lr.use_increments=True counts samples in FleetX's "
            f"CosineAnnealingWithWarmupDecay only, not in {name}; remove it"
        )
    if increments and not samples_per_step:
        raise YAMLConfigError(
            "Optimizer.lr.use_increments=True needs the global batch size (samples per step)"
        )
    if name == "Constant":
        if lr:
            raise YAMLConfigError(f"unknown config key(s) Optimizer.lr.{sorted(lr)} (Constant)")
        return schedulers.WarmupCosineLR(optimizer, train_iter, 1.0, 0, alpha=1.0)
    if name == "CosineAnnealingWithWarmupDecay":
        args = _take(lr, name, ("max_lr", "min_lr", "warmup_rate", "decay_steps"))
        return fleetx_schedulers.CosineAnnealingWithWarmupDecay(
            optimizer,
            max_lr=float(args["max_lr"]),
            min_lr=float(args.get("min_lr", 0.0)),
            warmup_rate=float(args.get("warmup_rate", 0.0)),
            decay_steps=int(args.get("decay_steps") or train_iter),
            increment=int(samples_per_step) if increments else 1,
        )
    if name == "LinearDecayWithWarmup":
        args = _take(lr, name, ("warmup", "total_steps"))
        return fleetx_schedulers.LinearDecayWithWarmup(
            optimizer,
            learning_rate=base_lr(opt_cfg),
            total_steps=int(args.get("total_steps") or train_iter),
            warmup=args.get("warmup", 0),
        )
    if name == "ViTLRScheduler":  # FleetX's epochs x step_each_epoch = the run's steps
        args = _take(lr, name, ("decay_type", "linear_end", "warmup_steps"))
        return fleetx_schedulers.ViTLRScheduler(
            optimizer, learning_rate=base_lr(opt_cfg), total_steps=train_iter, **args
        )
    if name not in LIBAI_SCHEDULERS:
        from libai.fleetx.yaml_loaders import resolve_name

        resolve_name(
            name, dict.fromkeys([*FLEETX_SCHEDULERS, *LIBAI_SCHEDULERS]), "Optimizer.lr.name"
        )
    cls = LIBAI_SCHEDULERS[name]
    ratio = lr.pop("warmup_ratio", None)
    if ratio is not None:
        lr["warmup_iter"] = math.ceil(train_iter * float(ratio))
    lr.setdefault("max_iter", train_iter)
    lr.setdefault("warmup_iter", 0)
    lr.setdefault("warmup_factor", 0.001)
    check_arguments(cls, lr, "Optimizer.lr", reserved=("optimizer", "last_epoch"))
    return cls(optimizer, **lr)


def _take(lr: dict, name: str, keys) -> dict:
    unknown = set(lr) - set(keys)
    if unknown:
        raise YAMLConfigError(
            f"unknown config key(s) Optimizer.lr.{sorted(unknown)} for {name} "
            f"(takes: {', '.join(keys)})"
        )
    if name == "CosineAnnealingWithWarmupDecay" and "max_lr" not in lr:
        raise YAMLConfigError("Optimizer.lr.max_lr is required for CosineAnnealingWithWarmupDecay")
    return lr
