"""LiBai's front door: ``DefaultTrainer`` and ``default_setup`` on the execution core in
:mod:`libai.runtime`.

Paths of earlier releases stay importable, as aliases of the same module objects: the
runtime's modules (``libai.engine.parallel``, ``libai.engine.hooks``, ...; now
``libai.runtime.*``) and FleetX's door (``libai.engine.Engine``, ``libai.engine.BasicModule``,
``libai.engine.modules.*``, ...; now ``libai.fleetx.*``). They are resolved on first use
(an import finder for the module paths, PEP 562 for the names), so ``import libai.engine``
imports neither FleetX's door nor its task modules.
"""

import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys

from libai.config.arguments import default_argument_parser
from libai.engine.default import DefaultTrainer, default_setup
from libai.runtime import MODULES as _RUNTIME_MODULES
from libai.runtime.parallel import (
    PIPELINE_SCHEDULES,
    ModelRunner,
    prune_to_stages,
    train_step,
)
from libai.runtime.trainer import EagerTrainer, HookBase, TrainerBase

#: ``libai.engine.<name>`` -> the module's path now (``memory_estimator`` was in libai.utils)
_MOVED = {name: f"libai.runtime.{name}" for name in _RUNTIME_MODULES if name != "memory_estimator"}
_MOVED.update(
    {
        name: f"libai.fleetx.{name}"
        for name in ("engine", "module", "module_hooks", "yaml_setup", "yaml_optim", "export")
    }
)
#: FleetX's names, from ``libai.fleetx``
_FLEETX_NAMES = ("BasicModule", "Engine", "InputSpec")


def _new_path(fullname: str) -> str | None:
    """The current path of ``libai.engine.<old>`` (``modules`` and everything under it
    included), or None for a module that lives here."""
    prefix = __name__ + "."
    if not fullname.startswith(prefix):
        return None
    rest = fullname[len(prefix) :]
    if rest == "modules" or rest.startswith("modules."):
        return "libai.fleetx." + rest
    return _MOVED.get(rest)


class _AliasLoader(_abc.Loader):
    """Loads an old path as the module at its new path (the same object)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = _importlib.import_module(self.new)
        self.spec = module.__spec__  # the import system overwrites it: put it back
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec


class _AliasFinder(_abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = _new_path(fullname)
        return None if new is None else _util.spec_from_loader(fullname, _AliasLoader(new))


if not any(isinstance(f, _AliasFinder) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str):
    if name in _FLEETX_NAMES:
        return getattr(_importlib.import_module("libai.fleetx"), name)
    if name in _MOVED or name == "modules":
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PIPELINE_SCHEDULES",
    "BasicModule",
    "DefaultTrainer",
    "EagerTrainer",
    "Engine",
    "HookBase",
    "InputSpec",
    "ModelRunner",
    "TrainerBase",
    "default_argument_parser",
    "default_setup",
    "prune_to_stages",
    "train_step",
]
