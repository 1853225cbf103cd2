"""Export a task module's model to ONNX (``Engine.export``) and run the exported graph
(``Engine.inference`` with ``Inference.model_dir``), through :mod:`libai.onnx_export`.

Zoo models (GPT-2, BERT / RoBERTa, T5, Llama / Qwen2) use the exporter's own graph specs
(dynamic batch and sequence, KV-cache graphs). Any other model is exported from the
module's ``input_spec()``: one graph, ``model.forward`` on the inputs in that order, every
``None`` axis dynamic.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from libai import dist
from libai.fleetx.module import BasicModule, InputSpec

logger = logging.getLogger(__name__)

__all__ = ["OnnxPredictor", "export_module", "find_onnx", "input_spec_graph"]

#: example-size key of each dynamic axis position (the exporter's size dictionaries)
_AXIS_SIZE_KEYS = ("batch", "seq", "enc", "past")


def input_spec_graph(model: nn.Module, specs: list[InputSpec], path: Path):
    """A :class:`~libai.onnx_export.GraphSpec` for ``model.forward(*inputs)``."""
    from libai.onnx_export import GraphSpec

    if not specs:
        raise ValueError("input_spec() returned no inputs")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"input_spec() names must be distinct, got {names}")
    axes = {
        s.name: {
            i: "batch_size" if i == 0 else f"{s.name}_dim{i}"
            for i, size in enumerate(s.shape)
            if size is None
        }
        for s in specs
    }

    def make_inputs(sizes: dict, g: torch.Generator) -> tuple:
        inputs = []
        for s in specs:
            shape = [
                sizes[_AXIS_SIZE_KEYS[min(i, len(_AXIS_SIZE_KEYS) - 1)]] if d is None else int(d)
                for i, d in enumerate(s.shape)
            ]
            dtype = s.torch_dtype
            if dtype.is_floating_point:
                inputs.append(torch.randn(shape, generator=g).to(dtype))
            elif dtype == torch.bool:
                inputs.append(torch.randint(0, 2, shape, generator=g).bool())
            else:
                inputs.append(torch.randint(0, max(int(s.high), 1), shape, generator=g).to(dtype))
        return tuple(inputs)

    class _Outputs(nn.Module):  # one tensor or a tuple of tensors, as ONNX wants
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *xs):
            out = self.inner(*xs)
            if isinstance(out, Mapping):
                return tuple(out.values())
            return out

    wrapper = _Outputs(model).eval()
    with torch.no_grad():
        probe = wrapper(
            *make_inputs({"batch": 2, "seq": 3, "enc": 5, "past": 7}, torch.Generator())
        )
    n_out = 1 if isinstance(probe, torch.Tensor) else len(probe)
    output_names = ["output"] if n_out == 1 else [f"output_{i}" for i in range(n_out)]
    return GraphSpec(path, wrapper, names, output_names, axes, make_inputs)


def export_module(module: BasicModule, model: nn.Module, output_dir: str) -> dict:
    """Export ``model`` (``module.model``, fp32, one process) into ``output_dir`` and verify
    every graph in onnxruntime on fresh shapes; returns ``{file name: Check}``."""
    from libai.onnx_export import UnsupportedModelError, export_graph, export_onnx, verify_onnx

    if dist.get_world_size() > 1:
        raise RuntimeError(
            "Engine.export runs on one process: launch tools/export.py without torchrun and "
            "load the checkpoint there (checkpoints reshard to any layout)"
        )
    output = Path(output_dir) / "model.onnx"
    model.eval()
    try:
        specs = export_onnx(
            model, output, with_past=bool(getattr(module, "export_with_past", False))
        )
        logger.info("Exported the zoo model's graphs to %s", output_dir)
    except UnsupportedModelError:
        spec = input_spec_graph(model, list(module.input_spec()), output)
        export_graph(spec)
        specs = [spec]
        logger.info("Exported %s from input_spec() to %s", type(model).__name__, output)
    checks = verify_onnx(specs)
    for name, check in checks.items():
        logger.info("onnxruntime vs PyTorch, %s: max |diff| %.3g", name, check.max_abs_diff)
        if not check.ok():
            raise RuntimeError(f"{name}: onnxruntime differs from PyTorch by {check.max_abs_diff}")
    return checks


def find_onnx(model_dir: str, name: str = "model.onnx") -> str:
    """The exported graph under ``model_dir``: FleetX's layout ``rank_<rank>/model.onnx``
    (``rank_0`` when this rank has none), else ``model.onnx`` or the only ``*.onnx`` there."""
    rank = dist.get_rank() if dist.get_world_size() > 1 else 0
    for sub in (f"rank_{rank}", "rank_0", ""):
        path = os.path.join(model_dir, sub, name)
        if os.path.isfile(path):
            return path
    found = sorted(glob.glob(os.path.join(model_dir, "*.onnx")))
    if len(found) == 1:
        return found[0]
    raise FileNotFoundError(
        f"Inference.model_dir={model_dir} holds no rank_0/{name} nor {name} (found "
        f"{[os.path.basename(f) for f in found]}); run tools/export.py first (it writes "
        "Engine.save_load.output_dir/rank_0/)"
    )


def _default_inputs(names, feed: dict) -> None:
    """Fill what a causal-LM graph takes besides ``input_ids`` when a batch lacks it: an
    all-ones ``attention_mask`` and the positions it implies."""
    ids = feed.get("input_ids")
    if ids is None:
        return
    if "attention_mask" in names and "attention_mask" not in feed:
        feed["attention_mask"] = torch.ones_like(torch.as_tensor(ids))
    if "position_ids" in names and "position_ids" not in feed:
        mask = torch.as_tensor(feed["attention_mask"]) if "attention_mask" in feed else None
        if mask is None:
            mask = torch.ones_like(torch.as_tensor(ids))
        feed["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)


class OnnxPredictor:
    """Run the ONNX graph in ``model_dir`` (:func:`find_onnx`) in onnxruntime:
    ``predictor(data)`` with ``data`` a mapping by input name (keys the graph does not take,
    such as ``labels``, are ignored; a missing ``attention_mask`` / ``position_ids`` of a
    causal LM is all ones / its positions), a list / tuple in input order, or one tensor;
    returns ``{output name: numpy array}``."""

    def __init__(self, model_dir: str):
        import onnxruntime as ort

        self.path = find_onnx(model_dir)
        self.session = ort.InferenceSession(self.path, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, data) -> dict:
        def array(value):
            return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value

        if isinstance(data, Mapping):
            data = dict(data)
            _default_inputs(self.input_names, data)
            missing = [n for n in self.input_names if n not in data]
            if missing:
                raise KeyError(f"{self.path} needs inputs {missing}; got {sorted(data)}")
            feed = {n: array(data[n]) for n in self.input_names}
        else:
            values = list(data) if isinstance(data, (list, tuple)) else [data]
            feed = {n: array(v) for n, v in zip(self.input_names, values)}
        return dict(zip(self.output_names, self.session.run(self.output_names, feed)))
