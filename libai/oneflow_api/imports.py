"""Which imports get OneFlow's API: ``import oneflow`` made by LiBai project code.

Project code is a module whose ``__name__`` starts with ``projects.`` (LiBai's layout: a
checkout's root on ``sys.path``, its configs importing ``projects.<name>.<module>``), or
whose file lies in a project directory a project's entry script was started from
(:mod:`libai.oneflow_api.run`: LiBai's MAE imports ``modeling.mae`` from its own
directory). While
:meth:`~libai.config.LazyConfig.load` runs, its import hook asks :func:`oneflow_import`;
once project code has been served, :func:`install_project_imports` keeps answering for it
(a project module may import lazily, inside a function, after its config loaded). Every
other import, ``import oneflow`` from any other module included, goes to Python's own
machinery untouched.
"""

from __future__ import annotations

import builtins
import os
import types

__all__ = ["install_project_imports", "is_project_code", "oneflow_import", "served"]

#: whether project code has imported ``oneflow`` in this process (then
#: :func:`install_project_imports` is due once the config loader's own hook is gone)
served = False
#: directories whose modules are project code whatever their names (an entry script's project)
PROJECT_DIRS: list[str] = []
#: other packages project code imports by OneFlow's names -> the function giving the module
#: (``flowvision``: its names are libai's, registered by libai.config.oneflow_names)
OTHER_PACKAGES: dict = {}


#: NumPy's aliases of Python's builtins that NumPy 1.24 removed, which LiBai's projects
#: (written for the NumPy of their time) still use: ``np.float`` was ``float``
NUMPY_REMOVED_ALIASES = {
    "float": float,
    "int": int,
    "bool": bool,
    "object": object,
    "complex": complex,
    "str": str,
}


class _ProjectNumpy(types.ModuleType):
    """``numpy`` as LiBai project code sees it: numpy itself, plus
    :data:`NUMPY_REMOVED_ALIASES` (no other module sees them)."""

    def __init__(self, numpy_module):
        super().__init__("numpy")
        self.__dict__["_numpy"] = numpy_module

    def __getattr__(self, attr: str):
        numpy_module = self.__dict__["_numpy"]
        if attr in NUMPY_REMOVED_ALIASES and attr not in vars(numpy_module):
            value = NUMPY_REMOVED_ALIASES[attr]
        else:
            value = getattr(numpy_module, attr)
        self.__dict__[attr] = value  # resolved once: project code reads np.* in hot loops
        return value


_NUMPY: _ProjectNumpy | None = None


def project_numpy(name: str, fromlist=()) -> types.ModuleType:
    """``import numpy`` / ``from numpy import float`` in project code (its submodules, such
    as ``numpy.random``, are numpy's own)."""
    global _NUMPY
    import importlib

    module = importlib.import_module(name)
    if name != "numpy" and fromlist:
        return module
    if _NUMPY is None:
        _NUMPY = _ProjectNumpy(importlib.import_module("numpy"))
    return _NUMPY


OTHER_PACKAGES["numpy"] = project_numpy


def is_project_code(globals_: dict | None) -> bool:
    """Whether the importing module is LiBai project code (``projects.*``, or a file under
    one of :data:`PROJECT_DIRS`)."""
    globals_ = globals_ or {}
    if str(globals_.get("__name__") or "").startswith("projects."):
        return True
    path = globals_.get("__file__")
    return bool(path and PROJECT_DIRS) and any(
        os.path.abspath(path).startswith(root + os.sep) for root in PROJECT_DIRS
    )


def oneflow_import(name: str, globals_, fromlist, level: int) -> types.ModuleType | None:
    """The module ``import name`` gives project code when it is OneFlow's (or another
    package of :data:`OTHER_PACKAGES`), else ``None``."""
    global served
    root = name.partition(".")[0]
    if level != 0 or root not in ("oneflow", *OTHER_PACKAGES) or not is_project_code(globals_):
        return None
    served = True
    if root in OTHER_PACKAGES:
        return OTHER_PACKAGES[root](name if fromlist else root, fromlist)
    from libai.oneflow_api import project_module

    return project_module(name if fromlist else "oneflow", fromlist)


def install_project_imports() -> None:
    """Answer project code's ``import oneflow`` from now on (idempotent)."""
    current = builtins.__import__
    if getattr(current, "_libai_oneflow_projects", False):
        return

    def project_import(name, globals=None, locals=None, fromlist=(), level=0):
        module = oneflow_import(name, globals, fromlist, level)
        if module is not None:
            return module
        return current(name, globals, locals, fromlist, level)

    project_import._libai_oneflow_projects = True
    builtins.__import__ = project_import
