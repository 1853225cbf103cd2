"""Random erasing (Zhong et al., arXiv:1708.04896) with timm's / flowvision's arguments.

With probability ``probability`` a normalized image tensor ``[C, H, W]`` gets ``count``
rectangles (``min_count``..``max_count``), each of area ``U(min_area, max_area) * H * W /
count`` and log-uniform aspect ratio in ``[min_aspect, max_aspect]`` (ten tries for one that
fits), filled with zeros (``mode="const"``), one normal colour per channel (``"rand"``) or
per-pixel normal noise (``"pixel"``). The randomness comes from the generator the dataset
passes (see :mod:`libai.data.transforms`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from libai.data.transforms import _rng

__all__ = ["RandomErasing"]


class RandomErasing:
    """Erase random rectangles of a ``[C, H, W]`` (or ``[B, C, H, W]``) tensor in place."""

    uses_rng = True

    def __init__(
        self,
        probability: float = 0.5,
        min_area: float = 0.02,
        max_area: float = 1 / 3,
        min_aspect: float = 0.3,
        max_aspect: float | None = None,
        mode: str = "const",
        min_count: int = 1,
        max_count: int | None = None,
        num_splits: int = 0,
        device: str = "cpu",
    ):
        self.mode = (mode or "const").lower()
        if self.mode not in ("const", "rand", "pixel"):
            raise ValueError(f"RandomErasing mode {mode!r} is not one of 'const', 'rand', 'pixel'")
        self.probability, self.min_area, self.max_area = float(probability), min_area, max_area
        max_aspect = max_aspect or 1 / min_aspect
        self.log_aspect_ratio = (math.log(min_aspect), math.log(max_aspect))
        self.min_count, self.max_count = int(min_count), int(max_count or min_count)
        self.num_splits = int(num_splits)
        self.device = device  # kept for flowvision's signature; erasing runs where the tensor is

    def _fill(self, shape, rng, dtype, device) -> torch.Tensor:
        if self.mode == "pixel":
            values = rng.standard_normal(shape)
        elif self.mode == "rand":
            values = rng.standard_normal((shape[0], 1, 1))
        else:
            values = np.zeros((shape[0], 1, 1))
        return torch.from_numpy(values).to(dtype=dtype, device=device)

    def _erase(self, img: torch.Tensor, rng) -> None:
        if rng.random() > self.probability:
            return
        chan, img_h, img_w = img.shape
        area = img_h * img_w
        count = (
            self.min_count
            if self.min_count == self.max_count
            else int(rng.integers(self.min_count, self.max_count + 1))
        )
        for _ in range(count):
            for _attempt in range(10):
                target_area = rng.uniform(self.min_area, self.max_area) * area / count
                aspect = math.exp(rng.uniform(*self.log_aspect_ratio))
                h = int(round(math.sqrt(target_area * aspect)))
                w = int(round(math.sqrt(target_area / aspect)))
                if w < img_w and h < img_h:
                    top = int(rng.integers(0, img_h - h + 1))
                    left = int(rng.integers(0, img_w - w + 1))
                    img[:, top : top + h, left : left + w] = self._fill(
                        (chan, h, w), rng, img.dtype, img.device
                    )
                    break

    def __call__(self, tensor: torch.Tensor, rng=None) -> torch.Tensor:
        rng = _rng(rng)
        if tensor.dim() == 3:
            self._erase(tensor, rng)
        else:
            start = tensor.shape[0] // self.num_splits if self.num_splits > 1 else 0
            for i in range(start, tensor.shape[0]):
                self._erase(tensor[i], rng)
        return tensor

    def __repr__(self) -> str:
        return (
            f"RandomErasing(p={self.probability}, mode={self.mode}, count=({self.min_count}, "
            f"{self.max_count}))"
        )
