"""SimpleNet: the plain PyTorch network of FleetX's integration example, as a user writes it."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """Residual MLP block: x + Linear(GELU(Linear(x)))."""

    def __init__(self, hidden_size: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, 2 * hidden_size)
        self.fc2 = nn.Linear(2 * hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.fc2(torch.nn.functional.gelu(self.fc1(x))))


class SimpleNet(nn.Module):
    """image [batch, image_size] -> class logits [batch, class_num]."""

    def __init__(
        self,
        image_size: int = 32,
        hidden_size: int = 64,
        num_blocks: int = 4,
        class_num: int = 10,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.embed = nn.Linear(image_size, hidden_size)
        self.blocks = nn.ModuleList(Block(hidden_size, dropout) for _ in range(num_blocks))
        self.head = nn.Linear(hidden_size, class_num)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
