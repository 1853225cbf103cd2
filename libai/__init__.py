"""libai: LiBai-style large Transformer training and serving on PyTorch DTensor."""

from __future__ import annotations

import re

__version__ = "0.1.0"

#: the oldest PyTorch release libai supports: the oldest the whole test suite passed on.
#: Older releases fail pipeline parallel in torch.distributed.pipelining (README, "Supported
#: PyTorch", lists what fails on 2.8, 2.9, 2.10 and 2.11).
MIN_TORCH = (2, 13)


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
            f"(before {floor}, torch.distributed.pipelining fails libai's pipeline-parallel "
            f"runs; see the README's 'Supported PyTorch'). Upgrade it: "
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
