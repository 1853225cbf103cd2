"""Text generation: KV-cached decoding with greedy, sampling and beam search.

``generate(stepper, input_ids, attention_mask, **settings)`` decodes with any stepper:
:class:`ModelStepper` (a libai model on any tensor / pipeline layout) or the onnxruntime
stepper of :mod:`libai.onnx_export`. Settings are :class:`GenerationConfig` fields.
"""

from libai.inference.generation.config import GenerationConfig
from libai.inference.generation.generate import generate
from libai.inference.generation.stepper import ModelStepper
from libai.layers.kv_cache import KVCache

__all__ = ["GenerationConfig", "KVCache", "ModelStepper", "generate"]
