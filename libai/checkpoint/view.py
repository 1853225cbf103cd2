"""Layout-independent views of a model's and its optimizers' state dicts, for DCP.

The names and shapes a checkpoint stores do not depend on the layout it was saved on:

- **Tied copies** (the last pipeline stage's copy of the word embedding) are stored once,
  under the canonical name, and filled from it on load, optimizer state included.
- **Padded** parameters (vocab rounded up for tensor parallelism, ``libai_logical_shape``)
  are stored in their logical shape, as views that share storage so loads land in place.
- **Optimizer state** is keyed by parameter name; each param group's hyper-parameters are
  one serialized entry per parameter, so a key a newer torch adds is not a missing key.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from libai import dist
from libai.checkpoint.safe_load import loads_plain_data, torch_load_data

MODEL_KEY = "model"
_OPTIM_SECTIONS = ("state.", "param_groups.")


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))


def _logical_view(t: torch.Tensor, logical_shape, name: str) -> torch.Tensor:
    """``t`` (padded) seen in its logical shape, sharing storage (loads land in place).

    A DTensor becomes an unevenly sharded DTensor whose local tensor is a view of this
    rank's shard without its padding rows; DCP then records the logical global shape.
    """
    logical_shape = tuple(int(s) for s in logical_shape)
    if tuple(t.shape) == logical_shape:
        return t
    if not isinstance(t, DTensor):
        view = t
        for d, size in enumerate(logical_shape):
            view = view.narrow(d, 0, size)
        return view
    local = t.to_local()
    sizes, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    valid = [max(0, min(s, n - o)) for s, o, n in zip(sizes, offsets, logical_shape)]
    want_sizes, want_offsets = compute_local_shape_and_global_offset(
        logical_shape, t.device_mesh, t.placements
    )
    nonempty = all(v > 0 for v in valid)
    if list(want_sizes) != valid or (nonempty and list(want_offsets) != list(offsets)):
        raise NotImplementedError(
            f"{name}: padding of a {tuple(t.shape)} tensor with placements {t.placements} "
            f"does not map onto an even sharding of its logical shape {logical_shape}; "
            "checkpointing this layout is not supported."
        )
    view = local
    for d, size in enumerate(valid):
        if size != view.shape[d]:
            view = view.narrow(d, 0, size)
    return DTensor.from_local(
        view,
        t.device_mesh,
        t.placements,
        run_check=False,
        shape=torch.Size(logical_shape),
        stride=_contiguous_stride(logical_shape),
    )


def _split_optim_key(key: str, fqns) -> tuple[str, str, str]:
    """``"state.a.b.weight.exp_avg"`` -> ``("state.", "a.b.weight", "exp_avg")``.

    ``fqns`` are the parameter names; the state part may itself be nested (``"x.y"``).
    """
    for section in _OPTIM_SECTIONS:
        if key.startswith(section):
            rest = key[len(section) :]
            parts = rest.split(".")
            for i in range(len(parts) - 1, 0, -1):  # the longest parameter name first
                fqn = ".".join(parts[:i])
                if fqn in fqns:
                    return section, fqn, ".".join(parts[i:])
    raise KeyError(f"unexpected key in a flattened optimizer state dict: {key!r}")


def tied_weights(model: nn.Module) -> dict[str, str]:
    """``{copy name: canonical name}`` for the tied copies this rank holds.

    Collective (one ``all_gather_object``) unless the model declares
    ``checkpoint_tied_weights``: a rank on the last stage does not hold the embedding, so
    the members of each ``libai_tied_group`` are gathered from every rank first.
    """
    names = dict(model.named_parameters())
    declared = getattr(model, "checkpoint_tied_weights", None)
    if callable(declared):
        declared = declared()
    if declared is not None:
        return {copy: canon for copy, canon in dict(declared).items() if copy in names}
    local = []
    for order, (name, p) in enumerate(names.items()):
        group = getattr(p, "libai_tied_group", None)
        if group is not None:
            local.append((group, name, bool(getattr(p, "libai_tied_copy", False)), order))
    stage = dist.get_dist_util().pipeline_rank
    gathered = [(stage, local)]
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        gathered = [None] * torch_dist.get_world_size()
        torch_dist.all_gather_object(gathered, (stage, local))
    groups: dict[str, dict[str, tuple]] = {}
    for rank_stage, items in gathered:
        for group, name, is_copy, order in items:
            groups.setdefault(group, {})[name] = (is_copy, rank_stage, order)
    mapping = {}
    for members in groups.values():
        sources = [n for n, (is_copy, _, _) in members.items() if not is_copy]
        if len(sources) == 1:
            canon = sources[0]
        else:  # no (or several) unmarked members: the first stage's, first in its order
            canon = min(members, key=lambda n: (members[n][1], members[n][2], n))
        for name in members:
            if name != canon and name in names:
                mapping[name] = canon
    return mapping


def _group_bytes(group: dict) -> bytes:
    """A param group's hyper-parameters as a torch archive (loaded back weights-only)."""
    buffer = io.BytesIO()
    torch.save(group, buffer)
    return buffer.getvalue()


def _group_from_bytes(data: bytes) -> dict:
    """The inverse of :func:`_group_bytes`; also reads the plain pickles (builtin values
    only) that checkpoints of older libai versions stored. Never runs code."""
    if data[:2] == b"PK":  # a torch archive is a zip file
        return torch_load_data(io.BytesIO(data))
    return loads_plain_data(data)


class StateView:
    """This rank's flat checkpoint dict, and how loaded values map back to the state dicts.

    Keys: ``model.<fqn>``, ``<optimizer>.state.<fqn>.<name>`` (tensors) and
    ``<optimizer>.param_groups.<fqn>`` (the parameter's hyper-parameters, one serialized
    entry per parameter; a key a newer torch adds is then not a missing-key error).
    """

    def __init__(self):
        self.entries: dict[str, Any] = {}  # checkpoint key -> tensor (view) or object
        self.back: dict[str, list[tuple[dict, str, str | None]]] = {}  # -> (dict, key, sub)
        self.groups: dict[str, dict[str, Any]] = {}  # param_groups key -> {name: value}
        self.deferred: list[tuple[dict, str, str]] = []  # (dict, copy key, canonical key)

    def add(self, key: str, value, source: dict, source_key: str) -> None:
        self.entries[key] = value
        self.back[key] = [(source, source_key, None)]

    def add_group_value(self, key: str, sub: str, value, source: dict, source_key: str):
        self.groups.setdefault(key, {})[sub] = value
        self.entries[key] = None  # set by finalize()
        self.back.setdefault(key, []).append((source, source_key, sub))

    def finalize(self) -> StateView:
        for key, group in self.groups.items():
            self.entries[key] = _group_bytes(group)
        return self

    def write_back(self) -> None:
        """After ``dcp.load``: tensors were loaded in place; put the objects back."""
        for key, value in self.entries.items():
            if isinstance(value, torch.Tensor):
                continue
            if isinstance(value, bytes):
                value = _group_from_bytes(value)
            for source, source_key, sub in self.back[key]:
                if sub is None:
                    source[source_key] = value
                elif sub in value:  # a hyper-parameter the checkpoint lacks keeps its value
                    source[source_key] = value[sub]
        with torch.no_grad():
            for source, copy_key, canon_key in self.deferred:
                if isinstance(source[copy_key], torch.Tensor):
                    source[copy_key].copy_(source[canon_key])
                else:
                    source[copy_key] = source[canon_key]


def build_view(
    model: nn.Module,
    model_sd: dict,
    optim_sds: Mapping[str, dict],
    tied: Mapping[str, str],
    *,
    for_load: bool,
) -> StateView:
    params = dict(model.named_parameters())
    logical = {
        name: (tuple(p.shape), p.libai_logical_shape)
        for name, p in params.items()
        if getattr(p, "libai_logical_shape", None) is not None
    }
    view = StateView()

    def convert(fqn: str, value):
        if isinstance(value, torch.Tensor) and fqn in logical:
            padded, shape = logical[fqn]
            if tuple(value.shape) == padded:
                return _logical_view(value, shape, fqn)
        return value

    def target(fqn: str, source: dict, key: str, prefix: str = "") -> str | None:
        """The name ``fqn``'s entry has in the checkpoint (None: not read/written here);
        ``key`` is ``prefix + fqn + rest``."""
        if fqn not in tied:
            return fqn
        canon = tied[fqn]
        if not for_load:
            return None  # saved once, under the canonical name
        if canon in params:  # both on this rank: copied after loading the canonical one
            rest = key[len(prefix) + len(fqn) :]
            view.deferred.append((source, key, prefix + canon + rest))
            return None
        return canon

    for key, value in model_sd.items():
        name = target(key, model_sd, key)
        if name is not None:
            view.add(f"{MODEL_KEY}.{name}", convert(key, value), model_sd, key)
    for opt_name, osd in optim_sds.items():
        for key, value in osd.items():
            section, fqn, sub = _split_optim_key(key, params)
            name = target(fqn, osd, key, section)
            if name is None:
                continue
            if section == "state.":
                view.add(f"{opt_name}.state.{name}.{sub}", convert(fqn, value), osd, key)
            else:
                view.add_group_value(f"{opt_name}.param_groups.{name}", sub, value, osd, key)
    return view.finalize()
