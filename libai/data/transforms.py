"""Image transforms on PIL images and numpy, with torchvision's names and semantics.

(torchvision has no CPU build installable here.) Random transforms take an explicit
``numpy.random.Generator``, so an image dataset can make every sample's augmentation a
function of its seed and index; without one they draw from a fresh, unseeded generator.
Every transform is called as ``transform(image, rng=None)``; :class:`Compose` passes ``rng``
on to the transforms that declare ``uses_rng = True`` and calls plain callables with the
image alone.

:func:`build_image_transform` gives the usual ImageNet pipelines (ViT / DeiT style):

- train: ``RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3))``,
  ``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize(IMAGENET mean / std)``;
- eval: ``Resize(int(size / 0.875))`` (shorter side), ``CenterCrop(size)``, ``ToTensor()``,
  ``Normalize``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import numpy as np
import torch
from PIL import Image

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)

_INTERPOLATION = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


class InterpolationMode(str, Enum):
    """torchvision's / flowvision's interpolation names (``InterpolationMode.BICUBIC``)."""

    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


def str_to_interp_mode(mode: str) -> InterpolationMode:
    """``"bicubic"`` -> ``InterpolationMode.BICUBIC`` (flowvision's ``str_to_interp_mode``)."""
    return InterpolationMode(_interpolation_name(mode))


def _interpolation_name(mode) -> str:
    """The lower-case name of ``mode``: an :class:`InterpolationMode`, its name or value."""
    name = mode.value if isinstance(mode, InterpolationMode) else str(mode).lower()
    if name not in _INTERPOLATION:
        raise ValueError(f"interpolation {mode!r} is not one of {sorted(_INTERPOLATION)}.")
    return name


def _interpolation(mode):
    """The PIL resampling filter of ``mode`` (a name or an :class:`InterpolationMode`)."""
    return _INTERPOLATION[_interpolation_name(mode)]


def _pair(size) -> tuple[int, int]:
    """``(height, width)`` from an int or a pair."""
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def _rng(rng):
    return rng if rng is not None else np.random.default_rng()


def apply_transform(transform, image, rng=None):
    """``transform(image, rng)`` if it takes a generator, else ``transform(image)``."""
    if getattr(transform, "uses_rng", False):
        return transform(image, rng)
    return transform(image)


class Compose:
    """Apply ``transforms`` in order (the generator goes to those that use one)."""

    uses_rng = True

    def __init__(self, transforms: Sequence):
        self.transforms = list(transforms)

    def __call__(self, image, rng=None):
        for t in self.transforms:
            image = apply_transform(t, image, rng)
        return image

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose({inner}\n)"


class RandomResizedCrop:
    """Crop a random area and aspect ratio, then resize to ``size`` (torchvision's rule).

    Ten tries draw an area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``;
    if none fits, the largest centered crop with an aspect ratio in ``ratio`` is taken.
    """

    uses_rng = True

    def __init__(
        self,
        size,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: str = "bicubic",
    ):
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError(f"scale {scale} and ratio {ratio} must be (min, max) ranges.")
        self.size = _pair(size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = _interpolation_name(interpolation)
        self._resample = _interpolation(interpolation)

    def get_params(self, width: int, height: int, rng) -> tuple[int, int, int, int]:
        """``(top, left, crop height, crop width)``."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: Image.Image, rng=None) -> Image.Image:
        top, left, h, w = self.get_params(image.width, image.height, _rng(rng))
        out_h, out_w = self.size
        return image.resize((out_w, out_h), self._resample, box=(left, top, left + w, top + h))

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio="
            f"{tuple(round(r, 4) for r in self.ratio)}, interpolation={self.interpolation})"
        )


class RandomHorizontalFlip:
    """Mirror the image left-right with probability ``p``."""

    uses_rng = True

    def __init__(self, p: float = 0.5):
        self.p = float(p)

    def __call__(self, image: Image.Image, rng=None) -> Image.Image:
        if _rng(rng).random() < self.p:
            return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Resize:
    """Resize: an int sets the shorter side (aspect kept), a pair ``(h, w)`` the exact size."""

    def __init__(self, size, interpolation: str = "bicubic"):
        self.size = size if isinstance(size, int) else _pair(size)
        self.interpolation = _interpolation_name(interpolation)
        self._resample = _interpolation(interpolation)

    def __call__(self, image: Image.Image) -> Image.Image:
        if isinstance(self.size, int):
            w, h = image.size
            short, long = (w, h) if w <= h else (h, w)
            new_long = int(self.size * long / short)
            new_w, new_h = (self.size, new_long) if w <= h else (new_long, self.size)
        else:
            new_h, new_w = self.size
        if (new_w, new_h) == image.size:
            return image
        return image.resize((new_w, new_h), self._resample)

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, interpolation={self.interpolation})"


class CenterCrop:
    """Crop the center ``size`` (int or ``(h, w)``); smaller images are zero-padded first."""

    def __init__(self, size):
        self.size = _pair(size)

    def __call__(self, image: Image.Image) -> Image.Image:
        out_h, out_w = self.size
        w, h = image.size
        if w < out_w or h < out_h:
            canvas = Image.new(image.mode, (max(w, out_w), max(h, out_h)))
            canvas.paste(image, ((canvas.width - w) // 2, (canvas.height - h) // 2))
            image, (w, h) = canvas, canvas.size
        top = int(round((h - out_h) / 2.0))
        left = int(round((w - out_w) / 2.0))
        return image.crop((left, top, left + out_w, top + out_h))

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


class ToTensor:
    """PIL image -> ``float32`` tensor ``[C, H, W]`` in ``[0, 1]``."""

    def __call__(self, image: Image.Image) -> torch.Tensor:
        array = np.asarray(image, dtype=np.uint8)
        if array.ndim == 2:
            array = array[:, :, None]
        tensor = torch.from_numpy(array.transpose(2, 0, 1).copy())
        return tensor.to(torch.float32).div_(255.0)

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """``(x - mean) / std`` per channel of a ``[C, H, W]`` tensor."""

    def __init__(self, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD):
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std}.")

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


def build_image_transform(
    train: bool,
    image_size: int = 224,
    crop_pct: float = 0.875,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
    hflip: float = 0.5,
    interpolation: str = "bicubic",
    mean=IMAGENET_DEFAULT_MEAN,
    std=IMAGENET_DEFAULT_STD,
) -> Compose:
    """The ImageNet train or eval pipeline (see the module docstring)."""
    if train:
        steps = [RandomResizedCrop(image_size, scale, ratio, interpolation)]
        if hflip > 0:
            steps.append(RandomHorizontalFlip(hflip))
    else:
        steps = [Resize(int(image_size / crop_pct), interpolation), CenterCrop(image_size)]
    return Compose(steps + [ToTensor(), Normalize(mean, std)])
