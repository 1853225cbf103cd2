"""Run inference on Data.Test batches: the exported ONNX graph (Inference.model_dir) in
onnxruntime, or the eager model with a checkpoint (Engine.save_load.ckpt_dir).

python tools/inference.py -c CONFIG.yaml -o Inference.model_dir=output/export
"""

from __future__ import annotations

import json

import numpy as np
import torch

from libai import dist
from libai.dist.cli import run_cli
from libai.fleetx.yaml_setup import engine_from_command_line


def _summary(outputs) -> dict:
    """Shapes and a few values of each output, for the log line."""
    items = (
        outputs.items()
        if isinstance(outputs, dict)
        else enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs])
    )
    out = {}
    for name, value in items:
        array = value.detach().float().cpu().numpy() if isinstance(value, torch.Tensor) else value
        if isinstance(array, np.ndarray):
            out[str(name)] = {"shape": list(array.shape), "first": array.ravel()[:4].tolist()}
        else:
            out[str(name)] = value
    return out


def main() -> int:
    engine = engine_from_command_line("inference", __doc__.splitlines()[0])
    cfg = engine.cfg
    if cfg.Engine.save_load.ckpt_dir and not cfg.Inference.model_dir:
        engine.load()
    if engine.test_loader is None:
        raise ValueError("tools/inference.py reads the batches of a Data.Test section")
    limit = cfg.Engine.test_iters or None
    for i, batch in enumerate(engine.test_loader):
        if limit and i >= limit:
            break
        outputs = engine.inference(batch)
        if dist.is_main_process():
            print(json.dumps({"batch": i, "outputs": _summary(outputs)}), flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)
