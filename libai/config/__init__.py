"""Configs: ``LazyCall`` / ``LazyConfig`` on omegaconf, ``instantiate``, ``@configurable``."""

from libai.config.arguments import default_argument_parser
from libai.config.configurable import configurable
from libai.config.instantiate import instantiate, locate
from libai.config.lazy import LazyCall, LazyConfig, try_get_key
from libai.config.overrides import ConfigKeyError, OverrideError
from libai.config.packaged import get_config, get_config_path
from libai.config.resolve import (
    BatchSizes,
    TrainIters,
    resolve_batch_sizes,
    resolve_train_iters,
)
from libai.config.resolvers import register_resolvers

register_resolvers()  # ${libai_sample:...} resolves in every config, config.yaml included

__all__ = [
    "default_argument_parser",
    "BatchSizes",
    "ConfigKeyError",
    "LazyCall",
    "LazyConfig",
    "OverrideError",
    "TrainIters",
    "configurable",
    "get_config",
    "get_config_path",
    "instantiate",
    "locate",
    "resolve_batch_sizes",
    "resolve_train_iters",
    "try_get_key",
]
