"""Tiny stand-ins for the image datasets LiBai's vision configs read: an ImageNet folder
(root/train, root/val of class folders) and CIFAR-100's python pickles."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
from PIL import Image


def write_imagenet(root: Path, classes=("n01", "n02"), per_class=(("train", 8), ("val", 2))):
    """root/train and root/val of ``classes``, random RGB images of 32..43 pixels a side (so
    the crops and resizes have work to do). Returns ``root``."""
    rng = np.random.default_rng(0)
    for split, n in per_class:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                h, w = int(rng.integers(32, 44)), int(rng.integers(32, 44))
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"{i}.png")
    return root


def cifar100_entry(n: int, seed: int, keys_as_bytes: bool = True):
    """A CIFAR-100 pickle's dict as the real one: data uint8 [N, 3072] (R, G, B planes of
    32x32) and 100 fine labels. Returns ``(entry, data, labels)``."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 100, n)]
    k = (lambda s: s.encode()) if keys_as_bytes else (lambda s: s)
    entry = {k("data"): data, k("fine_labels"): labels, k("coarse_labels"): [0] * n}
    return entry, data, labels


def write_cifar100(root: Path, train: int = 8, test: int = 4) -> Path:
    """root/cifar-100-python/{train,test} pickles (CIFAR-100's layout). Returns ``root``."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", train, 1), ("test", test, 2)):
        entry, _, _ = cifar100_entry(n, seed)
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
    return root
