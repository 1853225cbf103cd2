"""Load the model to export, in one process: a Hugging Face directory, or a libai training
checkpoint (DCP, any training layout) plus the LazyConfig that built the model."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from torch import nn

from libai.checkpoint.locate import checkpoint_vocab_size, resolve_checkpoint
from libai.onnx_export.wrappers import SUPPORTED_MODEL_TYPES, UnsupportedModelError, model_family

logger = logging.getLogger(__name__)


def _single_process_mesh() -> None:
    from libai import dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError(
            "ONNX export runs in one process; a checkpoint trained on any layout loads into it "
            "(run it with python, not torchrun)"
        )
    dist.setup_dist_util({})


def load_hf_model(path: str | os.PathLike) -> nn.Module:
    """The libai model of the Hugging Face directory ``path`` (config.json + safetensors).
    An unsupported ``model_type`` raises :class:`UnsupportedModelError` before loading."""
    from libai.models.utils import load_huggingface

    config = Path(path) / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"{config} not found: --model-path must be a Hugging Face directory, or a libai "
            "checkpoint together with --config-file"
        )
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported for ONNX export; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    _single_process_mesh()
    return load_huggingface(str(path))


def load_checkpoint_model(
    checkpoint: str | os.PathLike, config_file: str, opts: list[str] | None = None
) -> nn.Module:
    """Build ``model`` of the LazyConfig ``config_file`` (with Hydra-style ``opts`` overrides)
    in one process and load the DCP checkpoint ``checkpoint`` (a checkpoint directory or a
    training output directory) into it, whatever layout it was trained on."""
    from libai.checkpoint.checkpointer import Checkpointer
    from libai.config import LazyConfig, instantiate, try_get_key

    cfg = LazyConfig.load(config_file)
    if opts:
        cfg = LazyConfig.apply_overrides(cfg, list(opts))
    if try_get_key(cfg, "model") is None:
        raise ValueError(f"{config_file} defines no `model`")
    path = resolve_checkpoint(checkpoint)
    _single_process_mesh()
    model = instantiate(cfg.model)
    model_family(model)  # unsupported models fail before the checkpoint is read
    vocab = try_get_key(cfg, "model.cfg.vocab_size")
    if vocab is not None:
        trained = checkpoint_vocab_size(model, path, vocab)
        if trained is not None:
            logger.warning(
                "vocab_size %d in the checkpoint (the config says %d): using %d",
                trained,
                vocab,
                trained,
            )
            cfg.model.cfg.vocab_size = trained
            model = instantiate(cfg.model)
    Checkpointer(model).load(path, checkpointables=[])
    return model


def load_model(
    model_path: str | os.PathLike, config_file: str | None = None, opts: list[str] | None = None
) -> nn.Module:
    """:func:`load_hf_model` without ``config_file``, else :func:`load_checkpoint_model`.
    Raises :class:`UnsupportedModelError` for models that cannot be exported."""
    if config_file is None:
        model = load_hf_model(model_path)
    else:
        model = load_checkpoint_model(model_path, config_file, opts)
    model_family(model)
    return model.eval()


__all__ = ["UnsupportedModelError", "load_model", "load_hf_model", "load_checkpoint_model"]
