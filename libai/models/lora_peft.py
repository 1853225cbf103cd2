"""PEFT adapter directories in and out of a libai model, on any layout.

:func:`save_peft_adapter` writes ``adapter_config.json`` + ``adapter_model.safetensors`` that
``peft.PeftModel.from_pretrained`` loads onto the Hugging Face base model; the tensors are
the adapters gathered whole (tensor-parallel shards joined, pipeline stages collected, rank
0 writes). :func:`load_peft_adapter` reads such a directory (ours or one ``peft`` wrote)
onto a libai model: its config applies the adapters, each rank keeps its shard of each
tensor. Loading reads data only (safetensors and JSON), never code.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch
import torch.distributed as torch_dist
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor, distribute_tensor

from libai import dist
from libai.layers.lora import EmbeddingLoRA
from libai.layers.param import local_value
from libai.models.lora import (
    SEGMENTS,
    LoRAConfig,
    apply_lora,
    lora_layers,
    lora_targets,
    weight_rules,
)
from libai.models.utils.hf_export import full_value
from libai.models.utils.model_loader.base_loader import load_rule, logical_shape, rule_shard
from libai.models.utils.weight_mapping import expected_shapes

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PREFIX = "base_model.model."
#: PEFT's embedding adapter tensors (no ".weight")
EMBEDDING_NAMES = (".lora_embedding_A", ".lora_embedding_B")


def _pairs(model, targets) -> dict[str, tuple]:
    """PEFT tensor name -> (the libai parameter, how: None | "cat" of B segments);
    ``targets``: :func:`lora_targets` of ``model``."""
    out = {}
    for module, layer in lora_layers(model).items():
        target, lora = targets[module], layer.lora
        if not target.hf:
            raise ValueError(
                f"{module} has no Hugging Face counterpart, so its adapter has no PEFT name; "
                "adapt only layers of the model's Hugging Face architecture"
            )
        if isinstance(lora, EmbeddingLoRA):  # PEFT's names carry no ".weight"
            name = PREFIX + target.hf[""]
            out[name + ".lora_embedding_A"] = ((lora.lora_embedding_A,), None)
            out[name + ".lora_embedding_B"] = ((lora.lora_embedding_B,), None)
            continue
        if lora.segments is None or lora.shared_a:
            name = PREFIX + target.hf[""]
            out[name + ".lora_A.weight"] = ((lora.lora_A,), None)
            if lora.segments is None:
                out[name + ".lora_B.weight"] = ((lora.lora_B,), None)
            else:  # GPT-2's c_attn: one B whose rows are q, k, v
                bs = tuple(getattr(lora, f"lora_B_{s}") for s in SEGMENTS)
                out[name + ".lora_B.weight"] = (bs, "cat")
            continue
        for s in lora.segments:
            name = PREFIX + target.hf[s]
            out[name + ".lora_A.weight"] = ((getattr(lora, f"lora_A_{s}"),), None)
            out[name + ".lora_B.weight"] = ((getattr(lora, f"lora_B_{s}"),), None)
    return out


def _peft_target_names(model, targets) -> list[str]:
    names = set()
    for module, layer in lora_layers(model).items():
        hf = targets[module].hf
        keys = [""] if layer.lora.segments is None or layer.lora.shared_a else layer.lora.segments
        names |= {hf[k].rsplit(".", 1)[-1] for k in keys}
    return sorted(names)


def _saved_modules(model) -> dict[str, tuple]:
    """libai name -> (parameter, its weight-mapping rule) of each parameter of
    ``modules_to_save`` (trained, not an adapter) on this rank's stage."""
    trained = {
        n: p
        for n, p in model.named_parameters()
        if p.requires_grad and not getattr(p, "libai_lora", False)
    }
    if not trained:
        return {}
    rules = {r.libai_name: r for r in weight_rules(model)}
    out = {}
    for name, param in trained.items():
        if getattr(param, "libai_tied_copy", False):
            continue  # saved once, under the tied group's canonical weight
        if name not in rules:
            raise ValueError(
                f"{name} (lora.modules_to_save) has no Hugging Face counterpart, so it has no "
                "PEFT name; save only modules of the model's Hugging Face architecture"
            )
        out[name] = (param, rules[name])
    return out


def peft_state_dict(model, targets=None) -> dict[str, torch.Tensor]:
    """This rank's stage's adapters and ``modules_to_save`` weights, whole, by PEFT name
    (collective over each layer's mesh: every rank calls it)."""
    out = {}
    for name, (params, how) in _pairs(model, targets or lora_targets(model)).items():
        fulls = [full_value(p).float().cpu() for p in params]
        out[name] = torch.cat(fulls) if how == "cat" else fulls[0]
    for param, rule in _saved_modules(model).values():  # PEFT: the module's whole weights
        for hf_name, t in rule.export(full_value(param)).items():
            out[PREFIX + hf_name] = t.float().cpu()
    return out


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name or name.endswith(EMBEDDING_NAMES)


def _module_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``modules_to_save`` weights of a PEFT state dict, by Hugging Face name."""
    return {k[len(PREFIX) :]: v for k, v in tensors.items() if not _is_adapter(k)}


def _module_names(hf_names) -> list[str]:
    """The Hugging Face modules those weights belong to (PEFT's ``modules_to_save``)."""
    return sorted({name.rsplit(".", 1)[0] for name in hf_names})


def save_peft_adapter(
    model, config: LoRAConfig, path: str, base_model_name_or_path: str | None = None
) -> None:
    """Write ``model``'s adapters to ``path`` as a PEFT adapter directory (collective:
    every rank calls it; rank 0 writes)."""
    targets = lora_targets(model)
    tensors = peft_state_dict(model, targets)
    if dist.get_world_size() > 1:  # pipeline stages hold different layers
        parts = [None] * dist.get_world_size()
        torch_dist.all_gather_object(parts, tensors)
        tensors = {k: v for part in parts for k, v in part.items()}
    fan_in_fan_out = any(targets[m].transpose for m in lora_layers(model))
    settings = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": config.r,
        "lora_alpha": config.lora_alpha,
        "lora_dropout": config.lora_dropout,
        "use_rslora": config.use_rslora,
        "target_modules": _peft_target_names(model, targets),
        "modules_to_save": _module_names(_module_tensors(tensors)) or None,
        "bias": "none",
        "fan_in_fan_out": fan_in_fan_out,
        "init_lora_weights": True,
        "inference_mode": True,
    }
    if dist.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, WEIGHTS_NAME))
        with open(os.path.join(path, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=2)
    if dist.get_world_size() > 1:
        torch_dist.barrier()


def read_peft_config(path: str) -> LoRAConfig:
    """The LoRA settings of a PEFT adapter directory (the fields this library honours; a
    setting it cannot honour raises naming it)."""
    file = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no {CONFIG_NAME} (not a PEFT adapter directory)")
    with open(file, encoding="utf-8") as f:
        raw = json.load(f)
    if raw.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: a {raw.get('peft_type')} adapter; only LoRA loads here")
    for key, default in (("use_dora", False), ("rank_pattern", {}), ("alpha_pattern", {}),
                         ("layers_to_transform", None)):  # fmt: skip
        if raw.get(key) not in (default, None, {}, False):
            raise ValueError(f"{path}: PEFT's {key}={raw[key]!r} is not supported here")
    targets = raw["target_modules"]
    return LoRAConfig(
        target_modules=targets if isinstance(targets, str) else tuple(targets),
        r=int(raw["r"]),
        lora_alpha=float(raw["lora_alpha"]),
        lora_dropout=float(raw.get("lora_dropout", 0.0)),
        use_rslora=bool(raw.get("use_rslora", False)),
        modules_to_save=tuple(raw.get("modules_to_save") or ()),
    )


@torch.no_grad()
def load_peft_adapter(model, path: str, whole_modules: bool = True) -> LoRAConfig:
    """Apply the PEFT adapter at ``path`` to ``model`` (any layout; each rank keeps its
    shard) and return its config. A tensor that does not fit (an adapter made for another
    base) raises before any weight changes; so does an adapter that saved whole modules
    (``modules_to_save``) when ``whole_modules`` is False."""
    config = read_peft_config(path)
    file = os.path.join(path, WEIGHTS_NAME)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no {WEIGHTS_NAME}")
    tensors = _without_embedding_copies(model, load_file(file), path)
    # PEFT matches modules_to_save by name suffix: the file's tensors say which it saved
    saved = _TensorReader(_module_tensors(tensors), file)
    config = replace(config, modules_to_save=tuple(_module_names(saved.tensors)))
    if config.modules_to_save and not whole_modules:
        raise ValueError(
            f"{path} saves whole modules ({', '.join(config.modules_to_save)}): it replaces "
            "base weights, so it cannot be one of several adapters; merge it (--lora-adapter)"
        )
    if not lora_layers(model):
        apply_lora(model, config)
    pairs = _pairs(model, lora_targets(model))
    present = {k for k in tensors if _is_adapter(k)}
    stage = set(pairs)
    # under pp a stage holds some layers: the file's others belong to other stages
    missing = sorted(stage - present)
    if missing:
        raise ValueError(
            f"{path} has no {missing[0]} (and {len(missing) - 1} more): an adapter for "
            "another base model or other target modules"
        )
    plan = []
    for name, (params, how) in pairs.items():
        full = tensors[name]
        pieces = full.split([p.shape[0] for p in params]) if how == "cat" else [full]
        for p, piece in zip(params, pieces):
            piece = _padded(piece, p)
            if tuple(piece.shape) != tuple(p.shape):
                raise ValueError(
                    f"{path}: {name} has shape {tuple(piece.shape)}, this model's adapter "
                    f"needs {tuple(p.shape)} (an adapter for another base model?)"
                )
            plan.append((p, piece))
    modules = _saved_modules(model)
    wanted = {h for _, rule in modules.values() for h in rule.hf_names()}
    unused = sorted(set(saved.tensors) - wanted)
    whole = dist.mesh_of(model).layout.pipeline_parallel_size == 1  # else: stages' parts
    if unused and whole:
        raise ValueError(
            f"{path}: {unused[0]} (and {len(unused) - 1} more) fits no trained module of "
            "this model: an adapter for another base model, or load it before other adapters"
        )
    for param, rule in modules.values():
        for hf_name, shape in expected_shapes(rule, logical_shape(param)).items():
            if hf_name not in saved.tensors or saved.shape(hf_name) != tuple(shape):
                found = saved.shape(hf_name) if hf_name in saved.tensors else None
                raise ValueError(
                    f"{path}: modules_to_save needs {hf_name} of shape {tuple(shape)}, the "
                    f"adapter has {found} (an adapter for another base model?)"
                )
    for p, piece in plan:
        value = piece.to(p.dtype)
        if isinstance(p, DTensor):
            p.copy_(distribute_tensor(value.to(p.device), p.device_mesh, p.placements))
        else:
            p.copy_(value)
    for name, (param, rule) in modules.items():
        load_rule(param, name, rule, saved)
    return config


def _without_embedding_copies(model, tensors: dict, path: str) -> dict:
    """``tensors`` without the base weights PEFT saves beside an embedding adapter
    (``save_embedding_layers``: ``<module>.base_layer.weight``), once each is checked equal
    to this base's weights (this rank's shard): different ones mean an adapter made on
    other weights or a resized vocabulary, refused naming the tensor."""
    copies = [k for k in tensors if k.endswith(".base_layer.weight")]
    if not copies:
        return tensors
    params = dict(model.named_parameters())
    owners = {h: r for r in weight_rules(model) for h in r.hf_names() if r.libai_name in params}
    for key in copies:
        hf_name = key[len(PREFIX) :].replace(".base_layer.weight", ".weight")
        rule = owners.get(hf_name)
        if rule is None:
            if dist.mesh_of(model).layout.pipeline_parallel_size > 1:
                continue  # another stage's layer
            raise ValueError(f"{path}: {key} fits no layer of this model")
        param = params[rule.libai_name]
        if param.is_meta:
            continue
        value = tensors[key]
        same = tuple(value.shape) == logical_shape(param)
        if same:
            reader = _TensorReader({hf_name: value}, path)
            mine = local_value(param)
            got = rule_shard(param, rule, reader)
            same = torch.equal(got.to(mine.dtype), mine)
        if not same:
            raise ValueError(
                f"{path}: {key} (the base embedding PEFT saved beside its adapter) differs "
                "from this model's: an adapter made on other weights or a resized vocabulary"
            )
    return {k: v for k, v in tensors.items() if k not in copies}


def _padded(piece: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``piece`` (a file's tensor of ``param``'s logical shape) zero-padded to the padded
    vocabulary ``param`` holds (an embedding adapter's A under tp)."""
    if tuple(piece.shape) != logical_shape(param) or tuple(param.shape) == logical_shape(param):
        return piece
    pad = [0, 0] * piece.dim()
    for dim, (want, have) in enumerate(zip(param.shape, piece.shape)):
        pad[2 * (piece.dim() - 1 - dim) + 1] = want - have
    return torch.nn.functional.pad(piece, pad)


class _TensorReader:
    """Tensors by Hugging Face name, read as the weight-mapping rules read a checkpoint."""

    def __init__(self, tensors: dict[str, torch.Tensor], path: str):
        self.tensors, self.path = tensors, path

    def read(self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None):
        t = self.tensors[name]
        if dim is not None:
            t = t.narrow(dim, start, (t.shape[dim] if stop is None else stop) - start)
        return t.clone()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.tensors[name].dtype
