"""Multi-process inference pipelines (LiBai's ``libai.inference``).

Every rank builds the same pipeline and calls it with the same inputs; global rank 0 gets
the results, the other ranks ``None``. See :class:`BasePipeline` for the layout arguments
(``data_parallel``, ``tensor_parallel``, ``pipeline_parallel``, ``pipeline_stage_id``) and
the model sources (``mode="huggingface" | "libai" | "random"``).
"""

from libai.inference.basic import BasePipeline
from libai.inference.fill_mask import FillMaskPipeline
from libai.inference.image_classification import ImageClassificationPipeline
from libai.inference.text_classification import TextClassificationPipeline
from libai.inference.text_generation import TextGenerationPipeline

__all__ = [
    "BasePipeline",
    "FillMaskPipeline",
    "ImageClassificationPipeline",
    "TextClassificationPipeline",
    "TextGenerationPipeline",
]
