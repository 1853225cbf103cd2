"""Batch samplers that give each data-parallel rank its own micro-batches (LiBai's names).

Both yield lists of dataset indices (one micro-batch each) and are meant as a
``DataLoader(batch_sampler=...)``. Ranks of the same data-parallel group (the tensor- and
pipeline-parallel peers) get the same indices; different data-parallel ranks get disjoint ones.
"""

from __future__ import annotations

import torch


class EpochIndex(int):
    """A dataset index that also says which epoch of :class:`CyclicSampler` asks for it,
    handed to datasets that set ``takes_epoch_index = True`` (e.g. image datasets keying
    their random augmentation on it, identically in every DataLoader worker and after a
    resume). It is an ``int`` everywhere else."""

    epoch: int

    def __new__(cls, index: int, epoch: int):
        obj = super().__new__(cls, index)
        obj.epoch = int(epoch)
        return obj

    def __getnewargs__(self):
        return int(self), self.epoch


def _check_rank(data_parallel_rank: int, data_parallel_size: int, micro_batch_size: int) -> None:
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}.")
    if data_parallel_size < 1 or not 0 <= data_parallel_rank < data_parallel_size:
        raise ValueError(
            f"data_parallel_rank={data_parallel_rank} is not in [0, data_parallel_size="
            f"{data_parallel_size})."
        )


class CyclicSampler(torch.utils.data.Sampler):
    """Endless training batches, reshuffled every epoch, resumable from ``consumed_samples``.

    Each step consumes one *global* group of ``micro_batch_size * data_parallel_size``
    samples: epoch ``e`` orders the dataset with ``randperm(seed + e)`` (or keeps it in order
    when ``shuffle=False``), group ``g`` is positions ``[g * G, (g + 1) * G)`` of that order,
    and data-parallel rank ``r`` takes the ``r``-th micro-batch of the group. The tail that
    does not fill a group is left out of that epoch (a different tail each epoch).

    The order depends only on the dataset, the seed and ``G``, so a run resumed with
    ``consumed_samples=k`` yields exactly the batches an uninterrupted run yields after
    ``k`` samples, and the same samples form each global batch whichever way ``G`` is split
    between micro-batch size and data parallelism.

    Args:
        dataset: a sized dataset.
        micro_batch_size: samples per batch on this rank.
        shuffle: reshuffle every epoch (``seed + epoch``).
        consumed_samples: samples (summed over all data-parallel ranks) already trained on;
            a multiple of ``micro_batch_size * data_parallel_size``.
        data_parallel_rank, data_parallel_size: this rank's place in the data-parallel group.
        seed: base seed of the shuffles.

    A dataset with ``takes_epoch_index = True`` gets :class:`EpochIndex` indices.

    ``consumed_samples`` advances as batches are yielded (a new ``iter()`` continues where the
    last stopped). A ``DataLoader`` with workers draws a few batches ahead, so a trainer
    should checkpoint its own count (iteration x global batch size), not this attribute.
    """

    def __init__(
        self,
        dataset,
        micro_batch_size: int,
        shuffle: bool = False,
        consumed_samples: int = 0,
        data_parallel_rank: int = 0,
        data_parallel_size: int = 1,
        seed: int = 0,
    ):
        _check_rank(data_parallel_rank, data_parallel_size, micro_batch_size)
        self.dataset = dataset
        self.data_size = len(dataset)
        self.shuffle = shuffle
        self.micro_batch_size = int(micro_batch_size)
        self.data_parallel_rank = int(data_parallel_rank)
        self.data_parallel_size = int(data_parallel_size)
        self.actual_batch_size = self.micro_batch_size * self.data_parallel_size
        if self.data_size < self.actual_batch_size:
            raise ValueError(
                f"The dataset has {self.data_size} samples, fewer than one global batch of "
                f"micro_batch_size ({self.micro_batch_size}) x data_parallel_size "
                f"({self.data_parallel_size}) = {self.actual_batch_size}."
            )
        self.active_data_size = self.data_size - self.data_size % self.actual_batch_size
        self.seed = int(seed)
        self.epoch_indices = bool(getattr(dataset, "takes_epoch_index", False))
        self.set_consumed_samples(consumed_samples)

    def set_consumed_samples(self, consumed_samples: int) -> None:
        """Resume: the next ``iter()`` starts after ``consumed_samples`` samples."""
        consumed_samples = int(consumed_samples)
        if consumed_samples < 0 or consumed_samples % self.actual_batch_size:
            raise ValueError(
                f"consumed_samples={consumed_samples} must be a non-negative multiple of "
                f"micro_batch_size x data_parallel_size = {self.actual_batch_size}."
            )
        self.consumed_samples = consumed_samples

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The dataset order of ``epoch`` (all ranks compute the same one)."""
        if not self.shuffle:
            return torch.arange(self.data_size)
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(self.data_size, generator=generator)

    def __iter__(self):
        groups_per_epoch = self.active_data_size // self.actual_batch_size
        epoch, group = divmod(self.consumed_samples // self.actual_batch_size, groups_per_epoch)
        offset = self.data_parallel_rank * self.micro_batch_size
        while True:
            order = self.epoch_order(epoch)
            for g in range(group, groups_per_epoch):
                start = g * self.actual_batch_size + offset
                batch = order[start : start + self.micro_batch_size].tolist()
                if self.epoch_indices:
                    batch = [EpochIndex(i, epoch) for i in batch]
                self.consumed_samples += self.actual_batch_size
                yield batch
            epoch, group = epoch + 1, 0


class SingleRoundSampler(torch.utils.data.Sampler):
    """One pass over the dataset for evaluation, split into contiguous per-rank shards.

    Rank ``r`` of ``n`` reads shard ``r`` (shard sizes differ by at most one sample), in
    order or shuffled with ``seed``, in micro-batches; the last batch may be short unless
    ``drop_last``.
    """

    def __init__(
        self,
        dataset,
        micro_batch_size: int,
        shuffle: bool = False,
        data_parallel_rank: int = 0,
        data_parallel_size: int = 1,
        seed: int = 0,
        drop_last: bool = False,
    ):
        _check_rank(data_parallel_rank, data_parallel_size, micro_batch_size)
        self.dataset = dataset
        self.data_size = len(dataset)
        self.shuffle = shuffle
        self.micro_batch_size = int(micro_batch_size)
        self.data_parallel_rank = int(data_parallel_rank)
        self.data_parallel_size = int(data_parallel_size)
        self.seed = int(seed)
        self.drop_last = drop_last

    def _shard(self) -> tuple[int, int]:
        base, remain = divmod(self.data_size, self.data_parallel_size)
        r = self.data_parallel_rank
        start = r * base + min(r, remain)
        return start, base + (1 if r < remain else 0)

    def __iter__(self):
        start, size = self._shard()
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed)
            local = torch.randperm(size, generator=generator)
        else:
            local = torch.arange(size)
        indices = (local + start).tolist()
        for i in range(0, size, self.micro_batch_size):
            batch = indices[i : i + self.micro_batch_size]
            if len(batch) < self.micro_batch_size and self.drop_last:
                return
            yield batch

    def __len__(self) -> int:
        """Number of batches this rank yields."""
        _, size = self._shard()
        if self.drop_last:
            return size // self.micro_batch_size
        return -(-size // self.micro_batch_size)
