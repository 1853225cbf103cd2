"""Load a Hugging Face checkpoint into a libai model on the current mesh, and export one back.

One loader class per architecture subclasses :class:`ModelLoaderHuggerFace` (LiBai's name) and
declares four things: how ``config.json`` maps to the libai hyper-parameters and back, which
libai class each Hugging Face ``architectures`` entry becomes, and the weight mapping table
(:mod:`libai.models.utils.weight_mapping`). Loading and exporting are shared:

- loading checks the whole table against the checkpoint first (missing tensors, tensor shapes
  against ``config.json``) and raises naming every problem, before any weight is copied; then
  each rank reads only its own shards; unexpected checkpoint tensors are logged by name;
- exporting gathers one parameter at a time, and the first rank of each pipeline stage writes
  that stage's safetensors shards, so no rank ever holds the whole model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from libai import dist
from libai.layers.param import init_deferred, skip_init
from libai.models.utils.hf_io import (
    CheckpointError,
    CheckpointReader,
    read_hf_config,
    record_weights_source,
)
from libai.models.utils.model_loader.libai_protocol import (
    LiBaiLoaderProtocol,
    ModelLoaderLiBai,
    prefixed_name,
)
from libai.models.utils.weight_mapping import Rule, ShardSpec, expected_shapes

logger = logging.getLogger(__name__)

__all__ = ["ModelLoaderHuggerFace", "ModelLoaderLiBai", "load_weights", "libai_class"]


class ModelLoaderHuggerFace(LiBaiLoaderProtocol):
    """Base of the per-architecture loaders. (A LiBai project's own loader, which overrides
    LiBai's ``_convert_state_dict`` / ``_load_config_from_json`` hooks, loads through them:
    :mod:`~libai.models.utils.model_loader.libai_protocol`.)

    Usage (LiBai's)::

        model = LlamaLoaderHuggerFace(LlamaForCausalLM, cfg.model.cfg, "path/to/hf_dir").load()

    Args:
        model: the libai model class to build (``None``: chosen from ``architectures`` in
            ``config.json`` through :attr:`architectures`).
        libai_cfg: libai hyper-parameters to start from (e.g. dropout); values that
            ``config.json`` defines replace them.
        pretrained_model_path: the Hugging Face model directory.
        **kwargs: final overrides of libai hyper-parameters.
    """

    #: ``model_type`` values of ``config.json`` this loader reads
    model_types: tuple[str, ...] = ()
    #: prefix of the backbone in Hugging Face head models (``"model"``, ``"bert"``, ...)
    base_model_prefix: str = ""
    #: Hugging Face architecture name -> libai class, the first is the default
    architectures: Mapping[str, type] = {}
    #: checkpoint tensors that are expected to be unused (regular expressions)
    ignore_unexpected: tuple[str, ...] = ()
    #: Hugging Face tensors that may be absent (a task head on a pretrained backbone); their
    #: libai parameters keep a fresh initialization and a warning names them
    optional_missing: tuple[str, ...] = ()

    def __init__(
        self, model=None, libai_cfg: Mapping | None = None, pretrained_model_path=None, **kwargs
    ):
        # (self.model: the class; self.libai_cfg; self.kwargs: the final overrides)
        self._init_libai_protocol(model, libai_cfg, pretrained_model_path, kwargs)
        self.path = None if pretrained_model_path is None else str(pretrained_model_path)

    # ---- to implement per architecture ------------------------------------------------------
    def libai_config(self, hf_config: dict) -> dict:
        """libai hyper-parameters from ``config.json``."""
        raise NotImplementedError

    @classmethod
    def hf_config(cls, libai_cfg: dict, model: nn.Module) -> dict:
        """``config.json`` content (with ``model_type`` and ``architectures``) for ``model``."""
        raise NotImplementedError

    @classmethod
    def rules(cls, libai_cfg: dict, model_cls: type) -> list[Rule]:
        """The weight mapping of ``model_cls``, depending only on its class and config (so
        every pipeline stage computes the same table)."""
        raise NotImplementedError

    def check_layout(self, libai_cfg: dict) -> None:
        """Raise a clear error if the config cannot run on the current mesh (heads vs tp)."""
        tp = dist.get_tensor_parallel_size()
        for key in ("num_attention_heads", "num_key_value_heads", "num_heads"):
            value = libai_cfg.get(key)
            if value and value % tp:
                raise ValueError(
                    f"{key}={value} (from {self.path}/config.json) is not divisible by "
                    f"tensor_parallel_size={tp}; use a tensor_parallel_size that divides {value}."
                )

    # ---- loading ----------------------------------------------------------------------------
    def load(self) -> nn.Module:
        """Build the libai model on the current mesh and fill it from the checkpoint."""
        if type(self)._convert_state_dict is not LiBaiLoaderProtocol._convert_state_dict:
            return self._libai_protocol_load()  # a LiBai project's own loader
        if self.path is None:
            raise ValueError("pretrained_model_path is required (a Hugging Face model directory)")
        hf_config = read_hf_config(self.path)
        model_type = hf_config.get("model_type")
        if self.model_types and model_type not in self.model_types:
            raise CheckpointError(
                f"{self.path}/config.json has model_type={model_type!r}, but "
                f"{type(self).__name__} reads {list(self.model_types)}"
            )
        model_cls = self.model or self._default_class(hf_config)
        cfg = {**self.libai_cfg, **self.libai_config(hf_config), **self.kwargs}
        self.check_layout(cfg)
        reader = CheckpointReader(self.path)  # fails on missing/corrupt files before the build
        with skip_init():  # every parameter is overwritten below: don't generate weights
            model = model_cls(cfg=cfg)
        load_weights(
            model,
            reader,
            self.rules(cfg, model_cls),
            self.ignore_unexpected,
            self.base_model_prefix,
            self.optional_missing,
        )
        # what the export carries over that the libai config does not model (token ids,
        # label names, ...): see save_huggingface
        model.libai_hf_source_config = dict(hf_config)
        record_weights_source(model, "huggingface", self.path)
        return model

    def _default_class(self, hf_config: dict) -> type:
        for arch in hf_config.get("architectures") or ():
            if arch in self.architectures:
                return self.architectures[arch]
        return next(iter(self.architectures.values()))

    @classmethod
    def libai_classes(cls) -> tuple[type, ...]:
        return tuple(cls.architectures.values())

    @classmethod
    def hf_architecture(cls, model: nn.Module) -> str:
        """The Hugging Face class name of ``model``'s libai class."""
        for arch, libai_cls in cls.architectures.items():
            if libai_class(model) is libai_cls:
                return arch
        raise TypeError(f"{cls.__name__} cannot export {type(model).__name__}")


# ---- shared machinery ---------------------------------------------------------------------------


def libai_class(model: nn.Module) -> type:
    """``model``'s own class, seen through the subclass FSDP2's ``fully_shard`` gives it
    (ZeRO-3), so a sharded model exports as the class it was built as."""
    from torch.distributed.fsdp import FSDPModule

    for cls in type(model).__mro__:
        if not issubclass(cls, FSDPModule):
            return cls
    return type(model)


def _shard_spec(param: torch.Tensor) -> ShardSpec | None:
    if not isinstance(param, DTensor):
        return None
    local = param.to_local().shape
    for d, (full, part) in enumerate(zip(param.shape, local)):
        if full != part:
            # the mesh dim that shards ``d`` (the tensor-parallel one of the param's own mesh)
            mesh_dim = next(i for i, p in enumerate(param.placements) if p == Shard(d))
            return ShardSpec(d, param.device_mesh.get_local_rank(mesh_dim), full // part)
    return None


def logical_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The full, unpadded shape (a meta parameter of another stage records it)."""
    for attr in ("libai_logical_shape", "libai_global_shape"):
        shape = getattr(param, attr, None)
        if shape is not None:
            return tuple(shape)
    return tuple(param.shape)


def complete_rules(model: nn.Module, rules: list[Rule]) -> dict[str, Rule]:
    """Rules of the parameters ``model`` has (a pruned pipeline stage has fewer), by name.

    A tied copy (``libai_tied_copy``) without a rule of its own reuses the rule of its tied
    group. Raises if a parameter has no rule (a loader bug).
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    by_name = {r.libai_name: r for r in rules if r.libai_name in params}
    groups: dict[str, Rule] = {}
    for name, p in params.items():
        group = getattr(p, "libai_tied_group", None)
        if group is not None and name in by_name:
            groups[group] = by_name[name]
    for name, p in params.items():
        group = getattr(p, "libai_tied_group", None)
        if name not in by_name and getattr(p, "libai_tied_copy", False) and group in groups:
            by_name[name] = groups[group].renamed(name)
    uncovered = sorted(set(params) - set(by_name))
    if uncovered:
        raise RuntimeError(f"weight mapping of {type(model).__name__} misses {uncovered}")
    return by_name


class _PrefixedReader:
    """A reader whose names may carry or lack the backbone prefix (base vs head checkpoints)."""

    def __init__(self, reader: CheckpointReader, prefix: str):
        self.reader, self.prefix = reader, prefix

    def resolve(self, name: str) -> str | None:
        return prefixed_name(name, self.reader.weight_map, self.prefix)

    def _name(self, name: str) -> str:
        real = self.resolve(name)
        if real is None:
            raise CheckpointError(f"tensor {name!r} is not in {self.reader.path}")
        return real

    def read(self, name, dim=None, start=0, stop=None):
        return self.reader.read(self._name(name), dim, start, stop)

    def shape(self, name):
        return self.reader.shape(self._name(name))

    def dtype(self, name):
        return self.reader.dtype(self._name(name))


def rule_shard(param: torch.Tensor, rule: Rule, reader) -> torch.Tensor:
    """This rank's shard of ``param`` as ``rule`` reads it from ``reader`` (``read`` /
    ``shape`` / ``dtype`` by Hugging Face name)."""
    return rule.load(reader, tuple(param.shape), logical_shape(param), _shard_spec(param))


@torch.no_grad()
def load_rule(param: torch.Tensor, name: str, rule: Rule, reader) -> None:
    """Copy this rank's shard of ``rule``'s tensors in ``reader`` (:func:`rule_shard`) into
    ``param`` (``name``); a meta parameter (another pipeline stage's layer) is skipped."""
    if param.is_meta:
        return
    local = param.to_local() if isinstance(param, DTensor) else param
    value = rule_shard(param, rule, reader)
    if tuple(value.shape) != tuple(local.shape):
        raise RuntimeError(
            f"{name}: loaded shard {list(value.shape)} vs parameter {list(local.shape)}"
        )
    local.copy_(value)


def load_weights(
    model: nn.Module,
    reader: CheckpointReader,
    rules: list[Rule],
    ignore_unexpected: tuple[str, ...] = (),
    prefix: str = "",
    optional_missing: tuple[str, ...] = (),
) -> None:
    """Check ``rules`` against the checkpoint, then copy this rank's shards into ``model``.

    Parameters whose tensors are absent but match ``optional_missing`` are initialized
    instead (see :func:`libai.layers.param.init_deferred`) and named in a warning.
    """
    by_name = complete_rules(model, rules)
    prefixed = _PrefixedReader(reader, prefix)
    params = dict(model.named_parameters(remove_duplicate=False))
    missing, mismatched, used, fresh = [], [], set(), []
    for name, rule in list(by_name.items()):
        for hf_name, shape in expected_shapes(rule, logical_shape(params[name])).items():
            real = prefixed.resolve(hf_name)
            if real is None and any(re.search(p, hf_name) for p in optional_missing):
                fresh.append(name)
                del by_name[name]
                break
            if real is None:
                missing.append(hf_name)
                continue
            used.add(real)
            found = reader.shape(real)
            if found != shape:
                mismatched.append(f"{real}: checkpoint {list(found)} vs config {list(shape)}")
    if missing or mismatched:
        lines = []
        if missing:
            lines.append(f"missing tensors: {sorted(set(missing))}")
        if mismatched:
            lines.append(
                "shapes that contradict config.json: " + "; ".join(sorted(set(mismatched)))
            )
        raise CheckpointError(f"cannot load {reader.path}: " + " | ".join(lines))
    unexpected = [
        k
        for k in reader.keys()
        if k not in used and not any(re.search(p, k) for p in ignore_unexpected)
    ]
    if unexpected:
        logger.warning("unused tensors in %s: %s", reader.path, sorted(unexpected))
    if fresh:
        logger.warning("not in %s, newly initialized: %s", reader.path, fresh)
        for name in fresh:
            if not params[name].is_meta and hasattr(params[name], "libai_deferred_init"):
                init_deferred(params[name])
    for name, rule in by_name.items():
        load_rule(params[name], name, rule, prefixed)
    logger.info("loaded %d tensors from %s", len(used), reader.path)
