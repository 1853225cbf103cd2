"""libai: LiBai-style large Transformer training and serving on PyTorch DTensor."""

from __future__ import annotations

import re

__version__ = "0.1.0"

#: the oldest PyTorch release libai supports: the whole test suite passes on 2.10, 2.11 and
#: 2.13 (README, "Supported PyTorch"). Before 2.10, torch.distributed.pipelining's first p2p
#: exchange mixes dtypes (2.9) and its schedules have no ``eval`` (2.8).
MIN_TORCH = (2, 10)


def check_torch_version(version: str) -> None:
    """Raise ``ImportError`` naming the fix when ``version`` (``torch.__version__``) is older
    than :data:`MIN_TORCH`; local and pre-release tags (``+cu128``, ``a0``) are ignored."""
    match = re.match(r"(\d+)\.(\d+)", str(version))
    if match is None:
        raise ImportError(f"libai cannot read the PyTorch version {version!r}")
    if (int(match[1]), int(match[2])) < MIN_TORCH:
        floor = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"libai needs PyTorch >= {floor}, but torch {version} is installed "
            f"(before {floor}, torch.distributed.pipelining cannot run libai's pipeline-"
            f"parallel schedules; see the README's 'Supported PyTorch'). Upgrade it: "
            f"pip install 'torch>={floor}'."
        )


def _check_installed_torch() -> None:
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            "libai needs PyTorch: pip install torch==2.13.0 (or your cluster's CUDA build, "
            f">= {'.'.join(map(str, MIN_TORCH))})"
        ) from error
    check_torch_version(torch.__version__)


_check_installed_torch()
