"""Export a libai model to ONNX graphs with dynamic batch / sequence axes, and verify them
with onnxruntime against PyTorch.

File layout for ``output = DIR/NAME.onnx``:

- decoder-only (GPT-2, Llama / Qwen2): ``NAME.onnx`` (``input_ids, attention_mask,
  position_ids -> logits``); with ``with_past`` it also returns ``present.{i}.key/value``
  and ``NAME_with_past.onnx`` takes ``past_key_values.{i}.key/value`` as well (the
  prompt goes through the first graph, every later step through the second).
- BERT / RoBERTa: ``NAME.onnx`` (``input_ids, attention_mask, token_type_ids`` -> the
  model's outputs).
- T5 / mT5: ``encoder_NAME.onnx``, ``decoder_NAME.onnx`` and, with ``with_past``,
  ``decoder_with_past_NAME.onnx`` (optimum's ``encoder_model.onnx`` / ``decoder_model.onnx``
  / ``decoder_with_past_model.onnx`` for ``NAME = model``).

Dynamic axes are named ``batch_size``, ``sequence_length``, ``past_sequence_length``,
``total_sequence_length`` (attention mask of a with-past graph: past + new tokens),
``encoder_sequence_length``; outputs carry expressions of those names.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from libai.layers import MultiheadAttention
from libai.models.utils.hf_export import model_libai_cfg
from libai.onnx_export.wrappers import (
    CausalLMGraph,
    EncoderGraph,
    T5DecoderGraph,
    T5DecoderWithPastGraph,
    T5EncoderGraph,
    model_family,
)

#: example sizes the graphs are traced with: all >= 2 (a size-1 axis would be frozen) and
#: pairwise different (equal sizes may be taken for the same symbol)
EXPORT_SIZES = {"batch": 2, "seq": 3, "past": 5, "enc": 7}
#: sizes used to verify: other than the export ones, including single-token decode steps
VERIFY_SIZES = (
    {"batch": 3, "seq": 6, "past": 4, "enc": 9},
    {"batch": 1, "seq": 1, "past": 8, "enc": 5},
)


@dataclass
class GraphSpec:
    """One ONNX file: the wrapper module, its input / output names, the named dynamic axes
    of each input, and ``make_inputs(sizes, generator)`` building inputs in ``input_names``
    order (``sizes``: ``batch``, ``seq``, ``past``, ``enc``)."""

    path: Path
    module: nn.Module
    input_names: list[str]
    output_names: list[str]
    axes: dict[str, dict[int, str]]
    make_inputs: Callable[[dict, torch.Generator], tuple] = field(repr=False)


def graph_paths(output: str | Path, family: str, with_past: bool) -> list[Path]:
    """The files written for ``output`` (see the module docstring)."""
    output = Path(output)
    if family == "t5":
        names = ["encoder", "decoder"] + (["decoder_with_past"] if with_past else [])
        return [output.with_name(f"{n}_{output.name}") for n in names]
    paths = [output]
    if family == "causal_lm" and with_past:
        paths.append(output.with_name(f"{output.stem}_with_past{output.suffix}"))
    return paths


# ---- random inputs --------------------------------------------------------------------------
def _ids(g, vocab, b, s):
    return torch.randint(0, vocab, (b, s), generator=g)


def _padded_mask(g, b, length, left: bool) -> torch.Tensor:
    """1/0 mask with random padding (up to length - 1 positions) on every other row."""
    mask = torch.ones(b, length, dtype=torch.long)
    for row in range(0, b, 2):
        pad = int(torch.randint(0, length, (1,), generator=g))
        if pad and left:
            mask[row, :pad] = 0
        elif pad:
            mask[row, length - pad :] = 0
    return mask


def _kv(g, b, heads, length, head_dim):
    return torch.randn(b, heads, length, head_dim, generator=g)


# ---- graph specs per family -----------------------------------------------------------------
def _cache_shape(model: nn.Module) -> tuple[int, int, int]:
    """``(num_layers, kv_heads, head_dim)`` of the self-attention caches in ``model``."""
    layers = [
        m for m in model.modules() if isinstance(m, MultiheadAttention) and not m.is_cross_attention
    ]
    return len(layers), layers[0].num_kv_heads, layers[0].head_size


def _vocab_size(model) -> int:
    return model_libai_cfg(model)["vocab_size"]


def _causal_lm_specs(model, paths, with_past) -> list[GraphSpec]:
    num_layers, kv_heads, head_dim = _cache_shape(model)
    vocab = _vocab_size(model)
    past_names = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]
    base_axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}}
    base_axes["position_ids"] = base_axes["input_ids"]

    def inputs(past: bool):
        def make(sz, g):
            b, s, p = sz["batch"], sz["seq"], sz["past"] if past else 0
            mask = _padded_mask(g, b, p + s, left=True)
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)[:, p:]
            kv = [_kv(g, b, kv_heads, p, head_dim) for _ in past_names] if past else []
            return (_ids(g, vocab, b, s), mask, position_ids, *kv)

        return make

    names = ["input_ids", "attention_mask", "position_ids"]
    specs = [
        GraphSpec(
            paths[0],
            CausalLMGraph(model, with_past=False, return_presents=with_past),
            names,
            ["logits", *(present_names if with_past else [])],
            {**base_axes, "attention_mask": {0: "batch_size", 1: "sequence_length"}},
            inputs(False),
        )
    ]
    if with_past:
        past_axes = {n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names}
        specs.append(
            GraphSpec(
                paths[1],
                CausalLMGraph(model, with_past=True, return_presents=True),
                names + past_names,
                ["logits", *present_names],
                {
                    **base_axes,
                    "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                    **past_axes,
                },
                inputs(True),
            )
        )
    return specs


def _encoder_specs(model, paths) -> list[GraphSpec]:
    vocab = _vocab_size(model)
    cfg = (model if hasattr(model, "libai_cfg") else model.backbone).libai_cfg
    types = cfg.get("num_tokentypes", 2)

    def make(sz, g):
        b, s = sz["batch"], sz["seq"]
        mask = _padded_mask(g, b, s, left=False)
        return _ids(g, vocab, b, s), mask, torch.randint(0, max(types, 1), (b, s), generator=g)

    names = ["input_ids", "attention_mask", "token_type_ids"]
    with torch.no_grad():
        out = model(*make(EXPORT_SIZES, torch.Generator().manual_seed(0)))
    output_names = [k for k, v in out.items() if isinstance(v, torch.Tensor)]
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names}
    return [GraphSpec(paths[0], EncoderGraph(model, output_names), names, output_names, axes, make)]


def _t5_specs(model, paths, with_past) -> list[GraphSpec]:
    num_layers, heads, head_dim = _cache_shape(model.t5_model.decoder)
    vocab = _vocab_size(model)
    hidden = model.t5_model.libai_cfg["hidden_size"]
    layer_names = [
        (f"{i}.decoder.key", f"{i}.decoder.value", f"{i}.encoder.key", f"{i}.encoder.value")
        for i in range(num_layers)
    ]
    present = [f"present.{n}" for names in layer_names for n in names]
    bs = {0: "batch_size", 1: "sequence_length"}
    enc_bs = {0: "batch_size", 1: "encoder_sequence_length"}

    def encoder_inputs(sz, g):
        b, e = sz["batch"], sz["enc"]
        return _ids(g, vocab, b, e), _padded_mask(g, b, e, left=False)

    def decoder_inputs(sz, g):
        b, s, e = sz["batch"], sz["seq"], sz["enc"]
        states = torch.randn(b, e, hidden, generator=g)
        return _ids(g, vocab, b, s), _padded_mask(g, b, e, left=False), states

    def with_past_inputs(sz, g):
        b, s, e, p = sz["batch"], sz["seq"], sz["enc"], sz["past"]
        kv = []
        for _ in range(num_layers):
            kv += [_kv(g, b, heads, n, head_dim) for n in (p, p, e, e)]
        return _ids(g, vocab, b, s), _padded_mask(g, b, e, left=False), *kv

    specs = [
        GraphSpec(
            paths[0],
            T5EncoderGraph(model),
            ["input_ids", "attention_mask"],
            ["last_hidden_state"],
            {"input_ids": enc_bs, "attention_mask": enc_bs},
            encoder_inputs,
        ),
        GraphSpec(
            paths[1],
            T5DecoderGraph(model, return_presents=with_past),
            ["input_ids", "encoder_attention_mask", "encoder_hidden_states"],
            ["logits", *(present if with_past else [])],
            {"input_ids": bs, "encoder_attention_mask": enc_bs, "encoder_hidden_states": enc_bs},
            decoder_inputs,
        ),
    ]
    if with_past:
        past_axes = {}
        for names in layer_names:
            for n in names:
                length = "past_sequence_length" if ".decoder." in n else "encoder_sequence_length"
                past_axes[f"past_key_values.{n}"] = {0: "batch_size", 2: length}
        specs.append(
            GraphSpec(
                paths[2],
                T5DecoderWithPastGraph(model),
                ["input_ids", "encoder_attention_mask", *past_axes],
                ["logits", *[f"present.{n}" for names in layer_names for n in names[:2]]],
                {"input_ids": bs, "encoder_attention_mask": enc_bs, **past_axes},
                with_past_inputs,
            )
        )
    return specs


def build_graph_specs(model: nn.Module, output: str | Path, with_past: bool) -> list[GraphSpec]:
    """The graphs to export for ``model`` (eval mode is set here). Raises
    :class:`~libai.onnx_export.wrappers.UnsupportedModelError` for other models."""
    family = model_family(model)
    model.eval()
    paths = graph_paths(output, family, with_past)
    if family == "causal_lm":
        specs = _causal_lm_specs(model, paths, with_past)
    elif family == "encoder":
        specs = _encoder_specs(model, paths)
    else:
        specs = _t5_specs(model, paths, with_past)
    for spec in specs:
        spec.module.eval()
    return specs


# ---- export ---------------------------------------------------------------------------------
def _rename_dims(path: Path, spec: GraphSpec) -> None:
    """Replace the exporter's symbols (``s12``) by the axis names of ``spec`` everywhere in
    the graph's inputs, outputs and value infos."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    mapping = {}
    for value in proto.graph.input:
        for axis, name in spec.axes.get(value.name, {}).items():
            dim = value.type.tensor_type.shape.dim[axis]
            if dim.dim_param:
                mapping[dim.dim_param] = name
    pattern = re.compile(r"\b[a-z]+\d+\b")

    def rename(values):
        for value in values:
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param:
                    dim.dim_param = pattern.sub(
                        lambda m: mapping.get(m.group(0), m.group(0)), dim.dim_param
                    )

    rename(proto.graph.input)
    rename(proto.graph.output)
    rename(proto.graph.value_info)
    onnx.save(proto, str(path))


def export_graph(spec: GraphSpec, opset: int | None = None) -> Path:
    """Trace ``spec`` with :data:`EXPORT_SIZES` and write its ONNX file."""
    from torch.export import Dim

    example = spec.make_inputs(EXPORT_SIZES, torch.Generator().manual_seed(0))
    per_input = [
        {axis: Dim.DYNAMIC for axis in spec.axes.get(name, {})} for name in spec.input_names
    ]
    # mirror the forward signature: the wrappers take the caches as one ``*past`` argument
    params = inspect.signature(spec.module.forward).parameters.values()
    named = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    extra = per_input[named:]
    dynamic = (*per_input[:named], tuple(extra)) if has_varargs and extra else tuple(per_input)
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {} if opset is None else {"opset_version": opset}
    with torch.no_grad():
        torch.onnx.export(
            spec.module,
            example,
            str(spec.path),
            input_names=spec.input_names,
            output_names=spec.output_names,
            dynamic_shapes=dynamic,
            dynamo=True,
            verbose=False,
            **kwargs,
        )
    _rename_dims(spec.path, spec)
    return spec.path


def export_onnx(
    model: nn.Module, output: str | Path, *, with_past: bool = False, opset: int | None = None
) -> list[GraphSpec]:
    """Export ``model`` (single process, fp32) to ONNX next to ``output`` (layout in the
    module docstring). Returns the exported :class:`GraphSpec` s, for :func:`verify_onnx`."""
    specs = build_graph_specs(model, output, with_past)
    for spec in specs:
        export_graph(spec, opset)
    return specs


# ---- verification ---------------------------------------------------------------------------
def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


class Check(NamedTuple):
    """Result of :func:`verify_graph`: the largest |onnxruntime - PyTorch| and the largest
    |PyTorch| output value (the scale the difference is judged against)."""

    max_abs_diff: float
    max_abs_value: float

    def ok(self, atol: float = 1e-4, rtol: float = 1e-4) -> bool:
        """``max_abs_diff <= atol + rtol * max_abs_value``."""
        return self.max_abs_diff <= atol + rtol * self.max_abs_value


def verify_graph(spec: GraphSpec, sizes=VERIFY_SIZES, seed: int = 1234) -> Check:
    """Run ``spec``'s file in onnxruntime and ``spec.module`` in PyTorch on fresh random inputs
    of each of ``sizes`` (other than the export sizes; padded masks) and compare every output."""
    session = _session(spec.path)
    names = [i.name for i in session.get_inputs()]
    g = torch.Generator().manual_seed(seed)
    worst = scale = 0.0
    for sz in sizes:
        inputs = spec.make_inputs(sz, g)
        with torch.no_grad():
            want = spec.module(*inputs)
        want = (want,) if isinstance(want, torch.Tensor) else want
        # the exporter drops inputs the graph does not read
        feed = {n: t.numpy() for n, t in zip(spec.input_names, inputs, strict=True) if n in names}
        got = session.run(spec.output_names, feed)
        for name, a, b in zip(spec.output_names, got, want, strict=True):
            if tuple(a.shape) != tuple(b.shape):
                raise AssertionError(
                    f"{spec.path.name}: {name} has shape {a.shape}, want {tuple(b.shape)}"
                )
            worst = max(worst, float((torch.from_numpy(a) - b).abs().max()))
            scale = max(scale, float(b.abs().max()))
    return Check(worst, scale)


def verify_onnx(specs: list[GraphSpec], sizes=VERIFY_SIZES) -> dict[str, Check]:
    """``{file name: Check}`` for every graph (see :func:`verify_graph`)."""
    return {spec.path.name: verify_graph(spec, sizes) for spec in specs}
