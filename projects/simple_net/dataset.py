"""A random classification dataset: images are random vectors, labels a fixed function of
them (so a network can learn it); the same seed gives the same samples on every rank."""

from __future__ import annotations

import numpy as np
import torch


class RandomDataset(torch.utils.data.Dataset):
    def __init__(self, num_samples: int = 512, image_size: int = 32, class_num: int = 10, seed=0):
        rng = np.random.default_rng(seed)
        self.images = rng.standard_normal((num_samples, image_size)).astype(np.float32)
        projection = np.random.default_rng(1234).standard_normal((image_size, class_num))
        self.labels = (self.images @ projection).argmax(axis=1).astype(np.int64)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index):
        return torch.from_numpy(self.images[index]), torch.tensor(self.labels[index])
