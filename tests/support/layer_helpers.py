"""Shared pieces of the layer tests (tests/unit/layers): a one-process mesh around each test
and seeded random tensors."""

from __future__ import annotations

import pytest
import torch

from libai import dist


@pytest.fixture(autouse=True)
def single_process():
    """A world of one process (``dist.setup_dist_util({})``) for each test; import it into a
    test module to use it there."""
    dist.setup_dist_util({})
    yield
    dist.reset_dist_util()


def randn(*shape, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.randn(*shape)`` from its own generator seeded with ``seed``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
