"""OneFlow's API for LiBai project code (``projects/*``), mapped onto torch.

LiBai's projects write ``import oneflow as flow``, ``from oneflow import nn``, ``from
oneflow.utils.data import Dataset``, ``flow.tensor(x, dtype=flow.long)``,
``loss.to_global(sbp=dist.get_nd_sbp([flow.sbp.partial_sum, flow.sbp.broadcast]))``. When a
LiBai door loads a project module (a module named ``projects.*``, imported by a LiBai config
file), ``import oneflow`` inside it gives the module built here (:func:`project_module`);
nothing else sees it (a real ``oneflow`` install is never shadowed, and ``sys.modules`` gets
no ``oneflow``). The names resolve by these rules, first match wins (the table is in
docs/libai_configs.md):

1. :data:`TOP_LEVEL`: OneFlow's own names -- ``sbp``, ``placement``, ``env``, ``save`` /
   ``load`` (data only: ``load`` never unpickles code), ``to_global``, ``_C``
   (:data:`~libai.oneflow_api.fused.FUSED_OPS`) -- and the creation functions that take
   ``sbp=`` / ``placement=`` (:mod:`libai.oneflow_api.global_tensors`);
2. :data:`SUBMODULES`: ``nn``, ``nn.functional``, ``nn.init``, ``optim`` (LiBai's optimizer
   names first: ``libai.optim.oneflow_optim``), ``optim.lr_scheduler``, ``utils.data``,
   ``linalg``, ``cuda``, ``distributions``, ``autograd``;
3. otherwise ``oneflow.X`` is ``torch.X`` (``flow.cat``, ``flow.long``, ``flow.no_grad``:
   OneFlow's eager API mirrors PyTorch's by design) when torch has ``X``.

A name none of these has is an ``AttributeError`` / ``ImportError`` in one line naming it
and the project file and line that used it. The Tensor attributes OneFlow adds
(``to_global``, ``to_local``, ``sbp``, ``placement``) are given to ``torch.Tensor`` the first
time project code imports ``oneflow``.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

import torch

from libai import dist
from libai.oneflow_api.fused import FUSED_OPS
from libai.oneflow_api.global_tensors import (
    CREATION_FUNCTIONS,
    Placement,
    creation,
    install_tensor_methods,
    to_global,
)
from libai.utils.errors import OneLineError

__all__ = [
    "SUBMODULES",
    "TOP_LEVEL",
    "UnmappedOneFlowImport",
    "UnmappedOneFlowName",
    "project_module",
]


class UnmappedOneFlowName(AttributeError, OneLineError):
    """A OneFlow name used by project code that has no torch mapping here."""


class UnmappedOneFlowImport(ImportError, OneLineError):
    """``from oneflow... import X`` in project code, ``X`` without a torch mapping here."""


def _save(obj, path, **kwargs):
    """``flow.save``: ``torch.save`` (tensors, containers, plain Python data)."""
    torch.save(obj, path, **kwargs)


def _load(path, map_location=None, **_unused):
    """``flow.load``: ``torch.load(weights_only=True)``: tensors and plain data only; a file
    that holds other objects (which unpickling would construct by running code) is refused
    in one line."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch's UnpicklingError names the global it refused
        if "weights_only" not in str(e) and "Unsupported global" not in str(e):
            raise
        first = str(e).strip().splitlines()
        detail = next((line for line in first if "global" in line.lower()), first[0])
        raise ValueError(
            f"oneflow.load({os.fspath(path)!r}): the file holds Python objects, and loading them would run "
            f"code ({detail.strip()}); only tensors and plain data load here. Save plain data "
            "(lists, dicts, tensors), or recreate the objects (e.g. a dataset's overwrite_cache)"
        ) from None


def _env_namespace() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        get_rank=dist.get_rank,
        get_world_size=dist.get_world_size,
        get_local_rank=dist.get_local_rank,
        get_node_size=lambda: 1 + (dist.get_world_size() - 1) // max(1, _local_world_size()),
    )


def _local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))


def _sbp_namespace() -> types.SimpleNamespace:
    from torch.distributed.tensor import Placement as DTensorPlacement

    return types.SimpleNamespace(
        split=dist.split,
        broadcast=dist.broadcast,
        partial_sum=dist.partial_sum,
        sbp=DTensorPlacement,
    )


#: OneFlow's own top-level names (rule 1)
TOP_LEVEL = {
    **{name: creation(getattr(torch, name)) for name in CREATION_FUNCTIONS},
    "sbp": _sbp_namespace(),
    "placement": Placement,
    "env": _env_namespace(),
    "save": _save,
    "load": _load,
    "to_global": to_global,
    "to_consistent": to_global,
    "_C": types.SimpleNamespace(**FUSED_OPS),
    # OneFlow's matmul takes transpose_a / transpose_b / alpha (LiBai's Llama attention)
    "matmul": FUSED_OPS["matmul"],
}

#: ``oneflow.<sub>`` -> the torch module it maps onto, with overriding names (rule 2)
SUBMODULES = {
    # cross entropy: OneFlow's mean over the global batch (libai.oneflow_api.losses)
    "nn": ("torch.nn", {"CrossEntropyLoss": "libai.oneflow_api.losses.CrossEntropyLoss"}),
    "nn.functional": (
        "torch.nn.functional",
        {"cross_entropy": "libai.oneflow_api.losses.cross_entropy"},
    ),
    "nn.init": ("torch.nn.init", {}),
    "optim": (
        "torch.optim",
        {
            "AdamW": "libai.optim.oneflow_optim.AdamW",
            "Adam": "libai.optim.oneflow_optim.Adam",
            "LAMB": "libai.optim.oneflow_optim.LAMB",
        },
    ),
    "optim.lr_scheduler": (
        "torch.optim.lr_scheduler",
        {
            "WarmupLR": "libai.oneflow_api.lr_schedulers.WarmupLR",
            "WarmUpLR": "libai.oneflow_api.lr_schedulers.WarmupLR",
        },
    ),
    "utils": ("torch.utils", {}),
    "utils.data": ("torch.utils.data", {}),
    "linalg": ("torch.linalg", {}),
    "cuda": ("torch.cuda", {}),
    "distributions": ("torch.distributions", {}),
    "autograd": ("torch.autograd", {}),
}


def _caller() -> str:
    """``file:line`` of the project code that asked for a name (the first frame outside
    this package)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(__path__[0]):
        frame = frame.f_back
    return "?" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _locate(dotted: str):
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


class _OneFlowModule(types.ModuleType):
    """``oneflow`` or one of its sub-packages as project code sees it."""

    def __init__(self, path: str = ""):
        super().__init__("oneflow" + (f".{path}" if path else ""))
        self._path = path
        self.__path__ = []  # a package: `from oneflow.utils.data import Dataset` works

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        key = f"{self._path}.{attr}" if self._path else attr
        value = self._resolve(key, attr)
        setattr(self, attr, value)  # resolved once
        return value

    def _resolve(self, key: str, attr: str):
        if not self._path and attr in TOP_LEVEL:
            return TOP_LEVEL[attr]
        if key in SUBMODULES:
            return _OneFlowModule(key)
        if self._path in SUBMODULES:
            torch_module, names = SUBMODULES[self._path]
            if attr in names:
                return _locate(names[attr])
            owner = importlib.import_module(torch_module)
            if hasattr(owner, attr):
                return getattr(owner, attr)
        elif not self._path and hasattr(torch, attr):
            return getattr(torch, attr)
        raise UnmappedOneFlowName(
            f"oneflow.{key} (used at {_caller()}) has no torch mapping here; the mapped names "
            "are listed in docs/libai_configs.md (OneFlow's API for project code)"
        )


_ROOT: _OneFlowModule | None = None


def project_module(name: str, fromlist=()) -> types.ModuleType:
    """The module project code gets for ``import <name>`` (``oneflow``, ``oneflow.nn``,
    ``oneflow.utils.data``, ...), with each name of ``fromlist`` resolved (an unmapped one is
    :class:`UnmappedOneFlowImport`). The first call gives ``torch.Tensor`` OneFlow's
    global-tensor attributes."""
    global _ROOT
    if _ROOT is None:
        install_tensor_methods()
        _ROOT = _OneFlowModule()
    module = _ROOT
    try:
        for part in name.split(".")[1:]:
            module = getattr(module, part)
            if not isinstance(module, types.ModuleType):
                raise UnmappedOneFlowName(f"{name} is not a package (OneFlow, used at {_caller()})")
        for attr in fromlist or ():
            if attr != "*":
                getattr(module, attr)
    except UnmappedOneFlowName as e:
        raise UnmappedOneFlowImport(str(e)) from None
    return module
