"""``save_huggingface``: a libai model on any layout -> a directory transformers loads.

Every rank walks the same weight table. A parameter is gathered (``full_tensor``, a
collective of its stage's dp x tp mesh) by the ranks of the stage that holds it, converted
by its rule, and written by that stage's first rank into the safetensors shard the global
plan assigned it to. Shards are flushed as soon as they are complete, so a rank holds at most
one shard of tensors, never the whole model. Rank 0 writes ``config.json`` and the index.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as torch_dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

from libai import dist
from libai.models.utils.hf_io import CONFIG, SAFE_INDEX, SAFE_WEIGHTS
from libai.models.utils.model_loader.base_loader import (
    complete_rules,
    libai_class,
    logical_shape,
)
from libai.models.utils.weight_mapping import Rule


def model_libai_cfg(model: nn.Module) -> dict:
    """The hyper-parameters the model was built with (see ``libai.config.configurable``)."""
    for m in model.modules():
        cfg = getattr(m, "libai_cfg", None)
        if cfg is not None:
            return dict(cfg)
    raise TypeError(f"{type(model).__name__} records no libai_cfg (is __init__ @configurable?)")


def _written_here(p: torch.Tensor | None) -> bool:
    """Whether this rank's stage holds ``p`` and exports it (a tied copy is not exported)."""
    return p is not None and not p.is_meta and not getattr(p, "libai_tied_copy", False)


def _stage_leader(model) -> bool:
    """Whether this rank writes its stage's tensors (dp rank 0 and tp rank 0 of the mesh
    ``model`` was built on)."""
    util = dist.mesh_of(model)
    return util.data_parallel_rank == 0 and util.tensor_parallel_rank == 0


def _plan(model, rules: dict[str, Rule], dtype, max_shard_bytes: int):
    """Assign each exported rule to a shard file; the same answer on every rank."""
    params = dict(model.named_parameters(remove_duplicate=False))
    mine = []  # (libai name, {hf name: nbytes}) of rules this stage's leader writes
    if _stage_leader(model):
        for name, rule in rules.items():
            p = params.get(name)
            if not _written_here(p):
                continue
            meta = torch.empty(logical_shape(p), device="meta")
            itemsize = (dtype or p.dtype).itemsize
            sizes = {k: t.numel() * itemsize for k, t in rule.export(meta).items()}
            mine.append((name, sizes))
    world = dist.get_world_size()
    plans = [mine]
    if world > 1:
        plans = [None] * world
        torch_dist.all_gather_object(plans, mine)
    files: list[list[tuple[int, str, dict]]] = [[]]
    size = 0
    for rank, plan in enumerate(plans):
        if files[-1] and plan:  # a file is written by one rank: each stage starts its own
            files.append([])
            size = 0
        for name, sizes in plan:
            nbytes = sum(sizes.values())
            if files[-1] and size + nbytes > max_shard_bytes:
                files.append([])
                size = 0
            files[-1].append((rank, name, sizes))
            size += nbytes
    return files


def _file_names(n: int) -> list[str]:
    if n == 1:
        return [SAFE_WEIGHTS]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def full_value(t: torch.Tensor, param: torch.Tensor | None = None) -> torch.Tensor:
    """``t`` (a parameter, or ``param``'s gradient) whole: a DTensor is gathered (a
    collective of its mesh) and vocabulary padding is cut to the parameter's logical shape."""
    full = t.full_tensor() if isinstance(t, DTensor) else t
    logical = getattr(t if param is None else param, "libai_logical_shape", None)
    if logical is not None:
        full = full[tuple(slice(0, s) for s in logical)]
    return full.detach()


def export_weights(
    model: nn.Module, rules: list[Rule], path: str, dtype=None, max_shard_size: int = 5 * 2**30
) -> tuple[dict[str, str], int]:
    """Write ``model``'s weights as Hugging Face safetensors shards; returns the weight map
    and the tensors' total bytes.

    Collective: every rank must call it.
    """
    by_name = complete_rules(model, rules)
    params = dict(model.named_parameters(remove_duplicate=False))
    files = _plan(model, by_name, dtype, max_shard_size)
    names = _file_names(len(files))
    weight_map = {hf: names[i] for i, f in enumerate(files) for _, _, s in f for hf in s}
    total_size = sum(n for f in files for _, _, s in f for n in s.values())
    rank = dist.get_rank()
    for file, entries in zip(names, files):
        tensors = {}
        # every rank of a stage gathers its stage's parameters in table order
        for owner, name, _ in entries:
            p = params.get(name)
            if not _written_here(p):
                continue
            full = full_value(p)
            if owner == rank:
                for hf_name, t in by_name[name].export(full).items():
                    t = t.to("cpu", dtype or t.dtype).contiguous()
                    tensors[hf_name] = t
        if tensors:
            save_file(tensors, os.path.join(path, file), metadata={"format": "pt"})
    return weight_map, total_size


#: config.json entries never carried from the loaded checkpoint: bookkeeping
NOT_CARRIED = ("_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype")


def carry_source_settings(hf_config: dict, model: nn.Module) -> dict:
    """``hf_config`` plus every setting of the checkpoint ``model`` was loaded from (by
    ``load_huggingface``) that the export does not write itself: what the libai config does
    not model (special token ids, label names, tokenizer class, ...) comes back unchanged
    instead of falling to transformers' defaults. A model built without a checkpoint
    exports ``hf_config`` as is."""
    source = getattr(model, "libai_hf_source_config", None) or {}
    carried = {k: v for k, v in source.items() if k not in hf_config and k not in NOT_CARRIED}
    return {**hf_config, **carried}


def save_huggingface(
    model: nn.Module, path: str, *, loader=None, dtype=None, max_shard_size: int = 5 * 2**30
) -> None:
    """Save ``model`` (any layout, pruned to its pipeline stages or not) to ``path`` as a
    Hugging Face directory: ``config.json`` (with the settings of the checkpoint it was
    loaded from that libai does not model: :func:`carry_source_settings`) and safetensors
    (sharded with an index when the weights exceed ``max_shard_size`` bytes). Collective:
    every rank must call it.
    """
    from libai.models.utils import loader_for_model

    loader = loader or loader_for_model(model)
    cfg = model_libai_cfg(model)
    if dist.is_main_process():
        os.makedirs(path, exist_ok=True)
    dist.synchronize()
    weight_map, total_size = export_weights(
        model, loader.rules(cfg, libai_class(model)), path, dtype, max_shard_size
    )
    dist.synchronize()
    if dist.is_main_process():
        hf_config = carry_source_settings(loader.hf_config(cfg, model), model)
        if dtype is not None:
            hf_config["torch_dtype"] = str(dtype).removeprefix("torch.")
        with open(os.path.join(path, CONFIG), "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=2, sort_keys=True)
        files = sorted(set(weight_map.values()))
        if files != [SAFE_WEIGHTS]:
            index = {
                "metadata": {"total_size": total_size},
                "weight_map": dict(sorted(weight_map.items())),
            }
            with open(os.path.join(path, SAFE_INDEX), "w", encoding="utf-8") as f:
                json.dump(index, f, indent=2)
    dist.synchronize()
