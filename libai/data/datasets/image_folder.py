"""Image classification samples from a folder per class (torchvision's ``ImageFolder`` layout)::

    root/n01440764/img_001.JPEG
    root/n01440764/...
    root/n01443537/img_417.JPEG

Classes are the sub-folder names, sorted; label ``k`` is the ``k``-th class. Images are
found recursively below each class folder and read with PIL as RGB.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import torch
from PIL import Image

from libai.data.transforms import apply_transform, build_image_transform

#: file extensions that count as images (lower case)
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """Sorted class folder names of ``root`` and their labels."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Image folder not found: {root} is not a directory.")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(
            f"Image folder {root} has no class sub-folders; expected root/<class>/<image> "
            "(one folder per class)."
        )
    return classes, {c: i for i, c in enumerate(classes)}


def make_image_list(
    root: str, class_to_idx: dict[str, int], extensions=IMG_EXTENSIONS
) -> list[tuple[str, int]]:
    """``(path, label)`` of every image below the class folders, sorted per class."""
    extensions = tuple(e.lower() for e in extensions)
    samples, empty = [], []
    for name, label in sorted(class_to_idx.items(), key=lambda kv: kv[1]):
        found = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), followlinks=True):
            dirnames.sort()
            found += [
                (os.path.join(dirpath, f), label)
                for f in sorted(filenames)
                if f.lower().endswith(extensions)
            ]
        if not found:
            empty.append(name)
        samples += found
    if not samples:
        raise ValueError(
            f"Image folder {root} has no images (extensions {', '.join(extensions)}) in its "
            f"{len(class_to_idx)} class folders."
        )
    if empty:
        raise ValueError(
            f"Image folder {root}: no images (extensions {', '.join(extensions)}) in the class "
            f"folder(s) {empty}; remove them or add images."
        )
    return samples


class ImageFolderDataset(torch.utils.data.Dataset):
    """Classification samples ``{"images": [3, H, W] float32, "labels": [] long}``.

    Args:
        root: the folder of class folders.
        train: use the training augmentation (random resized crop + flip) when ``transform``
            is not given; else the eval pipeline (resize, center crop).
        transform: ``transform(image[, rng])`` -> tensor; default
            :func:`libai.data.transforms.build_image_transform` ``(train, image_size)``.
        image_size: output side of the default transforms.
        seed: augmentation seed. Sample ``i`` in epoch ``e`` of the training sampler
            (:class:`~libai.data.samplers.CyclicSampler` hands the epoch with the index) draws
            from ``default_rng([seed, i, e])``: reproducible, different per epoch, the same
            in every DataLoader worker, on every layout and after a resume. Indices without
            an epoch (evaluation, direct ``dataset[i]``) use the ``k``-th read of ``i`` in
            this process instead of ``e``.
        extensions: file extensions that count as images.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: ``root`` has no class folders, or a class folder has no images.
    """

    #: :class:`~libai.data.samplers.CyclicSampler` hands the epoch with each index
    takes_epoch_index = True

    def __init__(
        self,
        root,
        train: bool = True,
        transform=None,
        image_size: int = 224,
        seed: int = 0,
        extensions=IMG_EXTENSIONS,
    ):
        self.root = os.fspath(root)
        self.train = bool(train)
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_image_list(self.root, self.class_to_idx, extensions)
        self.targets = [label for _, label in self.samples]
        self.transform = (
            transform if transform is not None else build_image_transform(self.train, image_size)
        )
        self.seed = int(seed)
        self._reads: Counter = Counter()

    def __len__(self) -> int:
        return len(self.samples)

    def load_image(self, idx: int) -> Image.Image:
        path = self.samples[idx][0]
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        epoch = getattr(idx, "epoch", None)
        idx = int(idx)
        image = self.load_image(idx)
        if epoch is None:
            epoch = self._reads[idx]
            self._reads[idx] += 1
        rng = np.random.default_rng([self.seed, idx, epoch])
        images = apply_transform(self.transform, image, rng)
        if not isinstance(images, torch.Tensor):
            images = torch.as_tensor(np.asarray(images))
        return {
            "images": images.to(torch.float32),
            "labels": torch.tensor(self.samples[idx][1], dtype=torch.long),
        }

    def __repr__(self) -> str:
        return (
            f"ImageFolderDataset(root={self.root!r}, train={self.train}, "
            f"{len(self.classes)} classes, {len(self.samples)} images)"
        )
