"""FleetX's image classification list dataset (``GeneralClsDataset``) and its
``transform_ops`` (PaddleClas' operator names), on PIL / numpy.

``cls_label_path`` lists one image a line, ``<path relative to image_root><delimiter>
<label>``; a sample is ``{"images": float32 [C, H, W], "labels": int64}`` after the ops,
each a one-key mapping ``{OpName: {args}}``:

- ``DecodeImage`` (``to_rgb``, ``channel_first``): the file's bytes -> an RGB image;
- ``RandCropImage`` (``size``, ``scale``, ``ratio``, ``interpolation``): random resized crop;
- ``RandFlipImage`` (``flip_code: 1``): horizontal flip with probability 1/2;
- ``ResizeImage`` (``resize_short`` or ``size``, ``interpolation``); ``CenterCropImage``
  (``size``);
- ``NormalizeImage`` (``scale`` such as ``1.0/255.0``, ``mean``, ``std``, ``order``):
  ``(pixel × scale - mean) / std`` per channel, as float32 HWC;
- ``ToCHWImage``: HWC -> CHW.

``backend`` / ``use_shared_memory``-style switches of Paddle's loaders are accepted and
change nothing. The random ops draw from a generator seeded per sample (``seed + index``),
so a sample is the same on every rank and in every worker.
"""

from __future__ import annotations

import io
import os

import numpy as np
import torch
from PIL import Image

from libai.data.transforms import CenterCrop, RandomResizedCrop, Resize

__all__ = ["GeneralClsDataset", "build_transform_ops"]


def _scale(value) -> float:
    """``1.0/255.0`` (a string in FleetX's files) or a number."""
    if isinstance(value, str):
        num, _, den = value.partition("/")
        return float(num) / float(den or 1)
    return float(value)


class _Decode:
    def __init__(self, to_rgb=True, channel_first=False):
        if channel_first:
            raise ValueError("DecodeImage.channel_first=True: put ToCHWImage last instead")

    def __call__(self, data, rng):
        return Image.open(io.BytesIO(data)).convert("RGB")


class _RandCrop:
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), interpolation="bilinear",
                 backend="pil"):  # fmt: skip
        self.crop = RandomResizedCrop(size, tuple(scale), tuple(ratio), interpolation or "bilinear")

    def __call__(self, image, rng):
        return self.crop(image, rng)


class _RandFlip:
    def __init__(self, flip_code=1):
        if flip_code != 1:
            raise ValueError(
                f"RandFlipImage.flip_code={flip_code}: only 1 (horizontal) is supported"
            )

    def __call__(self, image, rng):
        if rng.random() < 0.5:
            return image.transpose(Image.FLIP_LEFT_RIGHT)
        return image


class _Resize:
    def __init__(self, resize_short=None, size=None, interpolation="bilinear", backend="pil"):
        if (resize_short is None) == (size is None):
            raise ValueError("ResizeImage: give resize_short or size")
        self.resize = Resize(resize_short if size is None else size, interpolation or "bilinear")

    def __call__(self, image, rng):
        return self.resize(image)


class _CenterCrop:
    def __init__(self, size=224):
        self.crop = CenterCrop(size)

    def __call__(self, image, rng):
        return self.crop(image)


class _Normalize:
    def __init__(self, scale=None, mean=None, std=None, order="", output_fp16=False,
                 channel_num=3):  # fmt: skip
        if order not in ("", "hwc"):
            raise ValueError(f"NormalizeImage.order={order!r}: put ToCHWImage after it instead")
        self.scale = _scale(scale if scale is not None else 1.0 / 255.0)
        self.mean = np.asarray(mean if mean is not None else [0.485, 0.456, 0.406], np.float32)
        self.std = np.asarray(std if std is not None else [0.229, 0.224, 0.225], np.float32)

    def __call__(self, image, rng):
        array = np.asarray(image, dtype=np.float32) * self.scale
        return (array - self.mean) / self.std


class _ToCHW:
    def __call__(self, array, rng):
        return np.ascontiguousarray(np.asarray(array).transpose(2, 0, 1))


OPS = {
    "DecodeImage": _Decode,
    "RandCropImage": _RandCrop,
    "RandFlipImage": _RandFlip,
    "ResizeImage": _Resize,
    "CenterCropImage": _CenterCrop,
    "NormalizeImage": _Normalize,
    "ToCHWImage": _ToCHW,
}


def build_transform_ops(ops) -> list:
    """FleetX's ``transform_ops`` list as callables ``op(data, generator)``."""
    built = []
    for op in ops or []:
        if not isinstance(op, dict) or len(op) != 1:
            raise ValueError(f"transform_ops: each entry is one {{OpName: args}}, got {op!r}")
        ((name, args),) = op.items()
        if name not in OPS:
            raise ValueError(f"transform_ops: unknown op {name!r} (known: {', '.join(OPS)})")
        built.append(OPS[name](**(args or {})))
    return built


class GeneralClsDataset(torch.utils.data.Dataset):
    """FleetX's ``GeneralClsDataset`` (see the module doc). ``seed`` is filled by the
    Engine (``Global.seed``)."""

    def __init__(self, image_root, cls_label_path, transform_ops=None, delimiter=" ",
                 multi_label=False, class_num=None, seed: int = 0):  # fmt: skip
        if multi_label:
            raise ValueError("GeneralClsDataset.multi_label=True is not supported here")
        if not os.path.isfile(cls_label_path):
            raise FileNotFoundError(f"GeneralClsDataset.cls_label_path={cls_label_path} is missing")
        self.items = []
        with open(cls_label_path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    path, label = line.strip().split(delimiter)[:2]
                    self.items.append((os.path.join(image_root, path), int(label)))
        self.ops, self.seed = build_transform_ops(transform_ops), int(seed)
        if not self.ops or not isinstance(self.ops[0], _Decode):
            self.ops.insert(0, _Decode())

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        path, label = self.items[idx]
        with open(path, "rb") as f:
            data = f.read()
        rng = np.random.default_rng(self.seed + idx)
        for op in self.ops:
            data = op(data, rng)
        return {"images": torch.as_tensor(np.asarray(data, np.float32)), "labels": label}
