"""Hand-written align dumps for the weight and gradient checks (tests/unit/align)."""

from __future__ import annotations

import os

from safetensors.torch import save_file

from libai.align.dump_format import (
    FORMAT,
    GRADS,
    PARAMS,
    WEIGHTS,
    dtype_name,
    tensor_stats,
    write_json,
)


def write_params(path, params, *, rename=False, weights=True, grads=True):
    """Write params.json (+ weights/grads safetensors): ``params`` maps key -> (name, w, g)."""
    os.makedirs(path, exist_ok=True)
    entries = [
        {
            "name": name,
            "key": key,
            "shape": list(w.shape),
            "dtype": dtype_name(w.dtype),
            "stats": tensor_stats(w),
            "grad_stats": None if g is None else tensor_stats(g),
            "placements": None,
            "mesh": None,
        }
        for key, (name, w, g) in params.items()
    ]
    meta = {"format": FORMAT, "model": "tiny", "model_class": "Tiny", "step": 0, "rank": 0}
    meta.update({"world_size": 1, "layout": {}, "params": entries})
    if rename:
        meta["rename"] = True
        meta["model_class"] = rename if isinstance(rename, str) else "Tiny"
    write_json(os.path.join(path, PARAMS), meta)
    if weights:
        save_file({k: w for k, (_, w, _) in params.items()}, os.path.join(path, WEIGHTS))
    if grads:
        grad_map = {k: g for k, (_, _, g) in params.items() if g is not None}
        save_file(grad_map, os.path.join(path, GRADS))
