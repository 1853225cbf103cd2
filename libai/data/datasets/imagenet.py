"""ImageNet-style classification (LiBai's ``ImageNetDataset``): ``root/train/<class>/<image>``
and ``root/val/<class>/<image>``, samples as LiBai's ``Instance``."""

from __future__ import annotations

import os

from libai.data.datasets.image_folder import ImageFolderDataset
from libai.data.structures import DistTensorData, Instance

__all__ = ["ImageNetDataset", "as_instance"]


def as_instance(sample: dict) -> Instance:
    """``{"images", "labels"}`` -> LiBai's ``Instance``: images read by the first pipeline
    stage (``placement_idx=0``), labels by the last (``-1``)."""
    return Instance(
        images=DistTensorData(sample["images"], placement_idx=0),
        labels=DistTensorData(sample["labels"], placement_idx=-1),
    )


class ImageNetDataset(ImageFolderDataset):
    """ImageNet 2012 classification in LiBai's layout and signature.

    Args:
        root: the folder holding ``train/`` and ``val/``, each a folder per class.
        train: read ``root/train`` (else ``root/val``).
        transform: ``transform(image[, rng])`` -> ``[3, H, W]`` tensor (e.g. a
            ``flowvision.transforms.Compose`` of a LiBai config); default: the ImageNet
            train / eval pipeline of :class:`ImageFolderDataset`.
        **kwargs: :class:`ImageFolderDataset`'s ``image_size``, ``seed``, ``extensions``.
    """

    def __init__(self, root: str, train: bool = True, transform=None, **kwargs):
        self.dataset_root = os.fspath(root)
        split = os.path.join(self.dataset_root, "train" if train else "val")
        if not os.path.isdir(split):
            raise FileNotFoundError(
                f"ImageNetDataset: {split} is not a directory; root={self.dataset_root!r} must "
                "hold train/ and val/ with one folder per class (set the config's "
                "dataloader...dataset.root)."
            )
        super().__init__(split, train=train, transform=transform, **kwargs)

    def __getitem__(self, idx: int) -> Instance:
        return as_instance(super().__getitem__(idx))
