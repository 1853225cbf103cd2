"""ONNX export of GPT-2, BERT / RoBERTa, T5 / mT5 and Llama / Qwen2, verification with
onnxruntime, and an onnxruntime-backed generation stepper.

Command line: ``python tools/export_onnx.py --model-path DIR --output model.onnx
[--config-file CFG] [--with-past] [--opset N]``. In Python::

    from libai.onnx_export import export_onnx, load_model, verify_onnx

    model = load_model("hf_dir")                    # or load_model(ckpt, "config.py")
    specs = export_onnx(model, "out/model.onnx", with_past=True)
    print(verify_onnx(specs))     # {file name: Check(max_abs_diff, max_abs_value)}

The file layout is described in :mod:`libai.onnx_export.export`.
"""

from libai.onnx_export.export import (
    Check,
    GraphSpec,
    build_graph_specs,
    export_graph,
    export_onnx,
    graph_paths,
    verify_graph,
    verify_onnx,
)
from libai.onnx_export.loading import load_checkpoint_model, load_hf_model, load_model
from libai.onnx_export.wrappers import (
    SUPPORTED_MODEL_TYPES,
    UnsupportedModelError,
    model_family,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "Check",
    "GraphSpec",
    "OrtStepper",
    "UnsupportedModelError",
    "build_graph_specs",
    "export_graph",
    "export_onnx",
    "graph_paths",
    "load_checkpoint_model",
    "load_hf_model",
    "load_model",
    "model_family",
    "verify_graph",
    "verify_onnx",
]


def __getattr__(name):
    if name == "OrtStepper":  # imports onnxruntime only when used
        from libai.onnx_export.ort_generation import OrtStepper

        return OrtStepper
    raise AttributeError(name)
