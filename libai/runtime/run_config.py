"""What a LiBai-style config (``train`` / ``model`` / ``tokenization``) resolves to before a
run, shared by the LiBai door, the memory estimator and the inference pipelines: the
pipeline layer count and the tokenizer with the vocabulary padded as training pads it."""

from __future__ import annotations

import logging

from libai.config import try_get_key
from libai.data.sample_corpus import prepare_sample_data
from libai.tokenizer import build_tokenizer

logger = logging.getLogger(__name__)


def model_num_layers(model_cfg) -> int | None:
    """The pipeline layer count of a libai ``model.cfg``: ``hidden_layers`` (ViT: ``depth``)
    plus T5's ``num_decoder_layers``; ``None`` when it names none."""
    if model_cfg is None:
        return None
    layers = try_get_key(model_cfg, "hidden_layers")
    if layers is None:
        layers = try_get_key(model_cfg, "depth")
    if layers is None:
        return None
    return int(layers) + int(try_get_key(model_cfg, "num_decoder_layers", default=0) or 0)


def fill_pipeline_num_layers(cfg) -> None:
    """pp > 1 needs the layer count: :func:`model_num_layers` of ``model.cfg`` when
    ``train.dist.pipeline_num_layers`` is unset."""
    dist_cfg = cfg.train.dist
    pp = dist_cfg.get("pipeline_parallel_size", 1) or 1
    if pp > 1 and dist_cfg.get("pipeline_num_layers") is None:
        layers = model_num_layers(try_get_key(cfg, "model.cfg"))
        if layers is not None:
            dist_cfg.pipeline_num_layers = layers


def sizes_vocab_from_tokenizer(cfg) -> bool:
    """Whether the tokenizer sets ``model.cfg.vocab_size``: as in LiBai, whenever the config
    has a tokenizer and the model a ``vocab_size``, unless ``tokenization.setup=False`` keeps
    the config's (weights converted with their own vocabulary)."""
    return (
        try_get_key(cfg, "tokenization.tokenizer") is not None
        and try_get_key(cfg, "tokenization.setup", default=None) is not False
        and try_get_key(cfg, "model.cfg.vocab_size") is not None
    )


def build_run_tokenizer(cfg):
    """The tokenizer of ``cfg.tokenization`` (None without one); builds the sample data, in
    our cache directory, if a config value says ``${libai_sample:...}``. Unless
    ``tokenization.setup=False`` (:func:`sizes_vocab_from_tokenizer`) it sets
    ``model.cfg.vocab_size`` to the tokenizer's size padded to a multiple of
    ``tokenization.make_vocab_size_divisible_by`` (LiBai's default 128), the same on every
    layout, so checkpoints load on any tp (the vocab-parallel layers pad
    their shards to a multiple of tp themselves, and mask those rows)."""
    sample = prepare_sample_data(cfg)  # every rank may call it: a file lock builds it once
    if sample is not None:
        logger.info("Sample dataset (Python stdlib sources, built offline): %s", sample["data_dir"])
    if try_get_key(cfg, "tokenization.tokenizer") is None:
        return None
    tokenizer = build_tokenizer(cfg.tokenization)
    # (a project's own tokenizer without padded_vocab_size leaves the model's, as LiBai)
    if sizes_vocab_from_tokenizer(cfg) and hasattr(tokenizer, "padded_vocab_size"):
        cfg.model.cfg.vocab_size = tokenizer.padded_vocab_size(
            try_get_key(cfg, "tokenization.make_vocab_size_divisible_by", default=128)
        )
    return tokenizer
