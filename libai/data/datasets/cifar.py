"""CIFAR-10 / CIFAR-100 from the local python-pickle files (LiBai's ``CIFAR10Dataset`` /
``CIFAR100Dataset``; torchvision's layout).

``root/cifar-100-python/{train,test}`` (``cifar-10-batches-py/data_batch_1..5, test_batch``
for CIFAR-10) are pickled dicts with ``data`` (``uint8 [N, 3072]``, channel-major 32x32
images) and ``fine_labels`` (``labels`` for CIFAR-10). Nothing is downloaded: the files are
read through an unpickler that admits only numpy arrays and builtin values, and a missing
file is a clear error.
"""

from __future__ import annotations

import os
import pickle
from collections import Counter

import numpy as np
import torch
from PIL import Image

from libai.data.datasets.imagenet import as_instance
from libai.data.transforms import apply_transform, build_image_transform

__all__ = ["CIFAR10Dataset", "CIFAR100Dataset", "read_cifar_batch"]

_NUMPY_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Builtin values and numpy arrays only: a data file cannot run code."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _NUMPY_GLOBALS:
            raise pickle.UnpicklingError(
                f"{module}.{name} is not allowed in a CIFAR data file (numpy arrays only)"
            )
        return super().find_class(module, name)


def read_cifar_batch(path: str, label_key: str) -> tuple[np.ndarray, list[int]]:
    """``(images uint8 [N, 32, 32, 3], labels)`` of one CIFAR pickle file."""
    with open(path, "rb") as f:
        entry = _ArrayUnpickler(f, encoding="latin1").load()
    entry = {k.decode() if isinstance(k, bytes) else k: v for k, v in entry.items()}
    if "data" not in entry or label_key not in entry:
        raise ValueError(
            f"{path} is not a CIFAR batch: it has keys {sorted(entry)}, expected 'data' and "
            f"{label_key!r}"
        )
    data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return data.transpose(0, 2, 3, 1), [int(y) for y in entry[label_key]]


class CIFAR10Dataset(torch.utils.data.Dataset):
    """CIFAR-10 from ``root/cifar-10-batches-py`` (LiBai's signature).

    Args:
        root: the folder holding the dataset's folder.
        train: the training files (else the test file).
        transform: ``transform(image[, rng])`` -> tensor; default: the ImageNet train / eval
            pipeline at 32 pixels.
        download: accepted for LiBai's signature; nothing is downloaded here, so missing
            files are an error either way.
        seed: augmentation seed (as :class:`~libai.data.datasets.ImageFolderDataset`).
    """

    takes_epoch_index = True

    base_folder = "cifar-10-batches-py"
    train_files = tuple(f"data_batch_{i}" for i in range(1, 6))
    test_files = ("test_batch",)
    label_key = "labels"
    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"

    def __init__(
        self, root: str, train: bool = True, transform=None, download: bool = False, seed: int = 0
    ):
        self.root, self.train = os.fspath(root), bool(train)
        folder = os.path.join(self.root, self.base_folder)
        files = [os.path.join(folder, f) for f in (self.train_files if train else self.test_files)]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            how = (
                "download=True cannot fetch it here (no downloads at run time); "
                if download
                else ""
            )
            raise FileNotFoundError(
                f"{type(self).__name__}: {missing[0]} not found; {how}extract {self.url} "
                f"into root={self.root!r} (set the config's dataloader...dataset.root)."
            )
        images, labels = [], []
        for path in files:
            data, targets = read_cifar_batch(path, self.label_key)
            images.append(data)
            labels += targets
        self.data = np.concatenate(images)
        self.targets = labels
        self.transform = transform if transform is not None else build_image_transform(train, 32)
        self.seed = int(seed)
        self._reads: Counter = Counter()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int):
        epoch = getattr(idx, "epoch", None)  # see ImageFolderDataset
        idx = int(idx)
        if epoch is None:
            epoch = self._reads[idx]
            self._reads[idx] += 1
        rng = np.random.default_rng([self.seed, idx, epoch])
        images = apply_transform(self.transform, Image.fromarray(self.data[idx]), rng)
        if not isinstance(images, torch.Tensor):
            images = torch.as_tensor(np.asarray(images))
        labels = torch.tensor(self.targets[idx], dtype=torch.long)
        return as_instance({"images": images.to(torch.float32), "labels": labels})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r}, train={self.train}, {len(self)} images)"


class CIFAR100Dataset(CIFAR10Dataset):
    """CIFAR-100 (fine labels) from ``root/cifar-100-python/{train,test}``; see
    :class:`CIFAR10Dataset` for the arguments."""

    base_folder = "cifar-100-python"
    train_files = ("train",)
    test_files = ("test",)
    label_key = "fine_labels"
    url = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
