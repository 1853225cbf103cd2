"""LiBai's front door: ``DefaultTrainer`` and ``default_setup`` on the execution core in
:mod:`libai.runtime`.

Paths of earlier releases stay importable, as aliases of the same module objects: the
runtime's modules (``libai.engine.parallel``, ``libai.engine.hooks``, ...; now
``libai.runtime.*``) and FleetX's door (``libai.engine.Engine``, ``libai.engine.BasicModule``,
``libai.engine.modules.*``, ...; now ``libai.fleetx.*``).
"""

import importlib as _importlib
import pkgutil as _pkgutil
import sys as _sys

from libai.runtime import MODULES as _RUNTIME_MODULES


def _alias(old: str, new: str) -> None:
    module = _importlib.import_module(new)
    _sys.modules.setdefault(old, module)
    parent, _, leaf = old.rpartition(".")
    if parent == __name__:
        globals()[leaf] = module


for _name in _RUNTIME_MODULES:
    if _name != "memory_estimator":  # it was libai.utils.memory_estimator
        _alias(f"{__name__}.{_name}", f"libai.runtime.{_name}")
for _name in ("engine", "module", "module_hooks", "yaml_setup", "yaml_optim", "export", "modules"):
    _alias(f"{__name__}.{_name}", f"libai.fleetx.{_name}")
for _info in _pkgutil.iter_modules(_importlib.import_module("libai.fleetx.modules").__path__):
    _alias(f"{__name__}.modules.{_info.name}", f"libai.fleetx.modules.{_info.name}")

from libai.config.arguments import default_argument_parser  # noqa: E402
from libai.engine.default import DefaultTrainer, default_setup  # noqa: E402
from libai.fleetx import BasicModule, Engine, InputSpec  # noqa: E402
from libai.runtime.parallel import (  # noqa: E402
    PIPELINE_SCHEDULES,
    ModelRunner,
    prune_to_stages,
    train_step,
)
from libai.runtime.trainer import EagerTrainer, HookBase, TrainerBase  # noqa: E402

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
