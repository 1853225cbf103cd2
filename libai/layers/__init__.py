"""Parallel layers: each holds DTensor parameters laid out on its pipeline stage's mesh."""

from libai.layers.activation import build_activation
from libai.layers.attention import MultiheadAttention
from libai.layers.chunked_loss import chunked_lm_loss, lm_head_input
from libai.layers.collectives import copy_to_tp, gather_from_tp, reduce_from_tp, scatter_to_tp
from libai.layers.cross_entropy import ParallelCrossEntropyLoss
from libai.layers.droppath import DropPath, drop_path
from libai.layers.embedding import Embedding, SinePositionalEmbedding, VocabEmbedding
from libai.layers.kv_cache import KVCache, LayerKVCache
from libai.layers.layer_norm import LayerNorm, RMSLayerNorm
from libai.layers.linear import Linear
from libai.layers.lm_logits import LMLogits
from libai.layers.mlp import MLP
from libai.layers.moe import MoE, MoEConfig, collect_moe_losses
from libai.layers.param import (
    create_parameter,
    init_method_normal,
    local_value,
    scaled_init_method_normal,
)
from libai.layers.patch_embedding import PatchEmbedding
from libai.layers.relative_position import RelativePositionBias, relative_position_bucket
from libai.layers.rotary import RotaryEmbedding, apply_rotary_pos_emb, rope_inv_freq
from libai.layers.transformer_layer import TransformerLayer, build_norm

__all__ = [
    "DropPath",
    "Embedding",
    "SinePositionalEmbedding",
    "build_activation",
    "drop_path",
    "KVCache",
    "LMLogits",
    "LayerKVCache",
    "LayerNorm",
    "Linear",
    "MLP",
    "MoE",
    "MoEConfig",
    "MultiheadAttention",
    "ParallelCrossEntropyLoss",
    "RMSLayerNorm",
    "RelativePositionBias",
    "RotaryEmbedding",
    "TransformerLayer",
    "VocabEmbedding",
    "PatchEmbedding",
    "apply_rotary_pos_emb",
    "build_norm",
    "chunked_lm_loss",
    "collect_moe_losses",
    "copy_to_tp",
    "create_parameter",
    "gather_from_tp",
    "init_method_normal",
    "lm_head_input",
    "local_value",
    "reduce_from_tp",
    "relative_position_bucket",
    "rope_inv_freq",
    "scaled_init_method_normal",
    "scatter_to_tp",
]
