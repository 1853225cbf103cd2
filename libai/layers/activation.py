"""LiBai's activation modules by name: ``build_activation("gelu")`` -> ``nn.GELU()``."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ACTIVATION_MODULES", "build_activation"]


class SquaredReLU(nn.Module):
    """``relu(x) ** 2`` (Primer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).square()


class GeLUTanh(nn.Module):
    """GELU with the tanh approximation (GPT-2's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate="tanh")


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)`` (CLIP's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


#: LiBai's activation names -> module classes
ACTIVATION_MODULES = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": GeLUTanh,
    "leaky_relu": nn.LeakyReLU,
    "squared_relu": SquaredReLU,
    "tanh": nn.Tanh,
    "quick_gelu": QuickGELU,
    "silu": nn.SiLU,
}


def build_activation(activation: str | None) -> nn.Module:
    """The activation module named ``activation`` (:data:`ACTIVATION_MODULES`); ``None`` or
    ``""``: the identity. An unknown name raises naming the known ones."""
    if not activation:
        return nn.Identity()
    name = str(getattr(activation, "value", activation))
    if name not in ACTIVATION_MODULES:
        raise ValueError(f"unknown activation {name!r}; one of {sorted(ACTIVATION_MODULES)}")
    return ACTIVATION_MODULES[name]()
