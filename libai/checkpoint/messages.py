"""How a partial load is reported (LiBai's / detectron2's messages): the keys of the model a
checkpoint lacks, and those it holds that the model has not, grouped by module so that a
whole missing layer is one line (``encoder.layers.3.{bias, weight}``)."""

from __future__ import annotations

from collections import defaultdict

__all__ = ["get_missing_parameters_message", "get_unexpected_parameters_message", "group_keys"]


def group_keys(keys: list[str]) -> list[str]:
    """``keys`` grouped by their prefix up to the last dot: ``a.b.{w, b}`` for ``a.b.w`` and
    ``a.b.b``; a key alone in its group stays as it is. Sorted."""
    groups: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        prefix, _, leaf = key.rpartition(".")
        groups[prefix].append(leaf)
    lines = []
    for prefix, leaves in groups.items():
        leaves = sorted(leaves)
        head = f"{prefix}." if prefix else ""
        lines.append(head + leaves[0] if len(leaves) == 1 else f"{head}{{{', '.join(leaves)}}}")
    return sorted(lines)


def get_missing_parameters_message(keys: list[str]) -> str:
    """The message for model parameters / buffers the checkpoint does not have."""
    body = "\n".join(f"  {line}" for line in group_keys(keys))
    return "Some model parameters or buffers are not found in the checkpoint:\n" + body


def get_unexpected_parameters_message(keys: list[str]) -> str:
    """The message for checkpoint entries the model does not have."""
    body = "\n".join(f"  {line}" for line in group_keys(keys))
    return "The checkpoint state_dict contains keys that are not used by the model:\n" + body
