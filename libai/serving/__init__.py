"""Serving: an OpenAI-compatible HTTP server over continuous batching and a paged KV cache.

- :mod:`~libai.serving.engine`: :class:`LLMEngine`, requests in, tokens out, step by step;
- :mod:`~libai.serving.scheduler`: continuous batching, chunked prefill, preemption;
- :mod:`~libai.serving.blocks`: the paged cache's block accounting;
- :mod:`~libai.serving.executor`: the model over one step, on every rank of the layout;
- :mod:`~libai.serving.sampling`: per-request settings and token choice;
- :mod:`~libai.serving.api` / :mod:`~libai.serving.cli`: the HTTP front and ``libai-serve``.
"""

from libai.serving.engine import EngineConfig, LLMEngine, SequenceOutput
from libai.serving.executor import ModelExecutor, StepPlan
from libai.serving.sampling import InvalidParameter, SamplingParams

__all__ = [
    "EngineConfig",
    "InvalidParameter",
    "LLMEngine",
    "ModelExecutor",
    "SamplingParams",
    "SequenceOutput",
    "StepPlan",
]
