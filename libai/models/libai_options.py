"""Model keys LiBai's config files carry that change nothing on torch.

LiBai's models take OneFlow kernel-fusion switches and options for numerics that torch's
kernels already give. A model listing them in ``libai_no_effect_keys`` accepts them from a
config (``@configurable`` drops them with one log line saying why); any other unknown key is
still an error.
"""

from __future__ import annotations

__all__ = ["LIBAI_NO_EFFECT_MODEL_KEYS"]

_FUSION = "a OneFlow fused kernel of the same math; torch.compile fuses when graph.enabled"

#: key -> why it has no effect here
LIBAI_NO_EFFECT_MODEL_KEYS = {
    "bias_gelu_fusion": _FUSION,
    "bias_dropout_fusion": _FUSION,
    "scale_mask_softmax_fusion": _FUSION,
    "apply_query_key_layer_scaling": (
        "Megatron's fp16 overflow guard: scores scaled by 1/layer then softmax in fp32 "
        "times layer, the same probabilities; attention here runs softmax in fp32"
    ),
    "amp_enabled": "mixed precision is train.amp, applied by the runtime",
}
