"""``instantiate``: turn a config of ``LazyCall`` nodes into objects, recursively.

A node is a mapping with a ``_target_`` key (a dotted import path such as
``"torch.optim.AdamW"``, or the callable itself) plus keyword arguments. ``instantiate``
builds the arguments first (depth first), then calls the target. Plain mappings become plain
``dict`` objects and lists become ``list`` objects, so a target never sees omegaconf types.

detectron2's / Hydra's special keys work as there:

- ``_target_`` may itself be a lazy node: it is built first and the result is called, so
  ``LazyCall(LazyCall(make_factory)(scale=2))(x=1)`` is ``make_factory(scale=2)(x=1)``;
- ``_recursive_: False`` passes the node's arguments to the target as they are (config nodes,
  not built), for targets that instantiate their own children;
- a dataclass instance stored in a config (omegaconf keeps it as a typed "structured" node)
  is built back into that dataclass; namedtuple values pass through as they are.

When importing a target or calling it fails, the exception is re-raised with the config path
it came from, e.g. ``while instantiating 'model' (_target_=libai.models.GPTForPreTraining):
...``; its type is kept where possible so ``except ValueError`` still works.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = ["constructor_arguments", "instantiate", "locate", "target_to_string", "is_lazy_node"]

#: attribute set on an exception once a config path has been added to its message
_PATH_MARK = "_libai_config_path"


def locate(name: str) -> Any:
    """Import the object at dotted path ``name`` (``"pkg.module.Class.attr"``).

    Raises ``ImportError`` naming the closest attributes when the last module exists but the
    attribute does not; errors raised *inside* an imported module propagate unchanged.
    """
    if not isinstance(name, str) or not name or name.startswith("."):
        raise ImportError(f"cannot locate {name!r}: expected a dotted import path")
    parts = name.split(".")
    module, n_mod = None, 0
    for i in range(len(parts), 0, -1):
        mod_name = ".".join(parts[:i])
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            # Only "this very module does not exist" means: try a shorter prefix.
            if e.name is not None and (mod_name == e.name or mod_name.startswith(e.name + ".")):
                continue
            raise
        n_mod = i
        break
    if module is None:
        raise ImportError(f"cannot locate {name!r}: no module named {parts[0]!r}")
    obj = module
    for depth, attr in enumerate(parts[n_mod:], start=n_mod):
        if not hasattr(obj, attr):
            owner = ".".join(parts[:depth])
            close = difflib.get_close_matches(attr, [a for a in dir(obj) if not a.startswith("_")])
            hint = f"; did you mean {', '.join(owner + '.' + c for c in close)}?" if close else ""
            raise ImportError(f"cannot locate {name!r}: {owner!r} has no attribute {attr!r}{hint}")
        obj = getattr(obj, attr)
    return obj


def target_to_string(obj: Any) -> str | None:
    """The shortest dotted path that :func:`locate` maps back to ``obj``; ``None`` if none.

    ``torch.optim.adamw.AdamW`` becomes ``"torch.optim.AdamW"``. Objects without an importable
    name (lambdas, classes defined inside functions) give ``None``.
    """
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    module_parts = module.split(".")
    for i in range(1, len(module_parts) + 1):
        candidate = ".".join(module_parts[:i]) + "." + qualname
        try:
            if locate(candidate) is obj:
                return candidate
        except Exception:  # a prefix that does not import is simply not a candidate
            continue
    return None


def is_lazy_node(cfg: Any) -> bool:
    """True for a mapping with a ``_target_`` key (what ``LazyCall`` produces)."""
    return isinstance(cfg, (Mapping, DictConfig)) and "_target_" in cfg


def _describe(target: Any) -> str:
    if isinstance(target, str):
        return target
    if is_lazy_node(target):
        return f"<built from {_describe(target['_target_'])}>"
    return target_to_string(target) or getattr(target, "__qualname__", None) or repr(target)


def _with_path(err: BaseException, path: str, target: Any) -> BaseException:
    """``err`` with the config path prepended to its message, same type when possible."""
    detail = err.args[0] if isinstance(err, KeyError) and err.args else err
    msg = f"while instantiating '{path or '<root>'}' (_target_={_describe(target)}): {detail}"
    try:
        new = type(err)(msg)
        keeps_type = new.args == (msg,)
    except Exception:
        keeps_type = False
    if not keeps_type:
        new = InstantiationError(f"{msg} ({type(err).__name__})")
    setattr(new, _PATH_MARK, path)
    return new


class InstantiationError(RuntimeError):
    """A target failed and its exception type could not carry the config path."""


def _child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class AttrDict(dict):
    """A config mapping without ``_target_``, built: a ``dict`` whose keys also read as
    attributes (``cfg.num_classes``), as the ``DictConfig`` LiBai's instantiate hands over."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}; keys: {sorted(self)}") from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value


def _is_structured(cfg: Any) -> bool:
    """A config node omegaconf made from a dataclass instance (typed, "structured")."""
    return isinstance(cfg, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(cfg))


def _recursive_flag(cfg: Any, path: str) -> bool:
    flag = cfg.get("_recursive_", True)
    if not isinstance(flag, bool):
        raise TypeError(f"_recursive_ of '{path or '<root>'}' must be True or False, got {flag!r}")
    return flag


def _build_target(target: Any, path: str) -> Any:
    """The callable a node's ``_target_`` names: imported, built (a lazy node), or itself."""
    if is_lazy_node(target):
        return _instantiate(target, _child(path, "_target_"))
    if isinstance(target, str):
        return locate(target)
    return target


def _instantiate(cfg: Any, path: str, overrides: Mapping[str, Any] | None = None) -> Any:
    if isinstance(cfg, (ListConfig, list, tuple)) and not _is_namedtuple(cfg):
        items = [_instantiate(v, _child(path, i)) for i, v in enumerate(cfg)]
        return tuple(items) if isinstance(cfg, tuple) else items
    if _is_structured(cfg):
        return OmegaConf.to_object(cfg)
    if not isinstance(cfg, (Mapping, DictConfig)):
        return cfg
    if "_target_" not in cfg:
        return AttrDict({k: _instantiate(v, _child(path, k)) for k, v in cfg.items()})

    overrides = dict(overrides or {})
    recursive = overrides.pop("_recursive_", None)
    if recursive is None:
        recursive = _recursive_flag(cfg, path)
    special = ("_target_", "_recursive_")
    kwargs = {
        k: _instantiate(v, _child(path, k)) if recursive else v
        for k, v in cfg.items()
        if k not in special and k not in overrides  # an overridden value is never built
    }
    kwargs.update(overrides)
    try:
        target = _build_target(cfg["_target_"], path)
        if not callable(target):
            raise TypeError(f"_target_ {target!r} is not callable")
        return target(**kwargs)
    except Exception as err:
        if hasattr(err, _PATH_MARK):  # already names a (deeper) config path
            raise
        raise _with_path(err, path, cfg["_target_"]) from err


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def constructor_arguments(value: Any) -> dict | None:
    """The keyword arguments that rebuild a dataclass or namedtuple instance through its type
    (the dataclass's ``init`` fields, the namedtuple's fields); ``None`` for other values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    if _is_namedtuple(value):
        return value._asdict()
    return None


def instantiate(cfg: Any, **overrides: Any) -> Any:
    """Recursively build objects from ``cfg``.

    Args:
        cfg: a ``LazyCall`` node, or any nesting of dicts / lists / DictConfig / ListConfig.
        overrides: extra keyword arguments for the top-level call (``cfg`` must then have a
            ``_target_``); useful for objects that don't belong in a config, e.g.
            ``instantiate(cfg.optim.params, model=model)``. ``_recursive_=False`` here
            overrides the node's own ``_recursive_``.

    Returns the built object; non-target mappings become ``dict``, sequences ``list``, other
    values are returned as they are.
    """
    if overrides and not is_lazy_node(cfg):
        raise TypeError("instantiate(cfg, **overrides) needs a cfg with a _target_")
    path = ""
    if isinstance(cfg, DictConfig):
        path = cfg._get_full_key(None) or ""
    return _instantiate(cfg, path, overrides)
