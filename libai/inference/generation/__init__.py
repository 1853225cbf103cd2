"""Text generation: KV-cached decoding with greedy, sampling and beam search.

``generate(stepper, input_ids, attention_mask, **settings)`` decodes with any stepper:
:class:`ModelStepper` (a libai model on any tensor / pipeline layout) or the onnxruntime
stepper of :mod:`libai.onnx_export`. Settings are :class:`GenerationConfig` fields;
``cache_implementation="static"`` and ``compile=True`` select the fixed-shape cache and the
compiled decode step of :class:`ModelStepper`.
"""

from libai.inference.generation.config import GenerationConfig
from libai.inference.generation.generate import generate
from libai.inference.generation.stepper import ModelStepper
from libai.layers.kv_cache import KVCache, StaticKVCache

__all__ = ["GenerationConfig", "KVCache", "ModelStepper", "StaticKVCache", "generate"]
