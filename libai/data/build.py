"""Build train / valid / test data loaders (LiBai's builder functions): NLP pretraining on
indexed datasets, fine-tuning datasets, and image classification.

A dataset argument is a ``LazyCall`` config (``{"_target_": GPT2Dataset, ...}``, as in
``configs/common/data/gpt_dataset.py``), an already built dataset, or a list of them. For
``build_nlp_train_val_test_loader`` configs are preferred: the builder opens each indexed
dataset once and builds one dataset per split with that split's documents and sample count.
Batches are dicts of stacked tensors, e.g. ``{"input_ids": [B, S], "labels": [B, S]}``.

GPT datasets are split by sequences (Megatron's rule for GPT); datasets whose class sets
``split_by_document = True`` (BERT, RoBERTa, T5: documents made of several sentences) are
split by documents, so no document straddles two splits. ``build_nlp_train_loader`` (SFT
and other ready-made datasets) and ``build_image_train_loader`` / ``build_image_test_loader``
take the datasets as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch
from omegaconf import ListConfig
from torch.utils.data import ConcatDataset, DataLoader

from libai import dist
from libai.config.instantiate import instantiate, is_lazy_node, locate
from libai.data.data_utils.dataset_utils import (
    SPLIT_NAMES,
    BlendableDataset,
    get_train_valid_test_split_,
    samples_per_dataset,
)
from libai.data.data_utils.indexed_dataset import get_indexed_dataset
from libai.data.datasets.gpt_dataset import GPT2Dataset
from libai.data.samplers import CyclicSampler, SingleRoundSampler
from libai.data.structures import Instance

logger = logging.getLogger(__name__)


def _as_list(obj) -> list:
    """A list, tuple or ListConfig as a list; anything else as a 1-element list."""
    if obj is None:
        return []
    if isinstance(obj, (list, tuple, ListConfig)):
        return list(obj)
    return [obj]


def _build_obj(obj):
    return instantiate(obj) if is_lazy_node(obj) else obj


# ---- collate ----------------------------------------------------------------------------------
def trivial_batch_collator(batch: list):
    """Stack a list of dict samples (or LiBai's ``Instance`` samples) into one dict of
    ``[batch, ...]`` tensors."""
    if not batch:
        raise ValueError("cannot collate an empty batch")
    first = batch[0]
    if isinstance(first, Instance):
        return Instance.stack(batch).to_dict()
    if isinstance(first, Mapping):
        keys = list(first.keys())
        for sample in batch[1:]:
            if list(sample.keys()) != keys:
                raise ValueError(f"samples have different keys: {keys} vs {list(sample.keys())}")
        return {k: torch.stack([torch.as_tensor(s[k]) for s in batch]) for k in keys}
    return torch.utils.data.default_collate(batch)


# ---- the per-split datasets -------------------------------------------------------------------
def _open_indexed(ds_cfg):
    if is_lazy_node(ds_cfg):
        indexed = ds_cfg.get("indexed_dataset")
        if indexed is not None:
            return _build_obj(indexed)
        prefix = ds_cfg.get("data_prefix")
    else:
        if getattr(ds_cfg, "indexed_dataset", None) is not None:
            return ds_cfg.indexed_dataset
        prefix = getattr(ds_cfg, "data_prefix", None)
    if prefix is None:
        raise ValueError("each dataset needs an indexed_dataset or a data_prefix")
    return get_indexed_dataset(prefix)


def _dataset_class(ds_cfg):
    if is_lazy_node(ds_cfg):
        target = ds_cfg["_target_"]
        return locate(target) if isinstance(target, str) else target
    return type(ds_cfg)


def _num_split_units(ds_cfg, indexed) -> int:
    """What a split string divides: documents (rows of ``doc_idx``) for datasets that say
    ``split_by_document = True`` (BERT, RoBERTa, T5), else sequences (GPT, as Megatron)."""
    if getattr(_dataset_class(ds_cfg), "split_by_document", False):
        return max(len(indexed.doc_idx) - 1, 0)
    return len(indexed)


def _split_dataset(ds_cfg, indexed, documents, num_samples, split_name: str):
    """One dataset over ``documents`` with ``num_samples`` samples (config or dataset)."""
    if is_lazy_node(ds_cfg):
        name = ds_cfg.get("name", "gpt-2")
        return instantiate(
            ds_cfg,
            name=f"{name}/{split_name}",
            indexed_dataset=indexed,
            documents=documents,
            max_num_samples=num_samples,
        )
    if isinstance(ds_cfg, GPT2Dataset):
        return GPT2Dataset(
            name=f"{ds_cfg.name}/{split_name}",
            data_prefix=ds_cfg.data_prefix,
            indexed_dataset=indexed,
            max_seq_length=ds_cfg.max_seq_length,
            max_num_samples=num_samples,
            seed=ds_cfg.seed,
            tokenizer=ds_cfg.tokenizer,
            documents=documents,
        )
    if callable(getattr(ds_cfg, "for_split", None)):  # BertDataset, RobertaDataset, T5Dataset
        return ds_cfg.for_split(
            name=f"{ds_cfg.name}/{split_name}",
            indexed_dataset=indexed,
            documents=documents,
            max_num_samples=num_samples,
        )
    raise TypeError(
        f"build_nlp_train_val_test_loader needs LazyCall dataset configs (or GPT2Dataset / "
        f"BertDataset / RobertaDataset / T5Dataset objects) to split them into "
        f"train/valid/test, got {type(ds_cfg).__name__}."
    )


def build_train_valid_test_datasets(
    dataset,
    splits,
    weights=None,
    train_val_test_num_samples=None,
) -> tuple:
    """``(train, valid, test)`` datasets.

    A split asked for 0 samples is ``None``. A dataset whose valid or test share is empty
    (e.g. the 1/1000 test share of fewer than 500 documents) is left out of that split with
    a warning, and the split is ``None`` when no dataset is left. An empty train share is an
    error.

    Args:
        dataset: a dataset config (or list of them), see the module docstring.
        splits: one split per dataset, e.g. ``[[949.0, 50.0, 1.0]]`` or ``["949,50,1"]``.
        weights: one blending weight per dataset (used when there are several).
        train_val_test_num_samples: samples per split; ``None`` (or a ``None`` entry) = one
            epoch of that split's documents.
    """
    datasets = _as_list(dataset)
    splits = _as_list(splits)
    weights = [1.0] * len(datasets) if weights is None else [float(w) for w in weights]
    if not datasets:
        raise ValueError("dataloader.train.dataset is empty.")
    if splits and isinstance(splits[0], (int, float)):  # one split given flat: [949, 50, 1]
        splits = [splits]
    if len(splits) == 1 and len(datasets) > 1:
        splits = splits * len(datasets)
    if len(splits) != len(datasets) or len(weights) != len(datasets):
        raise ValueError(
            f"dataloader.train has {len(datasets)} dataset(s) but {len(splits)} splits and "
            f"{len(weights)} weights; give one split (e.g. [949.0, 50.0, 1.0]) and one weight "
            "per dataset."
        )
    nums = list(train_val_test_num_samples or [None, None, None])
    if len(nums) != 3:
        raise ValueError(f"train_val_test_num_samples must have 3 entries, got {nums}.")

    indexed = [_open_indexed(d) for d in datasets]
    boundaries = [
        get_train_valid_test_split_(_num_split_units(d, ix), s)
        for d, ix, s in zip(datasets, indexed, splits)
    ]
    result = []
    for s, split_name in enumerate(SPLIT_NAMES):
        num = nums[s]
        if num is not None and int(num) <= 0:
            result.append(None)
            continue
        empty = [d for d, b in enumerate(boundaries) if b[s + 1] <= b[s]]
        for d in empty:
            msg = (
                f"The {split_name} split of dataset {d} is empty: splits {list(splits[d])} of its "
                f"{boundaries[d][-1]} documents give {split_name} documents "
                f"[{boundaries[d][s]}, {boundaries[d][s + 1]}). Use more documents or give this "
                "split a larger share"
            )
            if split_name == "train":
                raise ValueError(msg + ".")
            logger.warning("%s; it is left out of the %s data.", msg, split_name)
        used = [d for d in range(len(datasets)) if d not in empty]
        if not used:
            result.append(None)
            continue
        used_weights = [weights[d] for d in used]
        per_ds = [None] * len(used)
        if num is not None:
            per_ds = [int(num)] if len(used) == 1 else samples_per_dataset(int(num), used_weights)
        built = []
        for d, n in zip(used, per_ds):
            b = boundaries[d]
            documents = np.arange(b[s], b[s + 1], dtype=np.int64)
            built.append(_split_dataset(datasets[d], indexed[d], documents, n, split_name))
        if len(built) == 1:
            result.append(built[0])
        else:
            size = int(num) if num is not None else sum(len(b) for b in built)
            result.append(BlendableDataset(built, used_weights, size))
    return tuple(result)


# ---- loaders ----------------------------------------------------------------------------------
def loader_generator(seed: int) -> torch.Generator:
    """A DataLoader's own generator: starting an iterator (which draws the workers' base
    seed) then leaves the global RNG alone, so a resumed run's dropout masks are the ones
    of the uninterrupted run."""
    return torch.Generator().manual_seed(int(seed))


def _make_sampler(sampler, default_cls, default_kwargs: dict, **kwargs):
    if sampler is None:
        return default_cls(**default_kwargs, **kwargs)
    if is_lazy_node(sampler):
        return instantiate(sampler, **kwargs)
    if isinstance(sampler, type):
        return sampler(**default_kwargs, **kwargs)
    return sampler  # an already built batch sampler


def _merge_datasets(dataset):
    datasets = [_build_obj(d) for d in _as_list(dataset)]
    if not datasets:
        raise ValueError("no dataset given")
    return datasets[0] if len(datasets) == 1 else ConcatDataset(datasets)


def build_nlp_train_loader(
    dataset,
    train_batch_size: int,
    test_batch_size: int | None = None,
    sampler=None,
    num_workers: int = 0,
    consumed_samples: int = 0,
    seed: int = 0,
    collate_fn=None,
    valid_dataset=None,
    train_val_test_num_samples=None,
    **kwargs,
):
    """``(train_loader, valid_loader, None)``: endless shuffled micro-batches for this dp rank.

    ``sampler`` defaults to ``CyclicSampler(shuffle=True)``; a ``LazyCall`` sampler config
    gets the dataset, batch size, consumed samples, dp rank/size and seed filled in.
    ``valid_dataset`` (optional) gets a :func:`build_nlp_test_loader` of ``test_batch_size``
    (default: the train batch size); without it the valid loader is ``None``.
    ``train_val_test_num_samples`` is accepted (the trainer passes it) and ignored: the
    datasets here have their own length. Other keyword arguments go to the ``DataLoader``.
    """
    del train_val_test_num_samples  # the dataset decides its length
    valid_loader = None
    if valid_dataset is not None:
        valid_loader = build_nlp_test_loader(
            valid_dataset,
            test_batch_size or train_batch_size,
            num_workers=num_workers,
            seed=seed,
            collate_fn=collate_fn,
        )
    dataset = _merge_datasets(dataset)
    batch_sampler = _make_sampler(
        sampler,
        CyclicSampler,
        {"shuffle": True},
        dataset=dataset,
        micro_batch_size=train_batch_size,
        consumed_samples=consumed_samples,
        data_parallel_rank=dist.get_data_parallel_rank(),
        data_parallel_size=dist.get_data_parallel_size(),
        seed=seed,
    )
    loader = DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=trivial_batch_collator if collate_fn is None else collate_fn,
        **{"generator": loader_generator(seed), **kwargs},
    )
    return loader, valid_loader, None


def build_nlp_test_loader(
    dataset,
    test_batch_size: int,
    sampler=None,
    num_workers: int = 0,
    seed: int = 0,
    collate_fn=None,
    **kwargs,
):
    """One pass over ``dataset`` in micro-batches, sharded over dp ranks (``SingleRoundSampler``)."""
    dataset = _merge_datasets(dataset)
    batch_sampler = _make_sampler(
        sampler,
        SingleRoundSampler,
        {"shuffle": False, "drop_last": False},
        dataset=dataset,
        micro_batch_size=test_batch_size,
        data_parallel_rank=dist.get_data_parallel_rank(),
        data_parallel_size=dist.get_data_parallel_size(),
        seed=seed,
    )
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=trivial_batch_collator if collate_fn is None else collate_fn,
        **{"generator": loader_generator(seed), **kwargs},
    )


def build_nlp_train_val_test_loader(
    dataset,
    splits,
    weights,
    train_val_test_num_samples,
    train_batch_size: int,
    test_batch_size: int | None = None,
    train_sampler=None,
    test_sampler=None,
    num_workers: int = 0,
    consumed_samples: int = 0,
    seed: int = 0,
    collate_fn=None,
):
    """Split each dataset into train/valid/test documents and return the three loaders.

    Args:
        dataset: ``LazyCall(GPT2Dataset)(...)`` config(s); see :func:`build_train_valid_test_datasets`.
        splits: e.g. ``[[949.0, 50.0, 1.0]]``, one per dataset.
        weights: e.g. ``[1.0]``, one per dataset (blending weights when several).
        train_val_test_num_samples: ``[train, valid, test]`` sample counts (the trainer fills
            it from ``train_iter x global_batch_size`` and the eval iterations); ``None`` =
            one epoch of each split. A split with 0 samples gets no loader (``None``).
        train_batch_size: micro-batch size per rank for training.
        test_batch_size: micro-batch size per rank for valid/test (default: train's).
        train_sampler / test_sampler: ``None`` (``CyclicSampler(shuffle=True)`` /
            ``SingleRoundSampler(shuffle=False)``) or a ``LazyCall`` sampler config.
        num_workers: DataLoader worker processes (0 = load in the main process).
        consumed_samples: global samples already trained on (resume point of the train loader).
        seed: seed of the train sampler's per-epoch shuffles.
        collate_fn: default :func:`trivial_batch_collator` (stacks dict samples).

    Returns:
        ``(train_loader, valid_loader, test_loader)``.
    """
    if test_batch_size is None:
        test_batch_size = train_batch_size
    train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
        dataset, splits, weights, train_val_test_num_samples
    )
    train_loader = None
    if train_ds is not None:
        train_loader, _, _ = build_nlp_train_loader(
            train_ds,
            train_batch_size,
            sampler=train_sampler,
            num_workers=num_workers,
            consumed_samples=consumed_samples,
            seed=seed,
            collate_fn=collate_fn,
        )
    eval_loaders = [
        None
        if ds is None
        else build_nlp_test_loader(
            ds,
            test_batch_size,
            sampler=test_sampler,
            num_workers=num_workers,
            seed=seed,
            collate_fn=collate_fn,
        )
        for ds in (valid_ds, test_ds)
    ]
    return train_loader, eval_loaders[0], eval_loaders[1]


# ---- image classification --------------------------------------------------------------------
class MixupLoader:
    """A train loader whose batches get ``batch["images"], batch["labels"] =
    mixup_func(...)`` in the main process, as LiBai's trainer applies ``mixup_func`` in
    ``get_batch``: in DataLoader worker processes each worker would draw from its own copy of
    numpy's generator (the same draws in every worker, and none of them in checkpoints).
    Everything else is the wrapped loader's (``len``, ``dataset``, ...)."""

    def __init__(self, loader, mixup_func):
        self.loader, self.mixup_func = loader, mixup_func

    def __iter__(self):
        for batch in self.loader:
            batch = dict(batch)
            batch["images"], batch["labels"] = self.mixup_func(batch["images"], batch["labels"])
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name in ("loader", "mixup_func"):  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)


def build_image_train_loader(
    dataset,
    train_batch_size: int,
    test_batch_size: int | None = None,
    sampler=None,
    num_workers: int = 0,
    consumed_samples: int = 0,
    seed: int = 0,
    collate_fn=None,
    mixup_func=None,
    valid_dataset=None,
    train_val_test_num_samples=None,
    **kwargs,
):
    """``(train_loader, valid_loader, None)`` for image classification (LiBai's name).

    Like :func:`build_nlp_train_loader` (endless, resumable, sharded over dp ranks) on
    dataset(s) of ``{"images", "labels"}`` samples, e.g.
    :class:`~libai.data.datasets.ImageFolderDataset`. ``mixup_func(images, labels) ->
    (images, labels)`` is applied to each training batch when given (e.g. Mixup / CutMix
    with soft labels), in the main process (:class:`MixupLoader`). ``valid_dataset`` (optional) gets a :func:`build_image_test_loader`.
    """
    train_loader, _, _ = build_nlp_train_loader(
        dataset,
        train_batch_size,
        sampler=sampler,
        num_workers=num_workers,
        consumed_samples=consumed_samples,
        seed=seed,
        collate_fn=collate_fn,
        **kwargs,
    )
    if mixup_func is not None:
        train_loader = MixupLoader(train_loader, mixup_func)
    valid_loader = None
    if valid_dataset is not None:
        valid_loader = build_image_test_loader(
            valid_dataset, test_batch_size or train_batch_size, num_workers=num_workers, seed=seed
        )
    return train_loader, valid_loader, None


def build_image_test_loader(
    dataset,
    test_batch_size: int,
    sampler=None,
    num_workers: int = 0,
    seed: int = 0,
    collate_fn=None,
    **kwargs,
):
    """One pass over an image dataset in micro-batches, sharded over dp ranks (LiBai's name)."""
    return build_nlp_test_loader(
        dataset,
        test_batch_size,
        sampler=sampler,
        num_workers=num_workers,
        seed=seed,
        collate_fn=collate_fn,
        **kwargs,
    )
