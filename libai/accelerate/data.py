"""Local data through the ``datasets`` library (nothing is downloaded), Megatron indexed data
for pretraining, and the loaders every way in uses (the core's resumable samplers)."""

from __future__ import annotations

import os

import torch

from libai import dist
from libai.data.build import loader_generator, trivial_batch_collator
from libai.data.samplers import CyclicSampler, SingleRoundSampler

__all__ = ["build_loader", "load_local_dataset", "pretraining_datasets"]


def load_local_dataset(path: str, flag: str = "--data-path"):
    """The ``train`` split of local data: a CSV / TSV, JSON (lines), parquet or arrow file, a
    ``datasets.save_to_disk`` directory or a dataset repository directory (see
    :func:`~libai.accelerate.hub_data.load_data`). Raises for anything that is not a local
    path."""
    from libai.accelerate.hub_data import load_data, offline_by_default

    offline_by_default()
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{flag} {path!r} is not a local file or directory; pass a local CSV, JSON lines, "
            "parquet file or a dataset directory"
        )
    splits = load_data(path, None, flag)
    if "train" not in splits:
        raise ValueError(f"{flag} {path}: a DatasetDict without a 'train' split")
    return splits["train"]


def pretraining_datasets(args, num_samples: list[int]):
    """``(train, valid)`` GPT samples from the ``--data-path`` .bin/.idx prefix split by
    ``--split`` (Megatron's data, as ``tools/preprocess_data.py`` writes it)."""
    from libai.config import LazyCall
    from libai.data.build import build_train_valid_test_datasets
    from libai.data.data_utils import get_indexed_dataset
    from libai.data.datasets.gpt_dataset import GPT2Dataset

    split = [float(x) for x in str(args.split).split(",")]
    split += [0.0] * (3 - len(split))
    config = LazyCall(GPT2Dataset)(
        name="pretraining",
        data_prefix=args.data_path,
        indexed_dataset=LazyCall(get_indexed_dataset)(
            data_prefix=args.data_path, data_impl=args.data_impl, skip_warmup=False
        ),
        max_seq_length=args.seq_length,
        seed=args.seed,
    )
    train, valid, _ = build_train_valid_test_datasets(config, [split], [1.0], [*num_samples, 0])
    return train, valid


def build_loader(
    dataset,
    batch_size: int,
    *,
    train: bool,
    seed: int,
    collate_fn=None,
    consumed_samples: int = 0,
    num_workers: int = 0,
):
    """This data-parallel rank's loader: endless, reshuffled every epoch and resumable for
    training (:class:`CyclicSampler`); one sharded pass for evaluation."""
    common = dict(
        dataset=dataset,
        micro_batch_size=batch_size,
        data_parallel_rank=dist.get_data_parallel_rank(),
        data_parallel_size=dist.get_data_parallel_size(),
        seed=seed,
    )
    if train:
        sampler = CyclicSampler(shuffle=True, consumed_samples=consumed_samples, **common)
    else:
        sampler = SingleRoundSampler(shuffle=False, **common)
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=collate_fn or trivial_batch_collator,
        generator=loader_generator(seed),
    )
