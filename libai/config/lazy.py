"""``LazyCall`` and ``LazyConfig``: Python config files on omegaconf (detectron2 / LiBai style).

A config file is plain Python. Every module-level ``dict``, ``DictConfig``, ``ListConfig`` or
``LazyCall(...)(...)`` node becomes a top-level key of the loaded config (only those named in
``__all__`` when the file defines it). Config files can
import each other with relative imports::

    # configs/gpt2_pretrain.py
    from .common.train import train
    from .common.models.gpt import model

    train.train_iter = 1000
    model.cfg.hidden_layers = 6

``LazyConfig.save`` writes a YAML that :meth:`LazyConfig.load` reads back to an equal config,
and :meth:`LazyConfig.apply_overrides` applies command-line overrides in Hydra's grammar.
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util
import inspect
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, SCMode
from omegaconf.errors import ValidationError

from libai.config.instantiate import constructor_arguments, target_to_string
from libai.config.oneflow_names import MAPPED_PACKAGES, config_module
from libai.oneflow_api import imports as oneflow_imports
from libai.oneflow_api.imports import oneflow_import

__all__ = ["LazyCall", "LazyConfig", "try_get_key"]

logger = logging.getLogger(__name__)

#: every config file is executed as a module of a fresh package under this prefix; relative
#: imports are intercepted only inside such modules
_CFG_PACKAGE_NAME = "libai._cfg_loader"
_IMPORT_LOCK = threading.RLock()


def _new_config(content: Any) -> DictConfig | ListConfig:
    """A config node that may hold arbitrary Python objects (callables, tensors, ...)."""
    if isinstance(content, (list, tuple, ListConfig)):
        return ListConfig(content, flags={"allow_objects": True})
    return DictConfig(content, flags={"allow_objects": True})


class LazyCall:
    """Record a call instead of making it: ``LazyCall(f)(x=1)`` is a config node for ``f(x=1)``.

    The node is a ``DictConfig`` with ``_target_`` set to ``f`` itself (as in LiBai and
    detectron2; a dataclass type as its dotted import path) plus the keyword arguments;
    :meth:`LazyConfig.save` writes callables as their dotted import paths, so a config loaded
    from YAML holds the strings. ``target`` may also be given as a dotted path string, so a config can
    name something without importing it: ``LazyCall("libai.evaluation.PPLEvaluator")()``, or
    as another lazy node, whose result is what gets called:
    ``LazyCall(LazyCall(make_loss)(kind="ce"))(logits=...)``. Classes, functions, dataclasses
    and namedtuple types are all targets. Build the object with
    :func:`libai.config.instantiate`.
    """

    def __init__(self, target: Callable | str | Mapping):
        if isinstance(target, (Mapping, DictConfig)):
            if "_target_" not in target:
                raise TypeError(
                    "a mapping given to LazyCall must be a lazy node (have a _target_), got "
                    f"keys {list(target)}"
                )
        elif not (callable(target) or isinstance(target, str)):
            raise TypeError(
                f"LazyCall target must be a callable, a dotted path or a lazy node, got {target!r}"
            )
        self._target = target

    def __call__(self, **kwargs: Any) -> DictConfig:
        target = self._target
        if dataclasses.is_dataclass(target) and isinstance(target, type):
            # omegaconf would turn a dataclass *type* into a config of its fields: its path
            name = target_to_string(target)
            if name is None:
                raise TypeError(
                    f"the dataclass {target.__qualname__} has no import path, so a config cannot "
                    "hold it as a target; define it at module level"
                )
            target = name
        try:
            return _new_config({"_target_": target, **kwargs})
        except ValidationError:  # a type omegaconf cannot hold as a value (``dict``): its path
            name = target_to_string(target) if not isinstance(target, str) else None
            if name is None:
                raise
            return _new_config({"_target_": name, **kwargs})


def try_get_key(cfg: Any, *keys: str, default: Any = None) -> Any:
    """The value of the first of ``keys`` (dotted paths) present in ``cfg``, else ``default``.

    A key that exists with value ``None`` counts as present (LiBai's behaviour).
    """
    missing = object()
    for key in keys:
        value = OmegaConf.select(cfg, key, default=missing)
        if value is not missing:
            return value
    return default


def _cast_to_config(obj: Any) -> Any:
    """Module-level dicts of a config file become ``DictConfig`` (so ``a.b = 1`` works)."""
    if isinstance(obj, dict):
        return _new_config(obj)
    return obj


def _random_package_name(filename: str) -> str:
    # A unique package per loaded file keeps separate loads from sharing module state.
    return f"{_CFG_PACKAGE_NAME}{uuid.uuid4().hex[:8]}.{os.path.basename(filename)}"


def _relative_config_file(importer: str, name: str, level: int) -> str:
    """The config file that ``from <'.' * level><name> import ...`` in ``importer`` refers to."""
    hint = (
        "Within a config file, a relative import can only import another config file, "
        "e.g. `from .common.train import train`."
    )
    if not name:
        raise ImportError(f"`from {'.' * level} import ...` in {importer} is not supported. {hint}")
    base = os.path.dirname(importer)
    for _ in range(level - 1):
        base = os.path.dirname(base)
    path = os.path.join(base, *name.split("."))
    if os.path.isfile(path + ".py"):
        return path + ".py"
    if os.path.isdir(path):
        raise ImportError(f"cannot import the directory {path} from {importer}. {hint}")
    raise ImportError(
        f"cannot import {'.' * level}{name} from {importer}: {path}.py does not exist."
    )


def _exec_config_file(filename: str, module_dict: dict) -> None:
    with open(filename, encoding="utf-8") as f:
        source = f.read()
    code = compile(source, filename, "exec")  # SyntaxError names the file and line
    exec(code, module_dict)


@contextmanager
def _patch_import():
    """Make relative imports inside config files load sibling config files, and
    ``import oneflow`` inside them give OneFlow's names mapped onto torch
    (:mod:`libai.config.oneflow_names`).

    Only imports made from a module whose ``__package__`` starts with ``_CFG_PACKAGE_NAME``
    are intercepted; every other import goes to Python's own machinery.
    """
    old_import = builtins.__import__

    def new_import(name, globals=None, locals=None, fromlist=(), level=0):
        package = (globals or {}).get("__package__") or ""
        in_config = package.startswith(_CFG_PACKAGE_NAME)
        project = oneflow_import(name, globals, fromlist, level)
        if project is not None:  # LiBai project code's `import oneflow`: its runtime API
            return project
        if in_config and level == 0 and name.partition(".")[0] in MAPPED_PACKAGES:
            # LiBai's `import oneflow as flow`: OneFlow's names mapped onto torch
            return config_module(name if fromlist else name.partition(".")[0])
        if in_config and level == 0 and fromlist and name.startswith("configs."):
            # LiBai's projects: `from configs.common.optim import optim` (its checkout's
            # config tree on sys.path) loads that file as a config file too
            found = _absolute_config_file(name)
            if found is not None:
                return _load_config_module(found, fromlist)
        if level == 0 or not in_config:
            return old_import(name, globals, locals, fromlist=fromlist, level=level)
        cur_file = _relative_config_file(globals["__file__"], name, level)
        return _load_config_module(cur_file, fromlist)

    with _IMPORT_LOCK:
        builtins.__import__ = new_import
        try:
            yield
        finally:
            builtins.__import__ = old_import
            if oneflow_imports.served:  # project modules may import oneflow lazily later
                oneflow_imports.install_project_imports()


def _absolute_config_file(name: str) -> str | None:
    """The file of config module ``configs.x.y`` in the first ``sys.path`` entry holding it."""
    for entry in sys.path:
        path = os.path.join(entry or os.getcwd(), *name.split(".")) + ".py"
        if os.path.isfile(path):
            return path
    return None


def _load_config_module(cur_file: str, fromlist):
    """Execute config file ``cur_file`` as a module (its imports patched as well)."""
    spec = importlib.util.spec_from_loader(_random_package_name(cur_file), loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = cur_file
    module.__package__ = spec.name
    _exec_config_file(cur_file, module.__dict__)
    for attr in fromlist or ():
        if attr not in module.__dict__:
            raise ImportError(f"cannot import name {attr!r} from config file {cur_file}")
        module.__dict__[attr] = _cast_to_config(module.__dict__[attr])
    return module


def _select(module_dict: dict, keys, filename: str):
    """``keys`` (a name or a list / tuple of names) of a config file's module namespace."""
    wanted = [keys] if isinstance(keys, str) else list(keys)
    missing = [k for k in wanted if k not in module_dict]
    if missing:
        raise KeyError(f"config file {filename} defines no {', '.join(map(repr, missing))}")
    values = [_cast_to_config(module_dict[k]) for k in wanted]
    return values[0] if isinstance(keys, str) else tuple(values)


def _as_lazy_node(value: Any) -> dict | None:
    """A dataclass or namedtuple instance of an importable type as the node that rebuilds it."""
    arguments = constructor_arguments(value)
    name = target_to_string(type(value)) if arguments is not None else None
    return None if name is None else {"_target_": name, **arguments}


def _to_yaml_safe(value: Any, path: str, unsaveable: list[str]) -> Any:
    """Plain containers for YAML: targets as dotted paths, dataclass and namedtuple values as
    the lazy nodes that rebuild them; other objects as their repr (listed in ``unsaveable``)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            child = f"{path}.{k}" if path else str(k)
            if k == "_target_" and not isinstance(v, (str, dict)):
                name = target_to_string(v)
                if name is not None:
                    out[k] = name
                    continue
            out[k] = _to_yaml_safe(v, child, unsaveable)
        return out
    node = _as_lazy_node(value)
    if node is not None:
        return _to_yaml_safe(node, path, unsaveable)
    if isinstance(value, (list, tuple)):
        return [_to_yaml_safe(v, f"{path}[{i}]", unsaveable) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    unsaveable.append(path)
    return repr(value)


def _save_pickle(cfg: Any, filename: str) -> bool:
    """Write ``cfg`` with cloudpickle (lambdas and local classes included); False on failure."""
    import cloudpickle

    try:
        with open(filename, "wb") as f:
            cloudpickle.dump(cfg, f)
    except Exception as err:  # e.g. a lock or an open file inside the config
        logger.warning("The config could not be pickled to %s either: %s", filename, err)
        if os.path.exists(filename):
            os.remove(filename)
        return False
    return True


def _load_pickle(filename: str) -> DictConfig | ListConfig:
    import cloudpickle

    try:
        with open(filename, "rb") as f:
            cfg = cloudpickle.load(f)
    except Exception as err:
        raise ValueError(
            f"{filename} is not a config pickle LazyConfig.save wrote ({type(err).__name__}: "
            f"{err}); load the .yaml beside it, or save the config again"
        ) from err
    if not isinstance(cfg, (DictConfig, ListConfig)):
        cfg = _new_config(cfg)
    return cfg


class LazyConfig:
    """Load, save and override configs made of ``LazyCall`` nodes (see the module doc)."""

    @staticmethod
    def load(filename: str | os.PathLike, keys: str | list[str] | tuple | None = None):
        """Load a ``.py`` or ``.yaml`` config file, or the ``.pkl`` :meth:`save` writes.

        Args:
            filename: path of the file.
            keys: ``None`` for the whole config; one name (returns that value) or a list /
                tuple of names (returns a tuple of values). With ``keys`` a ``.py`` file's
                names are returned whatever they hold (strings, numbers, objects), as
                detectron2's ``LazyConfig.load`` / ``load_rel`` do.

        Returns:
            A ``DictConfig`` whose top-level keys are the file's module-level configs
            (names starting with ``_`` are skipped; if the file defines ``__all__``, only
            the names it lists), or the selected value(s).
        """
        filename = os.path.abspath(os.fspath(filename))
        if not os.path.isfile(filename):
            raise FileNotFoundError(f"config file {filename} does not exist")
        if filename.endswith(".py"):
            module_dict = {"__file__": filename, "__package__": _random_package_name(filename)}
            with _patch_import():
                _exec_config_file(filename, module_dict)
            exported = module_dict.get("__all__")
            if exported is not None:
                missing = [n for n in exported if n not in module_dict]
                if missing:
                    raise ValueError(f"__all__ of {filename} names undefined {missing}")
            names = exported if exported is not None else list(module_dict)
            if keys is not None:  # any module-level name, not only the configs
                return _select(module_dict, keys, filename)
            cfg = _new_config(
                {
                    name: _cast_to_config(module_dict[name])
                    for name in names
                    if not name.startswith("_")
                    and isinstance(_cast_to_config(module_dict[name]), (DictConfig, ListConfig))
                }
            )
        elif filename.endswith((".yaml", ".yml")):
            loaded = OmegaConf.load(filename)
            cfg = _new_config(OmegaConf.to_container(loaded, resolve=False))
        elif filename.endswith(".pkl"):
            cfg = _load_pickle(filename)
        else:
            raise ValueError(
                f"config file must end with .py, .yaml or .pkl (LazyConfig.save's pickle), "
                f"got {filename}"
            )
        if keys is None:
            return cfg
        if isinstance(keys, str):
            return cfg[keys]
        return tuple(cfg[k] for k in keys)

    # not mutated (tools/mutation.sh): it reads its caller's frame, a mutant's trampoline
    @staticmethod
    def load_rel(
        filename: str, keys: str | list[str] | tuple | None = None
    ):  # pragma: no mutate block
        """:meth:`load` with ``filename`` relative to the directory of the calling file.

        Meant for config files (``LazyConfig.load_rel("../common/train.py", "train")``), and
        works from any Python file that has a ``__file__``. Each call loads the file afresh.
        """
        frame = inspect.currentframe().f_back
        caller = frame.f_globals.get("__file__") if frame is not None else None
        if caller is None:
            raise RuntimeError(
                "LazyConfig.load_rel needs a calling file (a config file or a module with "
                "__file__); from an interactive session use LazyConfig.load with the full path"
            )
        return LazyConfig.load(os.path.join(os.path.dirname(caller), os.fspath(filename)), keys)

    @staticmethod
    def save(cfg: Any, filename: str | os.PathLike) -> None:
        """Write ``cfg`` as YAML; :meth:`load` gives back an equal config.

        Callable ``_target_`` values are written as dotted import paths, dataclass and
        namedtuple values as the lazy nodes that rebuild them (``instantiate`` gives the same
        objects back). Interpolations (``${...}``) are kept, not resolved.

        A value YAML cannot hold (a lambda, an object of a class without an import path, a
        tensor, ...) is written to the YAML as its ``repr``, so the file stays readable, and
        the whole config is also written with cloudpickle to ``<filename>.pkl`` (LiBai's and
        detectron2's behaviour), which :meth:`load` reads back. A warning names the keys and
        the ``.pkl``. A ``.pkl`` left from an earlier save of the same name is removed when the
        YAML alone holds the config.
        """
        filename = os.fspath(filename)
        container = OmegaConf.to_container(
            cfg, resolve=False, enum_to_str=True, structured_config_mode=SCMode.INSTANTIATE
        )
        unsaveable: list[str] = []
        data = _to_yaml_safe(container, "", unsaveable)
        dumped = yaml.safe_dump(
            data, default_flow_style=None, sort_keys=False, width=9999, allow_unicode=True
        )
        with open(filename, "w", encoding="utf-8") as f:
            f.write(dumped)
        pickle_path = filename + ".pkl"
        if not unsaveable:
            if os.path.exists(pickle_path):
                os.remove(pickle_path)
            return
        saved = _save_pickle(cfg, pickle_path)
        logger.warning(
            "Config values YAML cannot represent were written as their repr in %s: %s. %s",
            filename,
            ", ".join(unsaveable),
            f"The whole config is in {pickle_path} (LazyConfig.load reads it)."
            if saved
            else "They are not saved anywhere else.",
        )

    @staticmethod
    def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
        """Apply command-line overrides in Hydra's grammar; see :mod:`libai.config.overrides`."""
        from libai.config.overrides import apply_overrides

        return apply_overrides(cfg, overrides)

    @staticmethod
    def to_py(cfg: Any, prefix: str = "cfg.", *, runnable: bool = False) -> str:
        """``cfg`` as Python-like text: by default LiBai's format, for reading (one
        ``cfg.a.b = value`` line per leaf, lazy nodes as calls of their targets' dotted
        paths, interpolations resolved, formatted by black; :mod:`libai.config.readable_py`).

        With ``runnable=True``: Python source that executes back to an equal config. With
        ``prefix="cfg."`` that text creates ``cfg`` and assigns every top-level key
        (``cfg.optim = L("torch.optim.AdamW")(lr=0.0001)``); with ``prefix=""`` it is a config
        file that :meth:`load` reads back. Long calls wrap one argument per line. Callable
        targets come out as their dotted paths (as :meth:`save` writes them); a value with no
        source form (a lambda, a tensor) raises a ``ValueError`` naming its key. See
        :mod:`libai.config.to_py`.
        """
        if not runnable:
            from libai.config.readable_py import config_to_readable_py

            return config_to_readable_py(cfg, prefix)
        from libai.config.to_py import config_to_py

        return config_to_py(cfg, prefix)

    @staticmethod
    def to_dict(cfg: Any) -> Any:
        """Plain Python containers (interpolations resolved), e.g. for logging."""
        if isinstance(cfg, (DictConfig, ListConfig)):
            return OmegaConf.to_container(cfg, resolve=True)
        if isinstance(cfg, Mapping):
            return dict(cfg)
        return cfg
