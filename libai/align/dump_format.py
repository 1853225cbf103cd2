"""The on-disk layout of alignment dumps, shared by the recorder and the checkers.

::

    <root>/<model name>/step_<k>/rank_<r>/
        report.json          the forward / backward call tree of step k on rank r
        tensors.safetensors  every recorded tensor, full (tensor-parallel shards gathered)
        params.json          parameters: names, comparison keys, shapes, layouts, statistics
        weights.safetensors  parameter values by comparison key (full, Hugging Face layout
                             for libai models that have a Hugging Face loader)
        grads.safetensors    parameter gradients, same keys and layouts

``report.json``::

    {"format": "libai.align/1", "model": name, "model_class": "GPT2LMHeadModel",
     "step": k, "rank": r, "world_size": W,
     "layout": {"dp": .., "tp": .., "pp": .., "dp_rank": .., "tp_rank": .., "pp_rank": ..},
     "nodes": [node, ...]}                         # in forward call order

    node = {"id": i,                 # index in "nodes"
            "route": "transformer.h.0.attn",  # the module's name in the model ("" = root)
            "key": "transformer.h.0.attn",    # the name compared (route after rename rules)
            "call": c,               # this is the c-th call of the module in the step
            "type": "GPT2Attention",
            "parent": j | null,      # the enclosing recorded call whose route is a prefix
            "mapped": bool,          # in the layer map: compared at its boundary only
            "bwd_order": n | null,   # rank of this node's gradients in backward order
            "outputs": [tensor, ...],  # forward outputs (nested outputs flattened)
            "grads": [tensor, ...]}    # gradients w.r.t. the differentiable inputs

    tensor = {"tensor": "fwd.<id>.<j>" | "bwd.<id>.<j>",  # key in tensors.safetensors
              "shape": [...], "dtype": "float32", "stats": {...},
              "placements": ["S(-1)"] | null,  # the layout it was gathered from (DTensor notation)
              "mesh": {"dim_names": ["tp"], "shape": [2]} | null}

``params.json``: ``{"format", "model", "model_class", "step", "rank", "world_size", "layout",
"params": [{"name", "key", "shape", "dtype", "stats", "grad_stats", "placements", "mesh"}]}``
(one entry per comparison key; ``grad_stats`` is null without a gradient).
"""

from __future__ import annotations

import json
import os
import re

import torch

FORMAT = "libai.align/1"
REPORT = "report.json"
TENSORS = "tensors.safetensors"
PARAMS = "params.json"
WEIGHTS = "weights.safetensors"
GRADS = "grads.safetensors"

_STEP_RE = re.compile(r"^step_(\d+)$")
_RANK_RE = re.compile(r"^rank_(\d+)$")


def step_dir(root: str, model: str, step: int, rank: int) -> str:
    """``<root>/<model>/step_<step>/rank_<rank>``."""
    return os.path.join(root, model, f"step_{step}", f"rank_{rank}")


def numbered_subdirs(path: str, kind: str) -> dict[int, str]:
    """``{k: path/<kind>_k}`` for ``kind`` in ``("step", "rank")``, sorted by ``k``."""
    pattern = _STEP_RE if kind == "step" else _RANK_RE
    found = {}
    for entry in os.listdir(path):
        m = pattern.match(entry)
        if m and os.path.isdir(os.path.join(path, entry)):
            found[int(m.group(1))] = os.path.join(path, entry)
    return dict(sorted(found.items()))


def tensor_stats(t: torch.Tensor) -> dict:
    """Summary numbers of a tensor (computed in float64; empty and integer tensors too)."""
    if t.numel() == 0:
        return {"numel": 0}
    x = t.detach().to("cpu", torch.float64)
    finite = torch.isfinite(x)
    stats = {
        "numel": t.numel(),
        "mean": x.mean().item(),
        "std": x.std().item() if t.numel() > 1 else 0.0,
        "min": x.min().item(),
        "max": x.max().item(),
        "abs_mean": x.abs().mean().item(),
        "norm": x.norm().item(),
    }
    if not bool(finite.all()):
        stats["nonfinite"] = int((~finite).sum())
    return stats


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, allow_nan=True)


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
