"""Numerics alignment (PaDiff for PyTorch and DTensor): record two models module by module,
dump what they computed, and find the first module where they disagree.

- :func:`create_model` wraps any ``nn.Module`` in a :class:`ModelRecorder`;
- :func:`check_report` / :func:`check_params` / :func:`check_weights` / :func:`check_grads`
  compare two dumps offline;
- :func:`auto_diff` runs two models on the same data and does all of it;
- :func:`assign_weight` copies one model's weights into the other.

See ``docs/align.md``.
"""

from libai.align.assign import assign_weight
from libai.align.auto_diff import auto_diff
from libai.align.checker import check_grads, check_params, check_report, check_weights
from libai.align.recorder import ModelRecorder, create_model

__all__ = [
    "ModelRecorder",
    "assign_weight",
    "auto_diff",
    "check_grads",
    "check_params",
    "check_report",
    "check_weights",
    "create_model",
]
