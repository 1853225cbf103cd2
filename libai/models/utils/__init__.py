"""Hugging Face interop: ``load_huggingface`` / ``save_huggingface`` and the per-architecture
loaders (``GPT2LoaderHuggerFace``, ``BertLoaderHuggerFace``, ... as in LiBai)."""

from __future__ import annotations

import importlib

from torch import nn

from libai.layers.param import init_method_normal, scaled_init_method_normal
from libai.models.utils.hf_export import save_huggingface
from libai.models.utils.hf_io import CheckpointError, CheckpointReader, read_hf_config
from libai.models.utils.model_loader.base_loader import ModelLoaderHuggerFace, libai_class

#: ``model_type`` of config.json -> "module:LoaderClass"
LOADERS = {
    "gpt2": "libai.models.utils.model_loader.gpt_loader:GPT2LoaderHuggerFace",
    "bert": "libai.models.utils.model_loader.bert_loader:BertLoaderHuggerFace",
    "roberta": "libai.models.utils.model_loader.roberta_loader:RobertaLoaderHuggerFace",
    "ernie": "libai.models.utils.model_loader.ernie_loader:ErnieLoaderHuggerFace",
    "t5": "libai.models.utils.model_loader.t5_loader:T5LoaderHuggerFace",
    "mt5": "libai.models.utils.model_loader.t5_loader:T5LoaderHuggerFace",
    "llama": "libai.models.utils.model_loader.llama_loader:LlamaLoaderHuggerFace",
    "qwen2": "libai.models.utils.model_loader.llama_loader:LlamaLoaderHuggerFace",
    "qwen3": "libai.models.utils.model_loader.llama_loader:LlamaLoaderHuggerFace",
    "qwen3_moe": "libai.models.utils.model_loader.moe_loader:MoELoaderHuggerFace",
    "olmoe": "libai.models.utils.model_loader.moe_loader:MoELoaderHuggerFace",
    "deepseek_v3": "libai.models.utils.model_loader.deepseek_loader:DeepseekV3LoaderHuggerFace",
    "mixtral": "libai.models.utils.model_loader.moe_loader:MoELoaderHuggerFace",
    "qwen2_moe": "libai.models.utils.model_loader.moe_loader:MoELoaderHuggerFace",
    "vit": "libai.models.utils.model_loader.vit_loader:ViTLoaderHuggerFace",
    "swin": "libai.models.utils.model_loader.swin_loader:SwinLoaderHuggerFace",
    "swinv2": "libai.models.utils.model_loader.swin_loader:Swinv2LoaderHuggerFace",
}


def __getattr__(name: str):
    """``GraphBase`` at LiBai's path, from :mod:`libai.runtime.graph` on first use."""
    if name == "GraphBase":
        return importlib.import_module("libai.runtime.graph").GraphBase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_loader_class(model_type: str) -> type[ModelLoaderHuggerFace]:
    """The loader of a config.json ``model_type``; the error lists the supported ones."""
    if model_type not in LOADERS:
        raise CheckpointError(
            f"unsupported model_type {model_type!r}; supported: {sorted(LOADERS)}"
        )
    module, name = LOADERS[model_type].split(":")
    return getattr(importlib.import_module(module), name)


def _model_type(model: nn.Module) -> str | None:
    """The ``model_type`` hyper-parameter of ``model`` or of its backbone, if it has one."""
    for module in (model, getattr(model, "model", None)):
        cfg = getattr(module, "libai_cfg", None)
        if isinstance(cfg, dict) and cfg.get("model_type") in LOADERS:
            return cfg["model_type"]
    return None


def loader_for_model(model: nn.Module) -> type[ModelLoaderHuggerFace]:
    """The loader class that can export ``model``'s libai class (its own ``model_type``'s
    where one class serves several families)."""
    own = _model_type(model)
    if own is not None and libai_class(model) in get_loader_class(own).libai_classes():
        return get_loader_class(own)
    for model_type in LOADERS:
        loader = get_loader_class(model_type)
        if libai_class(model) in loader.libai_classes():
            return loader
    raise TypeError(f"no Hugging Face exporter for {type(model).__name__}")


def load_huggingface(path: str, model: type | None = None, libai_cfg=None, **overrides):
    """Build the libai model of the Hugging Face directory ``path`` on the current mesh.

    ``config.json``'s ``model_type`` picks the loader and its ``architectures`` the libai class
    (``model`` overrides it); ``libai_cfg`` / ``overrides`` set libai hyper-parameters.
    Call :func:`libai.dist.setup_dist_util` first for a parallel layout.
    """
    model_type = read_hf_config(str(path)).get("model_type")
    loader = get_loader_class(model_type)
    return loader(model, libai_cfg, str(path), **overrides).load()


__all__ = [
    "GraphBase",
    "init_method_normal",
    "scaled_init_method_normal",
    "LOADERS",
    "CheckpointError",
    "CheckpointReader",
    "ModelLoaderHuggerFace",
    "get_loader_class",
    "load_huggingface",
    "loader_for_model",
    "save_huggingface",
]
