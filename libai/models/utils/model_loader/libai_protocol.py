"""LiBai's loader protocol, for the loaders LiBai's projects write themselves.

A LiBai project subclasses ``ModelLoaderHuggerFace`` and overrides two hooks:
``_load_config_from_json(config_file)`` (copies ``config.json`` values into ``self.libai_cfg``
with ``self._update_cfg``) and ``_convert_state_dict(state_dict, cfg)`` (renames and fuses
the Hugging Face tensors into the model's names, e.g. q/k/v into one ``query_key_value``
with ``self._fix_qkv_ordering``). :class:`LiBaiLoaderProtocol` gives those helpers and the
load that calls the hooks (:meth:`LiBaiLoaderProtocol._libai_protocol_load`), which
``ModelLoaderHuggerFace.load`` runs when a subclass overrides ``_convert_state_dict``; the
loaders of libai's own models use the rule tables instead (``base_loader``).

The load reads the whole checkpoint on every rank (the hook needs whole tensors: LiBai
reads it on rank 0 and broadcasts), builds the model from the updated config, then copies
into each parameter its share (``distribute_tensor`` of the whole tensor on the
parameter's own mesh and placements, no communication). Tensors are read weights-only
(``safetensors``, or ``torch.load(weights_only=True)`` for ``.bin``): nothing runs code.
"""

from __future__ import annotations

import copy
import glob
import logging
import os

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from libai.config import instantiate
from libai.models.utils.hf_io import CheckpointError, record_weights_source

logger = logging.getLogger(__name__)

__all__ = ["LiBaiLoaderProtocol", "ModelLoaderLiBai", "copy_whole_tensors", "prefixed_name"]


class LiBaiLoaderProtocol:
    """LiBai's hooks and helpers of ``ModelLoaderHuggerFace`` (see the module doc)."""

    def _init_libai_protocol(self, model, libai_cfg, pretrained_model_path, kwargs) -> None:
        self.model = model  # a LazyCall config node of the model, or its class
        self.libai_cfg = dict(libai_cfg or {})
        self.pretrained_model_path = pretrained_model_path
        self.kwargs = kwargs
        self.base_model_prefix_1 = None  # the backbone's prefix in transformers
        self.base_model_prefix_2 = None  # ... in the libai model
        self.origin_libai_cfg = copy.deepcopy(self.libai_cfg)
        self.changed_keys: set[str] = set()

    # ---- the hooks a project overrides ---------------------------------------------------------
    def _convert_state_dict(self, flow_state_dict, cfg):
        """Hugging Face tensors (by their names) -> the model's (LiBai's hook)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _convert_state_dict")

    def _load_config_from_json(self, config_file):
        """Copy ``config.json``'s values into ``self.libai_cfg`` (LiBai's hook)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement _load_config_from_json"
        )

    # ---- LiBai's helpers -----------------------------------------------------------------------
    def _update_cfg(self, keys_libai, value_target) -> None:
        """Set ``libai_cfg[keys_libai]`` (only a key the config has, as LiBai)."""
        if keys_libai in self.libai_cfg and self.libai_cfg[keys_libai] != value_target:
            self.libai_cfg[keys_libai] = value_target

    def _update_cfg_log(self) -> None:
        for key in sorted(self.libai_cfg):
            if self.origin_libai_cfg.get(key) != self.libai_cfg[key]:
                self.changed_keys.add(key)
                logger.info(
                    "changed libai model cfg %s: %s -> %s",
                    key,
                    self.origin_libai_cfg.get(key),
                    self.libai_cfg[key],
                )

    @staticmethod
    def _fix_key(state_dict):
        """TensorFlow-era names: ``gamma`` -> ``weight``, ``beta`` -> ``bias``."""
        renamed = {}
        for key, value in state_dict.items():
            renamed[key.replace("gamma", "weight").replace("beta", "bias")] = value
        return renamed

    @staticmethod
    def _fix_qkv_ordering(qkv, head_size, num_heads, hidden_size=None, checkpoint_version=0.0):
        """``[q; k; v]`` stacked along dim 0 -> grouped per head ``[h0: q k v, h1: ...]``
        (the fused projection's layout, which splits by heads over tp)."""
        hidden_size = head_size * num_heads if hidden_size is None else hidden_size
        parts = qkv.shape[0] // (head_size * num_heads)
        if qkv.ndim > 1:
            qkv = qkv.view(parts, num_heads, head_size, hidden_size).permute(1, 0, 2, 3)
            return qkv.contiguous().view(parts * head_size * num_heads, hidden_size)
        return qkv.view(parts, num_heads, head_size).permute(1, 0, 2).contiguous().view(-1)

    # ---- the load ------------------------------------------------------------------------------
    def _read_tensors(self) -> dict[str, torch.Tensor]:
        path = self.pretrained_model_path
        if not path or not os.path.isdir(path):
            raise CheckpointError(f"{path} is not a directory (a Hugging Face model directory)")
        files = sorted(glob.glob(os.path.join(path, "*.bin")))
        if files:
            state = {}
            for file in files:
                state.update(torch.load(file, map_location="cpu", weights_only=True))
            return state
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise CheckpointError(f"no file named *.bin or *.safetensors in {path}")
        state = {}
        for file in files:
            state.update(load_file(file))
        return state

    def _libai_protocol_load(self) -> nn.Module:
        config_file = os.path.join(str(self.pretrained_model_path), "config.json")
        if os.path.isfile(config_file):
            self._load_config_from_json(config_file)
        state = self._fix_key(self._read_tensors())
        state = self._convert_state_dict(state, self.libai_cfg)
        model = self._build_model()
        copy_whole_tensors(
            model, dict(state), self.base_model_prefix_2 or "", self.pretrained_model_path
        )
        record_weights_source(model, "huggingface", str(self.pretrained_model_path))
        return model

    def _build_model(self) -> nn.Module:
        model = self.model
        if hasattr(model, "keys") and "_target_" in model:  # a LazyCall node
            node = copy.deepcopy(model)
            node.cfg = self.libai_cfg
            return instantiate(node)
        return model(cfg=self.libai_cfg)


def copy_whole_tensors(model: nn.Module, state: dict, prefix: str, source) -> None:
    """Copy checkpoint tensors (whole) into ``model``'s parameters and buffers, each rank its
    share; a checkpoint naming the backbone with or without ``prefix`` matches either way.
    A vocabulary padded for tensor parallel takes the rows the checkpoint has (the rest
    zero). Raises naming the parameters the checkpoint lacks or whose shapes differ."""
    own = model.state_dict(keep_vars=True)
    missing, mismatched = [], []
    for name, target in own.items():
        key = prefixed_name(name, state, prefix)
        if key is None:
            if isinstance(target, nn.Parameter):
                missing.append(name)
            continue
        whole = state.pop(key)
        shape = tuple(target.shape)
        if tuple(whole.shape) != shape:
            rows = whole.shape[0] <= shape[0] and tuple(whole.shape[1:]) == shape[1:]
            if not rows:
                mismatched.append(f"{name} {tuple(whole.shape)} vs {shape}")
                continue
            whole = torch.cat([whole, whole.new_zeros(shape[0] - whole.shape[0], *shape[1:])])
        whole = whole.to(dtype=target.dtype)
        with torch.no_grad():
            if isinstance(target, DTensor):
                # [B] (every rank holds the whole tensor) -> [its placements]: no communication
                share = distribute_tensor(
                    whole.to(target.device),
                    target.device_mesh,
                    target.placements,
                    src_data_rank=None,
                )
                target.to_local().copy_(share.to_local())
            else:
                target.copy_(whole.to(target.device))
    if missing or mismatched:
        raise CheckpointError(
            f"{source} does not fit {type(model).__name__}: "
            + "; ".join(
                part
                for part in (
                    f"missing {missing}" if missing else "",
                    f"shapes differ: {mismatched}" if mismatched else "",
                )
                if part
            )
        )
    if state:
        logger.info("unused checkpoint tensors: %s", sorted(state))


def prefixed_name(name: str, keys, prefix: str) -> str | None:
    """The key of ``keys`` holding ``name``: itself, or with the backbone ``prefix``
    (``model.``) added or removed; ``None`` if none."""
    if name in keys:
        return name
    if prefix and name.startswith(prefix + ".") and name[len(prefix) + 1 :] in keys:
        return name[len(prefix) + 1 :]
    if prefix and f"{prefix}.{name}" in keys:
        return f"{prefix}.{name}"
    return None


class ModelLoaderLiBai(LiBaiLoaderProtocol):
    """LiBai's loader of a model saved by LiBai itself, here a libai checkpoint directory
    (``output_dir/model_final``): ``Loader(model, libai_cfg, path).load()`` builds the model
    from ``libai_cfg`` and loads the checkpoint's weights into it, on any layout (a LiBai
    project's ``LlamaLoaderLiBai`` subclasses it)."""

    def __init__(self, model, libai_cfg, pretrained_model_path, **kwargs):
        self._init_libai_protocol(model, libai_cfg, pretrained_model_path, kwargs)

    def load(self) -> nn.Module:
        import importlib  # the checkpoint package sits above the models (its Checkpointer)

        checkpointer = importlib.import_module("libai.checkpoint").Checkpointer
        model = self._build_model()
        checkpointer(model).load(str(self.pretrained_model_path), checkpointables=[])
        return model
