"""OneFlow's names inside LiBai config files, mapped onto torch.

LiBai's configs write ``import oneflow as flow`` and ``LazyCall(flow.optim.AdamW)(...)``.
While :meth:`~libai.config.LazyConfig.load` executes a config file (and only then: no
top-level ``oneflow`` package is installed or shadowed), ``import oneflow`` inside the file
gives the module object built here. Each name resolves to what it means on torch: an
optimizer is the dotted path of its torch (or libai) class, which ``instantiate`` imports
when the config is built; a dtype is the torch dtype; ``flow.nn.X`` is ``torch.nn.X``.
``import flowvision`` (OneFlow's torchvision) works the same way: its transforms, ``Mixup``,
RandAugment, random erasing and ``SoftTargetCrossEntropy`` are libai's implementations
(:data:`FLOWVISION_NAMES`), given as the objects themselves.
A name with no mapping is a one-line ``ImportError`` (:class:`UnmappedNameError`) naming it and listing what is mapped
(the table is in docs/libai_configs.md).
"""

from __future__ import annotations

import types

import torch

from libai.utils.errors import OneLineError

__all__ = ["MAPPED_PACKAGES", "ONEFLOW_NAMES", "UnmappedNameError", "config_module"]


class UnmappedNameError(ImportError, OneLineError):
    """A OneFlow name in a config file that has no torch mapping (one line in the tools)."""


#: ``oneflow.<name>`` -> a dotted path that instantiate imports (classes, functions)
ONEFLOW_NAMES = {
    "optim.AdamW": "libai.optim.oneflow_optim.AdamW",
    "optim.Adam": "libai.optim.oneflow_optim.Adam",
    "optim.SGD": "torch.optim.SGD",
    "optim.LAMB": "libai.optim.oneflow_optim.LAMB",
}

#: ``oneflow.<dtype>`` -> the torch dtype
ONEFLOW_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float",
        "float16",
        "float32",
        "float64",
        "double",
        "half",
        "bfloat16",
        "int8",
        "int32",
        "int64",
        "long",
        "uint8",
        "bool",
    )
}

#: ``flowvision.<name>`` (OneFlow's torchvision + timm pieces) -> a dotted path of its libai
#: implementation. Config files call some of these while loading (``SoftTargetCrossEntropy()``,
#: ``str_to_interp_mode("bicubic")``), so they resolve to the objects themselves.
_T, _D = "libai.data.transforms", "libai.data"
_TRANSFORMS = (
    "Compose",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "Resize",
    "CenterCrop",
    "ToTensor",
    "Normalize",
    "InterpolationMode",
)
FLOWVISION_NAMES = {
    **{f"transforms.{n}": f"{_T}.{n}" for n in _TRANSFORMS},
    "transforms.functional.str_to_interp_mode": f"{_T}.str_to_interp_mode",
    "data.constants.IMAGENET_DEFAULT_MEAN": f"{_T}.IMAGENET_DEFAULT_MEAN",
    "data.constants.IMAGENET_DEFAULT_STD": f"{_T}.IMAGENET_DEFAULT_STD",
    **{f"transforms.transforms.{n}": f"{_T}.{n}" for n in _TRANSFORMS},
    "data.IMAGENET_DEFAULT_MEAN": f"{_T}.IMAGENET_DEFAULT_MEAN",
    "data.IMAGENET_DEFAULT_STD": f"{_T}.IMAGENET_DEFAULT_STD",
    "layers.weight_init.trunc_normal_": "torch.nn.init.trunc_normal_",
    "data.Mixup": f"{_D}.mixup.Mixup",
    "data.mixup.Mixup": f"{_D}.mixup.Mixup",
    "data.auto_augment.rand_augment_transform": f"{_D}.auto_augment.rand_augment_transform",
    "data.random_erasing.RandomErasing": f"{_D}.random_erasing.RandomErasing",
    "loss.cross_entropy.SoftTargetCrossEntropy": (
        "libai.layers.soft_target_cross_entropy.SoftTargetCrossEntropy"
    ),
}

#: the top-level packages a config file may import by OneFlow's names
MAPPED_PACKAGES = ("oneflow", "flowvision")


class _ConfigModule(types.ModuleType):
    """``oneflow`` or one of its sub-packages, as seen from inside a config file."""

    def __init__(self, name: str):
        super().__init__(name)
        self._root, _, self._prefix = name.partition(".")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        key = f"{self._prefix}.{attr}" if self._prefix else attr
        if self._root == "flowvision":
            return self._flowvision(key, attr)
        if key in ONEFLOW_NAMES:
            return ONEFLOW_NAMES[key]
        if not self._prefix and attr in ONEFLOW_DTYPES:
            return ONEFLOW_DTYPES[attr]
        if self._prefix == "nn" and hasattr(torch.nn, attr):
            return getattr(torch.nn, attr)
        if any(name.startswith(key + ".") for name in ONEFLOW_NAMES) or key == "nn":
            return _ConfigModule(f"{self.__name__}.{attr}")
        raise UnmappedNameError(_unmapped(f"{self.__name__}.{attr}"))

    def _flowvision(self, key: str, attr: str):
        if key in FLOWVISION_NAMES:
            from libai.config.instantiate import locate  # the import instantiate would make

            return locate(FLOWVISION_NAMES[key])
        if any(name.startswith(key + ".") for name in FLOWVISION_NAMES):
            return _ConfigModule(f"{self.__name__}.{attr}")
        raise UnmappedNameError(_unmapped(f"{self.__name__}.{attr}"))


def _unmapped(name: str) -> str:
    if name.startswith("flowvision"):
        mapped = [f"flowvision.{k}" for k in FLOWVISION_NAMES]
        return (
            f"{name} (flowvision, in a config file) has no mapping onto libai here; mapped: "
            f"{', '.join(mapped)}. Replace it with a libai or torch name in the config."
        )
    mapped = [f"oneflow.{k}" for k in ONEFLOW_NAMES] + ["oneflow.<dtype>", "oneflow.nn.<module>"]
    return (
        f"{name} (OneFlow, in a config file) has no mapping onto torch here; mapped: "
        f"{', '.join(mapped)}. Replace it with its torch name in the config."
    )


def project_flowvision(name: str, fromlist=()) -> types.ModuleType:
    """``import flowvision...`` in LiBai project code: the same names as in config files
    (libai's objects), each of ``fromlist`` resolved at the import (an unmapped one is an
    ``ImportError`` naming it)."""
    module = config_module(name)
    for attr in fromlist or ():
        if attr != "*":
            getattr(module, attr)
    return module


def _register_for_projects() -> None:
    from libai.oneflow_api import imports

    imports.OTHER_PACKAGES["flowvision"] = project_flowvision


_register_for_projects()


def config_module(name: str) -> types.ModuleType:
    """The module a config file gets for ``import <name>`` (``oneflow``, ``oneflow.optim``,
    ...); raises ``ImportError`` naming a sub-package with no mapping."""
    root, _, rest = name.partition(".")
    module = _ConfigModule(root)
    for part in filter(None, rest.split(".")):
        module = getattr(module, part)
        if not isinstance(module, types.ModuleType):
            raise UnmappedNameError(f"{name} is not a package (OneFlow name in a config file)")
    return module
