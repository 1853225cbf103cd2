"""Optimizer defaults (LiBai's ``optim`` namespace): AdamW with no weight decay on norms and
biases. The trainer fills ``optim.params.model``; the clip settings are read from the
parameter groups (gradients are clipped by the global norm)."""

import torch

from libai.config import LazyCall
from libai.optim import get_default_optimizer_params

optim = LazyCall(torch.optim.AdamW)(
    params=LazyCall(get_default_optimizer_params)(
        # params.model is set to the model object before instantiation
        clip_grad_max_norm=1.0,
        clip_grad_norm_type=2.0,
        weight_decay_norm=0.0,
        weight_decay_bias=0.0,
    ),
    lr=1e-4,
    weight_decay=0.01,
    betas=(0.9, 0.999),
    eps=1e-8,
)
