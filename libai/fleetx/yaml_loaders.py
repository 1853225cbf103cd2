"""Loaders from a FleetX ``Data.{Train,Eval,Test}`` section: ``dataset``, ``sampler`` and
``loader`` mappings whose ``name`` picks a class and whose other keys are its arguments.

Names are looked up in :data:`DATASETS` / :data:`SAMPLERS` / :data:`COLLATORS`, or taken as
a dotted import path (``projects.simple_net.dataset.RandomDataset``). Arguments are
checked against the constructor (an unknown one is an error naming the closest). A dataset
that accepts ``mode``, ``num_samples``, ``seed`` or ``tokenizer`` gets them filled in by the
Engine unless the YAML sets them.

Training batches come from a :class:`~libai.data.samplers.CyclicSampler` (endless,
reshuffled every epoch with ``seed + epoch``, resumable from a sample count, each data
rank its own micro-batches); evaluation and test from a
:class:`~libai.data.samplers.SingleRoundSampler` (one pass, sharded over data ranks).
FleetX's sampler names map onto these two: ``DistributedBatchSampler`` and
``GPTBatchSampler`` mean the cyclic sampler for ``Train`` and the single-round one otherwise.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Mapping
from typing import Any

from torch.utils.data import DataLoader

from libai import dist
from libai.config.instantiate import locate
from libai.data.build import loader_generator, trivial_batch_collator
from libai.data.samplers import CyclicSampler, SingleRoundSampler

logger = logging.getLogger(__name__)

__all__ = ["COLLATORS", "DATASETS", "SAMPLERS", "build_split_loader", "resolve_name"]

DATASETS = {
    "GPTDataset": "libai.data.datasets.gpt_split.GPTDataset",
    "SFTDataset": "libai.data.datasets.sft_dataset.SFTDataset",
    "ImageFolderDataset": "libai.data.datasets.image_folder.ImageFolderDataset",
    "TextClassificationDataset": "libai.data.datasets.text_classification."
    "TextClassificationDataset",
    # FleetX's offline evaluation sets (GPTEvalModule builds Data.Eval from Offline_Eval)
    "LM_Eval_Dataset": "libai.data.datasets.fleetx_eval.LMEvalDataset",
    "Lambada_Eval_Dataset": "libai.data.datasets.fleetx_eval.LambadaEvalDataset",
    "GeneralClsDataset": "libai.data.datasets.fleetx_cls.GeneralClsDataset",
    "ErnieDataset": "libai.data.datasets.fleetx_ernie.ErnieDataset",
    "ErnieSeqClsDataset": "libai.data.datasets.fleetx_ernie.ErnieSeqClsDataset",
    # GLUE by FleetX's names (GPTFinetuneModule)
    **{
        task: f"libai.data.datasets.glue.{task}"
        for task in ("CoLA", "SST2", "MNLI", "QNLI", "RTE", "WNLI", "MRPC", "QQP", "STSB")
    },
}
#: name -> (class for Train, class for Eval / Test)
SAMPLERS = {
    "CyclicSampler": (CyclicSampler, CyclicSampler),
    "SingleRoundSampler": (SingleRoundSampler, SingleRoundSampler),
    "DistributedBatchSampler": (CyclicSampler, SingleRoundSampler),
    "GPTBatchSampler": (CyclicSampler, SingleRoundSampler),
}
COLLATORS = {
    "default": trivial_batch_collator,
    "stack": trivial_batch_collator,
    "gpt_collate_fn": "libai.data.datasets.fleetx_gpt.gpt_collate_fn",
    "ErnieCollateData": "libai.data.datasets.fleetx_ernie.ErnieCollateData",
}
#: the arguments a split's loader section may set (the rest is decided by the Engine)
LOADER_KEYS = ("num_workers", "collate_fn", "pin_memory", "prefetch_factor", "timeout")
#: FleetX loader keys with no meaning for a torch DataLoader (Paddle's list-or-dict
#: switch): accepted and dropped
PADDLE_ONLY_LOADER_KEYS = ("return_list", "use_shared_memory")


def resolve_name(name: str, registry: Mapping[str, Any], key: str):
    """``registry[name]`` (imported if it is a dotted path), or ``name`` as an import path."""
    if name in registry:
        value = registry[name]
        return locate(value) if isinstance(value, str) else value
    if "." in str(name):
        try:
            return locate(str(name))
        except ImportError as exc:
            raise ValueError(f"{key}: cannot import {name!r}: {exc}") from exc
    close = difflib.get_close_matches(str(name), list(registry), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise ValueError(
        f"{key}: unknown name {name!r}{hint} Known: {', '.join(sorted(registry))}, or give a "
        "dotted import path (package.module.Class)"
    )


def accepted_arguments(target) -> tuple[set[str], bool]:
    """The keyword names ``target`` (a class or function) accepts, and whether it takes
    ``**kwargs``."""
    params = inspect.signature(target).parameters
    names = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_arguments(target, kwargs: Mapping, key: str, reserved=()) -> None:
    """Raise ``ValueError`` naming ``key`` and the closest argument for a keyword that
    ``target`` does not accept (or one of ``reserved``, which the Engine sets itself)."""
    names, var_kw = accepted_arguments(target)
    names -= set(reserved)
    for arg in kwargs:
        if arg in reserved:
            raise ValueError(f"{key}.{arg} is set by the Engine; remove it from the config")
        if arg not in names and not var_kw:
            close = difflib.get_close_matches(arg, sorted(names), n=3, cutoff=0.5)
            hint = f"; did you mean {' or '.join(f'{key}.{c}' for c in close)}?" if close else ""
            raise ValueError(
                f"unknown config key {key}.{arg}{hint} ({getattr(target, '__name__', target)} "
                f"takes: {', '.join(sorted(names))})"
            )


def _plain(node) -> dict:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return dict(node or {})


def build_split_dataset(section, split: str, *, seed: int, num_samples=None, tokenizer=None):
    """The dataset of ``Data.<split>`` (see the module doc for the filled-in arguments)."""
    key = f"Data.{split}.dataset"
    args = _plain(section["dataset"])
    target = resolve_name(args.pop("name"), DATASETS, f"{key}.name")
    check_arguments(target, args, key)
    names, _ = accepted_arguments(target)
    filled = {"mode": split, "num_samples": num_samples, "seed": seed, "tokenizer": tokenizer}
    for arg, value in filled.items():
        if arg in names and arg not in args and (value is not None or arg == "mode"):
            args[arg] = value
    return target(**args)


def build_split_loader(
    section,
    split: str,
    *,
    batch_size: int,
    seed: int,
    consumed_samples: int = 0,
    num_samples: int | None = None,
    tokenizer=None,
) -> DataLoader:
    """A ``DataLoader`` of ``Data.<split>`` giving this data rank ``batch_size`` samples per
    batch (see the module doc for the samplers)."""
    dataset = build_split_dataset(
        section, split, seed=seed, num_samples=num_samples, tokenizer=tokenizer
    )
    sampler_args = _plain(section.get("sampler"))
    given = sampler_args.pop("batch_size", None)  # FleetX's: Global's sizes decide here
    if given is not None and int(given) != batch_size:
        logger.warning(
            "Data.%s.sampler.batch_size=%s differs from the batch this rank loads from the "
            "Global sizes (%d); the Global sizes are used",
            split,
            given,
            batch_size,
        )
    train = split == "Train"
    name = sampler_args.pop("name", "CyclicSampler" if train else "SingleRoundSampler")
    sampler_cls = resolve_name(name, SAMPLERS, f"Data.{split}.sampler.name")
    if isinstance(sampler_cls, tuple):
        sampler_cls = sampler_cls[0 if train else 1]
    if sampler_cls is CyclicSampler:
        sampler_args.pop("drop_last", None)  # a training step always has a full batch
        sampler_args.setdefault("shuffle", True)
    reserved = ("dataset", "micro_batch_size", "data_parallel_rank", "data_parallel_size")
    check_arguments(sampler_cls, sampler_args, f"Data.{split}.sampler", reserved)
    extra = {"consumed_samples": consumed_samples} if sampler_cls is CyclicSampler else {}
    batch_sampler = sampler_cls(
        dataset=dataset,
        micro_batch_size=batch_size,
        data_parallel_rank=dist.get_data_parallel_rank(),
        data_parallel_size=dist.get_data_parallel_size(),
        **{"seed": seed, **sampler_args, **extra},
    )
    loader_args = _plain(section.get("loader"))
    for arg in PADDLE_ONLY_LOADER_KEYS:
        loader_args.pop(arg, None)
    for arg in loader_args:
        if arg not in LOADER_KEYS:
            close = difflib.get_close_matches(arg, LOADER_KEYS, n=2, cutoff=0.5)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise ValueError(
                f"unknown config key Data.{split}.loader.{arg}{hint} (known: "
                f"{', '.join(LOADER_KEYS)}; batch size and order come from Global and the sampler)"
            )
    # FleetX's auto-parallel files put collate_fn beside the loader, on the split
    collate = loader_args.pop("collate_fn", None) or section.get("collate_fn") or "default"
    collate_args = None
    key = f"Data.{split}.loader.collate_fn"
    if hasattr(collate, "keys"):  # FleetX's {name: ErnieCollateData, <its arguments>}
        collate_args = dict(collate)
        if not collate_args.get("name"):  # FleetX's builder needs it too
            raise ValueError(
                f"{key} is a mapping without a name: set {key}.name to the collator "
                f"({', '.join(COLLATORS)} or an import path), its arguments beside it"
            )
        collate = collate_args.pop("name")
    collate_fn = resolve_name(collate, COLLATORS, key)
    if collate_args is not None and isinstance(collate_fn, type):
        check_arguments(collate_fn, collate_args, key)
        collate_fn = collate_fn(**collate_args)
    elif collate_args:
        raise ValueError(
            f"{key}.{sorted(collate_args)[0]}: {collate} is a function of the batch and takes "
            "no arguments from the config; remove them"
        )
    workers = int(loader_args.pop("num_workers", 0))
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=collate_fn,
        generator=loader_generator(seed),
        **loader_args,
    )
