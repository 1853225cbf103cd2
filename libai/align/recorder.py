"""``create_model``: record every module call of a model through hooks (PaDiff's recorder).

::

    recorder = create_model(model, name="libai_gpt2")
    out = recorder(input_ids)                # model.forward, recorded
    recorder.backward(loss_fn(out))          # gradients recorded too
    recorder.try_dump("dump/")               # dump/libai_gpt2/step_0/rank_<r>/..., clears
    check_report("dump/hf_gpt2", "dump/libai_gpt2")

For each call of each recorded module the recorder keeps the forward outputs (nested outputs
flattened) and the gradients with respect to the module's differentiable inputs: the
gradient the module itself sends back, taken by an identity autograd tap on each input. The
model's code is not edited and ``recorder.model`` is the original module; :meth:`close`
removes every hook. Dumps are laid out as :mod:`libai.align.dump_format` describes.

What is recorded is chosen by black and white lists of modules or module classes, each with
a ``mode``: ``"self"`` (the module), ``"sublayers"`` (its descendants) or ``"all"`` (both).
With a white list only what it covers is recorded, even if black-listed (white wins).
Modules of the layer map (:meth:`set_layer_map`, :meth:`auto_layer_map`) are recorded but
their insides are not, for modules whose implementations differ between the two models;
the checkers pair unmatched layer-map modules in call order.

Tensor parallelism: tensors are recorded as this rank holds them and gathered to full size
when dumped (:mod:`libai.align.layouts`), so dumping is collective over each tp group.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import torch.distributed as torch_dist
from safetensors.torch import save_file
from torch import nn

from libai.align import dump_format as fmt
from libai.align import layouts
from libai.align.hooks import (
    GradTap,
    Inject,
    any_meta,
    flatten_tensors,
    in_pipeline_metadata_inference,
    is_differentiable,
    map_tensors,
)
from libai.align.name_map import apply_rename, loader_module_keys, loader_rules, validate_rename
from libai.align.params import param_entries

MODES = ("self", "sublayers", "all")


class _Call:
    """One recorded call of a module."""

    __slots__ = (
        "id",
        "route",
        "key",
        "call",
        "type",
        "parent",
        "mapped",
        "outputs",
        "grads",
        "bwd_order",
        "inputs",
        "out_grads",
    )

    def __init__(self, id, route, key, call, type_name, parent, mapped):
        self.id, self.route, self.key, self.call = id, route, key, call
        self.type, self.parent, self.mapped = type_name, parent, mapped
        self.outputs: list[tuple[torch.Tensor, layouts.Layout | None]] = []
        self.grads: dict[int, tuple[torch.Tensor, layouts.Layout | None]] = {}
        self.bwd_order: int | None = None
        self.inputs: list[torch.Tensor] = []  # kept for single_step only
        self.out_grads: dict[int, torch.Tensor] = {}  # kept for single_step only


def _matches(module: nn.Module, target) -> bool:
    if isinstance(target, type):
        return isinstance(module, target)
    return module is target


def _check_targets(items, what: str) -> list:
    items = list(items) if isinstance(items, (list, tuple, set)) else [items]
    for item in items:
        if not (
            isinstance(item, nn.Module) or (isinstance(item, type) and issubclass(item, nn.Module))
        ):
            raise TypeError(f"{what} takes nn.Module instances or classes, got {item!r}")
    return items


def _is_ancestor(parent: str, route: str) -> bool:
    return parent == "" or route.startswith(parent + ".")


class ModelRecorder:
    """A model with hooks that record its module calls; see the module docstring.

    Calling the recorder calls the model. It is not an ``nn.Module`` itself, so the model's
    parameters are not registered twice.
    """

    def __init__(
        self,
        model: nn.Module,
        name: str | None = None,
        dump_freq: int = 1,
        rename=None,
        dump_root: str = "align_dump",
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"create_model needs a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(dump_freq, int) or dump_freq < 1:
            raise ValueError(f"dump_freq must be a positive integer, got {dump_freq!r}")
        self.model, self.name = model, name or type(model).__name__
        if os.sep in self.name or self.name in ("", ".", ".."):
            raise ValueError(f"name {self.name!r} must be a plain directory name")
        self.dump_freq, self.dump_root, self.step = dump_freq, dump_root, 0
        self.role: str | None = None
        self._user_rename = validate_rename(rename)
        self._rules = None if self._user_rename else loader_rules(model)
        self._module_keys = loader_module_keys(model, self._rules) if self._rules else {}
        self._modules = dict(model.named_modules())
        self._black: list[tuple[object, str]] = []
        self._white: list[tuple[object, str]] = []
        self._layer_map: list[object] = []
        self._decisions: dict[str, bool] = {}
        self.recording = True
        self._keep_io = False  # single_step reference: keep inputs and output gradients
        self._feed: ModelRecorder | None = None  # single_step: take inputs/grads from this
        self._handles = []
        for route, module in self._modules.items():
            self._handles.append(
                module.register_forward_pre_hook(
                    functools.partial(self._pre_hook, route), with_kwargs=True
                )
            )
            self._handles.append(
                module.register_forward_hook(
                    functools.partial(self._post_hook, route), with_kwargs=True, always_call=True
                )
            )
        self._vocab_size = layouts.model_vocab_size(model)
        self.clear_report()

    # ---- running --------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward(**kwargs)``; the input gradients of every module are recorded."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward needs the loss tensor, got {type(loss).__name__}")
        loss.backward(**kwargs)

    def close(self) -> None:
        """Remove every hook: ``recorder.model`` runs exactly as before."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def paused(self):
        """Run the model without recording."""
        before, self.recording = self.recording, False
        try:
            yield
        finally:
            self.recording = before

    # ---- what is recorded -----------------------------------------------------------------
    def update_black_list(self, layers, mode: str = "all") -> None:
        """Do not record ``layers`` (modules or classes): ``mode`` self / sublayers / all."""
        self._black += [(t, self._mode(mode)) for t in _check_targets(layers, "black list")]
        self._decisions.clear()

    def update_white_list(self, layers, mode: str = "all") -> None:
        """Record only what white lists cover (``mode`` as for the black list); white wins."""
        self._white += [(t, self._mode(mode)) for t in _check_targets(layers, "white list")]
        self._decisions.clear()

    def set_layer_map(self, layers) -> None:
        """Compare ``layers`` (modules or classes) at their boundary only: they are recorded,
        their insides are not, and unmatched ones pair with the other model's in call order."""
        self._layer_map = _check_targets(layers, "set_layer_map")
        self._decisions.clear()

    def auto_layer_map(self, side: str) -> list[str]:
        """Put the attention modules in the layer map (the part libai fuses differently from
        transformers: one grouped q/k/v projection); ``side`` is this model's role,
        ``"base"`` or ``"raw"``. Returns the routes mapped."""
        if side not in ("base", "raw"):
            raise ValueError(f"auto_layer_map side must be 'base' or 'raw', got {side!r}")
        from libai.layers import MultiheadAttention

        self.role = side
        picked = [
            (route, m)
            for route, m in self._modules.items()
            if isinstance(m, MultiheadAttention)
            or (
                type(m).__module__.startswith("transformers.")
                and type(m).__name__.endswith("Attention")
            )
        ]
        self.set_layer_map([m for _, m in picked])
        return [route for route, _ in picked]

    @staticmethod
    def _mode(mode: str) -> str:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        return mode

    def _covered(self, entries, module, ancestors) -> bool:
        return any(
            (_matches(module, t) and mode != "sublayers")
            or (mode != "self" and any(_matches(a, t) for a in ancestors))
            for t, mode in entries
        )

    def _recorded(self, route: str) -> bool:
        decision = self._decisions.get(route)
        if decision is None:
            module = self._modules[route]
            ancestors = [
                m for r, m in self._modules.items() if r != route and _is_ancestor(r, route)
            ]
            if any(_matches(a, t) for a in ancestors for t in self._layer_map):
                decision = False
            elif self._white:
                decision = self._covered(self._white, module, ancestors)
            else:
                decision = not self._covered(self._black, module, ancestors)
            self._decisions[route] = decision
        return decision

    def _mapped(self, route: str) -> bool:
        return any(_matches(self._modules[route], t) for t in self._layer_map)

    def key_of(self, route: str) -> str:
        """The comparison key of a module route (see :mod:`libai.align.name_map`)."""
        if self._user_rename:
            return apply_rename(route, self._user_rename)
        if not self._module_keys:
            return route
        # a module without a Hugging Face counterpart keeps a key no counterpart can have
        return self._module_keys.get(route, f"unmapped:{route}")

    @property
    def renamed(self) -> bool:
        """Whether keys come from rename rules (so unmatched modules are expected)."""
        return bool(self._user_rename or self._module_keys)

    # ---- hooks ----------------------------------------------------------------------------
    def _pre_hook(self, route, module, args, kwargs):
        if not self._stack:  # an outermost call: is it a pipeline's shape inference?
            self._skipping = in_pipeline_metadata_inference()
        if (
            self._skipping
            or not (self.recording and route in self._modules and self._recorded(route))
            or any_meta((args, kwargs))
        ):
            self._stack.append(None)
            return None
        key = self.key_of(route)
        count = self._counts.get(key, 0)
        self._counts[key] = count + 1
        parent = next(
            (c.id for c in reversed(self._stack) if c is not None and _is_ancestor(c.route, route)),
            None,
        )
        call = _Call(
            len(self._calls), route, key, count, type(module).__name__, parent, self._mapped(route)
        )
        self._calls.append(call)
        self._stack.append(call)
        base = self._feed._live.get((key, count)) if self._feed is not None else None
        in_layouts = (
            layouts.input_layouts(module, self._vocab_size) if layouts.tp_size() > 1 else {}
        )
        index = 0

        def tap(t: torch.Tensor) -> torch.Tensor:
            nonlocal index
            if not is_differentiable(t):
                return t
            j, index = index, index + 1
            if base is not None and j < len(base.inputs) and base.inputs[j].shape == t.shape:
                t = Inject.apply(t, base.inputs[j])
            if self._keep_io:
                call.inputs.append(t.detach().clone())
            layout = in_layouts.get(j) or self._sharded.get(id(t), (None, None))[1]
            return GradTap.apply(t, functools.partial(self._grad_sink, call, j, layout))

        new_args, new_kwargs = map_tensors((args, kwargs), tap)
        if self._keep_io:
            self._live[(key, count)] = call
        return new_args, new_kwargs

    def _grad_sink(self, call: _Call, index: int, layout, grad: torch.Tensor) -> None:
        call.grads[index] = (grad.detach().clone(), layout)
        if call.bwd_order is None:
            call.bwd_order = self._bwd_counter
            self._bwd_counter += 1

    def _post_hook(self, route, module, args, kwargs, output):
        call = self._stack.pop() if self._stack else None
        if call is None or output is None:
            return None
        sharded = layouts.output_layouts(module) if layouts.tp_size() > 1 else {}
        base = self._feed._live.get((call.key, call.call)) if self._feed is not None else None
        for j, t in enumerate(flatten_tensors(output)):
            layout = sharded.get(j) or self._sharded.get(id(t), (None, None))[1]
            if layout is not None:
                self._sharded[id(t)] = (t, layout)  # a container returning it keeps the layout
            call.outputs.append((t.detach().clone(), layout))
            if not is_differentiable(t):
                continue
            if self._keep_io:
                t.register_hook(functools.partial(self._keep_out_grad, call, j))
            if base is not None and j in base.out_grads and base.out_grads[j].shape == t.shape:
                t.register_hook(functools.partial(_replace_grad, base.out_grads[j]))
        return None

    @staticmethod
    def _keep_out_grad(call: _Call, index: int, grad: torch.Tensor) -> None:
        call.out_grads[index] = grad.detach().clone()

    # ---- dumping --------------------------------------------------------------------------
    def set_dump_root_path(self, path: str) -> None:
        """Where dumps go when a dump call gets no path."""
        self.dump_root = str(path)

    def clear_report(self) -> None:
        """Forget the calls recorded so far (the step counter stays)."""
        self._calls: list[_Call] = []
        self._stack: list[_Call | None] = []
        self._counts: dict[str, int] = {}
        self._sharded: dict[int, tuple[torch.Tensor, layouts.Layout]] = {}
        self._live: dict[tuple[str, int], _Call] = {}
        self._bwd_counter = 0
        self._skipping = False

    def try_dump(self, path: str | None = None) -> bool:
        """End a step: every ``dump_freq`` steps dump the report and the parameters (values and
        gradients); always clear the report. Returns whether it dumped. Collective."""
        dumped = self.step % self.dump_freq == 0
        if dumped:
            self.dump_report(path)
            self.dump_params(path)
        self.clear_report()
        self.step += 1
        return dumped

    def _dir(self, path: str | None) -> str:
        d = fmt.step_dir(path or self.dump_root, self.name, self.step, _rank())
        os.makedirs(d, exist_ok=True)
        return d

    def _header(self) -> dict:
        return {
            "format": fmt.FORMAT,
            "model": self.name,
            "model_class": type(self.model).__name__,
            "role": self.role,
            "rename": self.renamed,
            "step": self.step,
            "rank": _rank(),
            "world_size": _world_size(),
            "layout": _layout(),
        }

    def dump_report(self, path: str | None = None) -> str:
        """Write this step's call tree and tensors; returns the directory. Collective over
        tp groups (sharded tensors are gathered)."""
        d = self._dir(path)
        tensors: dict[str, torch.Tensor] = {}
        nodes = []
        for c in self._calls:
            outputs = [
                _tensor_entry(f"fwd.{c.id}.{j}", t, layout, tensors)
                for j, (t, layout) in enumerate(c.outputs)
            ]
            grads = [
                {**_tensor_entry(f"bwd.{c.id}.{j}", *c.grads[j], tensors), "index": j}
                for j in sorted(c.grads)
            ]
            nodes.append(
                {
                    "id": c.id,
                    "route": c.route,
                    "key": c.key,
                    "call": c.call,
                    "type": c.type,
                    "parent": c.parent,
                    "mapped": c.mapped,
                    "bwd_order": c.bwd_order,
                    "outputs": outputs,
                    "grads": grads,
                }
            )
        save_file(tensors, os.path.join(d, fmt.TENSORS))
        fmt.write_json(os.path.join(d, fmt.REPORT), {**self._header(), "nodes": nodes})
        return d

    def dump_params(self, path: str | None = None) -> str:
        """Write parameter values and gradients (``params.json``, weights and grads
        safetensors). Collective over each stage's mesh."""
        return self._dump_params(path, weights=True, grads=True)

    def dump_weights(self, path: str | None = None) -> str:
        """Write parameter values only (``params.json`` and ``weights.safetensors``)."""
        return self._dump_params(path, weights=True, grads=False)

    def dump_grads(self, path: str | None = None) -> str:
        """Write parameter gradients only (``params.json`` and ``grads.safetensors``)."""
        return self._dump_params(path, weights=False, grads=True)

    def _dump_params(self, path, *, weights: bool, grads: bool) -> str:
        d = self._dir(path)
        entries = param_entries(self.model, self._rules, self._user_rename)
        if weights:
            save_file({e.key: e.value for e in entries}, os.path.join(d, fmt.WEIGHTS))
        if grads:
            values = {e.key: e.grad for e in entries if e.grad is not None}
            save_file(values, os.path.join(d, fmt.GRADS))
        params = [e.describe() for e in entries]
        fmt.write_json(os.path.join(d, fmt.PARAMS), {**self._header(), "params": params})
        return d


def _replace_grad(value: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return value.to(dtype=grad.dtype, device=grad.device)


def _tensor_entry(name: str, t: torch.Tensor, layout, store: dict) -> dict:
    placements, mesh = layouts.describe(t, layout)
    full = layouts.gather(t, layout).detach().to("cpu").contiguous()
    store[name] = full.clone()
    return {
        "tensor": name,
        "shape": list(full.shape),
        "dtype": fmt.dtype_name(full.dtype),
        "stats": fmt.tensor_stats(full),
        "placements": placements,
        "mesh": mesh,
    }


def _rank() -> int:
    return torch_dist.get_rank() if torch_dist.is_initialized() else 0


def _world_size() -> int:
    return torch_dist.get_world_size() if torch_dist.is_initialized() else 1


def _layout() -> dict | None:
    from libai import dist

    util = dist.current_dist_util()
    if util is None:
        return None
    lay = util.layout
    return {
        "dp": lay.data_parallel_size,
        "tp": lay.tensor_parallel_size,
        "pp": lay.pipeline_parallel_size,
        "dp_rank": util.data_parallel_rank,
        "tp_rank": util.tensor_parallel_rank,
        "pp_rank": util.pipeline_rank,
    }


def create_model(model: nn.Module, name: str | None = None, dump_freq: int = 1, **kwargs):
    """A :class:`ModelRecorder` around ``model`` (any ``torch.nn.Module``).

    Args:
        name: the model's directory name in dumps (default: its class name).
        dump_freq: :meth:`ModelRecorder.try_dump` dumps every ``dump_freq`` steps.
        rename: ``[(regex, replacement), ...]`` applied to module routes and parameter names
            to get the comparison keys (default: a libai model with a Hugging Face loader is
            keyed by the Hugging Face names, anything else by its own names).
        dump_root: the default dump directory.
    """
    return ModelRecorder(model, name, dump_freq, **kwargs)
