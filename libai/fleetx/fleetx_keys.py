"""PaddleFleetX's own config keys, each with its meaning here.

FleetX's YAML files (``ppfleetx/configs/nlp/gpt/*.yaml`` and friends) carry keys for Paddle
machinery. Each is either honoured -- mapped onto what it means here -- or accepted with
one log line saying it has no effect here and why (:data:`NO_EFFECT`). Sections that switch
on something this library does not do (quantization-aware training, pruning, TensorRT)
are accepted while off and are a one-line error when on (:func:`check_unsupported`).

Honoured (where):

- ``Model.sequence_parallel`` -> ``train.dist.sequence_parallel`` (with ``mp_degree > 1``);
  ``Model.virtual_pp_degree`` -> ``virtual_pipeline_size`` and the interleaved 1F1B schedule
  (``libai.fleetx.yaml_setup.dist_config``);
- ``Model.recompute_granularity`` full / full_attn / core_attn and
  ``Model.no_recompute_layers`` -> activation checkpointing of the whole block, of the
  attention sub-layer, or of the attention core, skipping the listed layers
  (``yaml_setup.train_namespace``, :mod:`libai.layers.checkpointing`);
- ``Model.vocab_size_divisible_unit`` -> the vocabulary padded to a multiple of
  ``unit x mp_degree`` (:func:`padded_vocab_size`, FleetX's rule);
- ``Optimizer.lr.use_increments`` -> the cosine schedule advances by the global batch each
  step (``libai.fleetx.yaml_optim``); FleetX's GPT modules first turn ``decay_steps`` into
  samples (``libai.fleetx.modules.gpt.GPTModule.process_configs``), as FleetX does;
- ``Profiler`` -> ``torch.profiler`` over FleetX's ``scheduler: [start, end)`` steps, a
  Chrome trace under ``output_dir/<profiler_log>`` (:mod:`libai.fleetx.profiler`);
- strings FleetX reads as Python literals (``epsilon: 1e-6`` is a string to YAML 1.1; FleetX
  ``literal_eval`` s every string) are read the same way (:func:`literal_values`).
"""

from __future__ import annotations

import ast
import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "NO_EFFECT",
    "SCHEMA",
    "announce_no_effect_keys",
    "check_unsupported",
    "literal_values",
    "padded_vocab_size",
]

_SDPA = "attention runs torch's scaled_dot_product_attention"

#: key path -> why it has no effect here (logged once, when the key is set in a config)
NO_EFFECT: dict[str, str] = {
    "Model.fused_linear": "torch's linear already adds the bias in its matmul (addmm)",
    "Model.fuse_attn_qkv": "libai's attention always projects q, k and v with one fused matmul",
    "Model.use_flash_attn": f"{_SDPA}, which picks the flash kernel where the GPU supports it",
    "Model.fused_softmax_with_triangular": f"{_SDPA} with is_causal: the masked softmax is fused",
    "Model.scale_qk_by_layer_num": (
        "a Paddle fp16 overflow guard that leaves the attention probabilities unchanged; "
        f"{_SDPA}, which keeps its softmax in fp32"
    ),
    "Model.type_vocab_size": "FleetX's GPT has no token-type embedding either",
    "Model.name": "the model comes from Model.module",
    "Distributed.hcg": (
        "FleetX's communication-group class (HybridCommGroupForMoE): the mesh's process "
        "groups serve every layout, the experts' included"
    ),
    "Distributed.fuse_sequence_parallel_allreduce": (
        "sequence-parallel gradients are all-reduced in one call per step already"
    ),
    "Distributed.sharding.reduce_overlap": "ZeRO's reduces run after backward here",
    "Distributed.sharding.broadcast_overlap": "ZeRO's broadcasts run after the step here",
    "Distributed.sharding.comm_overlap": "ZeRO's collectives run after backward here",
    "Optimizer.tensor_fusion": "torch's AdamW already updates all tensors in one foreach call",
    "Optimizer.multi_precision": (
        "fp32 master weights follow Engine.mix_precision.level (O2 keeps them)"
    ),
    "Fused.tensor_fusion": "torch's optimizers already update all tensors in one foreach call",
    "Engine.mix_precision.use_fp16_guard": (
        "autocast decides per op; Paddle's fp16 guard blocks have no counterpart"
    ),
    "Global.flags": "Paddle runtime flags (FLAGS_*) have no counterpart in PyTorch",
    "Global.binary_head": "only ErnieModule reads it (the sentence-pair loss)",
    "Tuning": "FleetX's auto-tuning of recompute; set Model.recompute_granularity yourself",
    "Data.Train.sample_split": "auto-parallel input splitting; batches are split by the runtime",
    "Data.Eval.sample_split": "auto-parallel input splitting; batches are split by the runtime",
}

#: FleetX keys the fixed sections accept besides libai's (merged into yaml_config.DEFAULTS)
SCHEMA: dict[str, Any] = {
    "Global": {"flags": None, "binary_head": None},
    "Engine": {"mix_precision": {"use_fp16_guard": None}},
    "Distributed": {
        "fuse_sequence_parallel_allreduce": None,
        "sharding": {"reduce_overlap": None, "broadcast_overlap": None, "comm_overlap": None},
    },
    "Inference": {"mp_degree": 1, "TensorRT": None},
    "Profiler": {
        "enable": False,
        "scheduler": None,
        "profiler_log": "profiler_log",
        "detailed": False,
        "record_shapes": True,
        "profile_memory": True,
    },
}
#: FleetX sections whose keys are free (read where used, or switches checked below)
OPEN_SECTIONS = ("Fused", "Loss", "Compress", "Quantization", "Tuning")
#: keys a Data split may carry besides dataset / sampler / loader
SPLIT_KEYS = ("collate_fn", "sample_split")


def _get(cfg, path: str):
    node = cfg
    for part in path.split("."):
        if node is None or not hasattr(node, "get"):
            return None
        node = node.get(part)
    return node


#: :data:`NO_EFFECT` keys that these ``Model.module`` names read (no log line for them)
READ_BY_MODULE = {
    "Model.type_vocab_size": ("ErnieModule", "ErnieSeqClsModule"),
    "Global.binary_head": ("ErnieModule",),
}


def announce_no_effect_keys(cfg) -> list[str]:
    """One log line for each :data:`NO_EFFECT` key set (not null / False) in ``cfg``.
    Returns the keys named."""
    named = []
    module = _get(cfg, "Model.module")
    for path, why in NO_EFFECT.items():
        if module in READ_BY_MODULE.get(path, ()):
            continue
        value = _get(cfg, path)
        if value is None or value is False or value == {} or value == []:
            continue
        if path == "Tuning" and not _get(cfg, "Tuning.enable"):
            continue
        logger.info("FleetX key %s=%s has no effect here: %s", path, _show(value), why)
        named.append(path)
    return named


def _show(value) -> str:
    return "{...}" if hasattr(value, "items") else repr(value)


def check_unsupported(cfg, mode: str = "train") -> None:
    """A one-line error for a FleetX section that is switched on and not supported here:
    ``Compress`` (quantization-aware training, pruning), ``Quantization``, and
    ``Inference.TensorRT`` (for inference)."""
    from libai.fleetx.yaml_config import YAMLConfigError

    for section in ("Compress", "Quantization"):
        node = cfg.get(section)
        if not node:
            continue
        parts = [node, *(node.get(k) for k in ("Quantization", "Prune") if node.get(k))]
        if any(part.get("enable") for part in parts if hasattr(part, "get")):
            raise YAMLConfigError(
                f"{section} is enabled: quantization-aware training and pruning are not "
                "supported here; remove the section (or -o ~"
                f"{section}) -- export in fp32 with tools/export.py and quantize the ONNX "
                "model with onnxruntime's quantization tools instead"
            )
    trt = _get(cfg, "Inference.TensorRT")
    if trt and mode == "inference":
        raise YAMLConfigError(
            "Inference.TensorRT is set: TensorRT is not supported here; remove it (-o "
            "~Inference.TensorRT) -- tools/inference.py runs the exported ONNX model with "
            "onnxruntime (CPU, or CUDA where onnxruntime-gpu is installed)"
        )


def literal_values(data):
    """``data`` with each string that is a Python literal replaced by its value, as FleetX's
    config reader does (``"1e-6"`` -> ``1e-06``, ``"[1, 5]"`` -> ``[1, 5]``); other strings
    stay."""
    if isinstance(data, dict):
        return {k: literal_values(v) for k, v in data.items()}
    if isinstance(data, list):
        return [literal_values(v) for v in data]
    if isinstance(data, str):
        try:
            value = ast.literal_eval(data)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return data
        return value if value is None or isinstance(value, (int, float, list, dict)) else data
    return data


def padded_vocab_size(vocab_size: int, divisible_unit: int, mp_degree: int) -> int:
    """FleetX's ``vocab_size_with_padding``: the next multiple of ``divisible_unit x
    mp_degree`` (so every tensor-parallel shard of the embedding has whole units)."""
    multiple = int(divisible_unit) * int(mp_degree)
    if multiple < 1:
        raise ValueError(f"Model.vocab_size_divisible_unit must be positive, got {divisible_unit}")
    return -(-int(vocab_size) // multiple) * multiple
