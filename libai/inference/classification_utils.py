"""Scores and labels shared by the text and image classification pipelines, computed as
``transformers``' pipelines compute them (numpy, float32)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

FUNCTIONS = ("softmax", "sigmoid", "none")


def default_function(hf_config: Mapping, num_labels: int) -> str:
    """``transformers``' default: none for regression, sigmoid for multi-label or a single
    label, softmax otherwise."""
    problem_type = hf_config.get("problem_type")
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def check_function(function_to_apply) -> str | None:
    """``function_to_apply`` lower-cased, or ``ValueError`` naming the accepted values."""
    if function_to_apply is None:
        return None
    name = str(getattr(function_to_apply, "value", function_to_apply)).lower()
    if name not in FUNCTIONS:
        raise ValueError(f"function_to_apply must be one of {list(FUNCTIONS)}, got {name!r}")
    return name


def apply_function(logits: np.ndarray, function: str) -> np.ndarray:
    """Scores of one row of logits."""
    logits = np.asarray(logits, dtype=np.float32)
    if function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    if function == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    return logits


def id2label(hf_config: Mapping, num_labels: int) -> dict[int, str]:
    """Label names from ``config.json``'s ``id2label``, else ``LABEL_{i}``."""
    names = {int(k): str(v) for k, v in (hf_config.get("id2label") or {}).items()}
    return {i: names.get(i, f"LABEL_{i}") for i in range(num_labels)}


def check_top_k(top_k, allow_none: bool = False):
    """``top_k`` must be a positive int (or ``None`` where that means all)."""
    if top_k is None and allow_none:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    return top_k


def ranked_labels(
    scores: np.ndarray, labels: Mapping[int, str], top_k: int | None
) -> list[dict[str, float | str]]:
    """``[{"label", "score"}]`` sorted by score (stable), the first ``top_k`` (all: None)."""
    items = [{"label": labels[i], "score": float(s)} for i, s in enumerate(scores)]
    items.sort(key=lambda x: x["score"], reverse=True)
    return items if top_k is None else items[:top_k]
