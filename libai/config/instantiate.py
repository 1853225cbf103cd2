"""``instantiate``: turn a config of ``LazyCall`` nodes into objects, recursively.

A node is a mapping with a ``_target_`` key (a dotted import path such as
``"torch.optim.AdamW"``, or the callable itself) plus keyword arguments. ``instantiate``
builds the arguments first (depth first), then calls the target. Plain mappings become plain
``dict`` objects and lists become ``list`` objects, so a target never sees omegaconf types.

When importing a target or calling it fails, the exception is re-raised with the config path
it came from, e.g. ``while instantiating 'model' (_target_=libai.models.GPTForPreTraining):
...``; its type is kept where possible so ``except ValueError`` still works.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig

__all__ = ["instantiate", "locate", "target_to_string", "is_lazy_node"]

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


def _instantiate(cfg: Any, path: str, overrides: Mapping[str, Any] | None = None) -> Any:
    if isinstance(cfg, (ListConfig, list, tuple)):
        items = [_instantiate(v, _child(path, i)) for i, v in enumerate(cfg)]
        return tuple(items) if isinstance(cfg, tuple) else items
    if not isinstance(cfg, (Mapping, DictConfig)):
        return cfg
    if "_target_" not in cfg:
        return {k: _instantiate(v, _child(path, k)) for k, v in cfg.items()}

    target = cfg["_target_"]
    overrides = overrides or {}
    kwargs = {
        k: _instantiate(v, _child(path, k))
        for k, v in cfg.items()
        if k != "_target_" and k not in overrides  # an overridden value is never built
    }
    kwargs.update(overrides)
    try:
        if isinstance(target, str):
            target = locate(target)
        if not callable(target):
            raise TypeError(f"_target_ {target!r} is not callable")
        return target(**kwargs)
    except Exception as err:
        if hasattr(err, _PATH_MARK):  # already names a (deeper) config path
            raise
        raise _with_path(err, path, cfg["_target_"]) from err


def instantiate(cfg: Any, **overrides: Any) -> Any:
    """Recursively build objects from ``cfg``.

    Args:
        cfg: a ``LazyCall`` node, or any nesting of dicts / lists / DictConfig / ListConfig.
        overrides: extra keyword arguments for the top-level call (``cfg`` must then have a
            ``_target_``); useful for objects that don't belong in a config, e.g.
            ``instantiate(cfg.optim.params, model=model)``.

    Returns the built object; non-target mappings become ``dict``, sequences ``list``, other
    values are returned as they are.
    """
    if overrides and not is_lazy_node(cfg):
        raise TypeError("instantiate(cfg, **overrides) needs a cfg with a _target_")
    path = ""
    if isinstance(cfg, DictConfig):
        path = cfg._get_full_key(None) or ""
    return _instantiate(cfg, path, overrides)
