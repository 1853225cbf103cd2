"""Split strings (``"949,50,1"``) and weighted blending of several datasets (Megatron's rules)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

SPLIT_NAMES = ("train", "valid", "test")


def parse_splits(splits) -> list[float]:
    """``"949,50,1"`` / ``"949/50/1"`` / ``[949, 50, 1]`` -> normalized ``[train, valid, test]``.

    Missing trailing entries are 0 (``"98,2"`` has no test split).
    """
    if isinstance(splits, str):
        text = splits.replace("/", ",")
        try:
            values = [float(s) for s in text.split(",") if s.strip()]
        except ValueError:
            raise ValueError(
                f"Bad split string {splits!r}: expected up to three numbers like '949,50,1'."
            ) from None
    else:
        values = [float(s) for s in splits]
    if not 1 <= len(values) <= 3:
        raise ValueError(f"Bad splits {splits!r}: give 1 to 3 weights (train, valid, test).")
    if any(v < 0 or not math.isfinite(v) for v in values):
        raise ValueError(f"Bad splits {splits!r}: weights must be finite and non-negative.")
    values += [0.0] * (3 - len(values))
    total = sum(values)
    if total <= 0:
        raise ValueError(f"Bad splits {splits!r}: the weights sum to 0.")
    return [v / total for v in values]


def get_train_valid_test_split_(size: int, splits) -> list[int]:
    """Document boundaries ``[0, train_end, valid_end, size]`` for ``size`` documents.

    Same rounding as Megatron-LM / LiBai: each part gets ``round(weight * size)`` documents
    and the rounding error is taken from the train part.
    """
    fractions = parse_splits(splits)
    index = [0]
    for fraction in fractions:
        index.append(index[-1] + int(round(fraction * float(size))))
    diff = index[-1] - size
    for i in range(1, len(index)):
        index[i] -= diff
    index = [max(0, i) for i in index]
    assert len(index) == 4 and index[-1] == size
    return index


def normalize_weights(weights: Sequence[float]) -> np.ndarray:
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1 or len(weights) == 0 or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"Bad dataset weights {list(weights)}: need non-negative, sum > 0.")
    return weights / weights.sum()


def samples_per_dataset(num_samples: int, weights: Sequence[float]) -> list[int]:
    """How many samples to build from each blended dataset (with Megatron's 0.5% margin)."""
    return [int(math.ceil(num_samples * w * 1.005)) for w in normalize_weights(weights)]


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron's greedy blending: sample ``i`` comes from the dataset furthest behind its share.

    Returns ``(dataset_index, dataset_sample_index)``, both of length ``size``.
    """
    weights = normalize_weights(weights)
    dataset_index = np.zeros(size, dtype=np.int64)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    counts = np.zeros(len(weights), dtype=np.int64)
    for i in range(size):
        errors = weights * max(i, 1) - counts
        choice = int(np.argmax(errors))
        dataset_index[i] = choice
        dataset_sample_index[i] = counts[choice]
        counts[choice] += 1
    return dataset_index, dataset_sample_index


class BlendableDataset:
    """Interleave several datasets in proportion to ``weights`` (a fixed, seed-free order)."""

    def __init__(self, datasets: Sequence, weights: Sequence[float], size: int | None = None):
        self.datasets = list(datasets)
        if len(self.datasets) != len(weights):
            raise ValueError(
                f"{len(self.datasets)} datasets but {len(weights)} weights; give one weight each."
            )
        self.size = int(size) if size is not None else sum(len(d) for d in self.datasets)
        self.dataset_index, self.dataset_sample_index = build_blending_indices(weights, self.size)
        for d, ds in enumerate(self.datasets):
            used = self.dataset_sample_index[self.dataset_index == d]
            if len(used) and used.max() >= len(ds):
                raise ValueError(
                    f"dataset {d} has {len(ds)} samples but blending needs {used.max() + 1}; "
                    "build it with more samples (samples_per_dataset gives the counts)."
                )

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int):
        d = self.dataset_index[idx]
        return self.datasets[d][int(self.dataset_sample_index[idx])]
