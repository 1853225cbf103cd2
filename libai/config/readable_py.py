"""``LazyConfig.to_py``'s default: a config printed as LiBai (and detectron2) print it.

Python-like text for people to read, not to execute: every leaf of the config is one
``cfg.<dotted key> = <value>`` line (keys sorted), a lazy node is a call of its target's
dotted path with its arguments sorted (``cfg.optim = torch.optim.AdamW(lr=0.0001, ...)``),
a mapping inside a call is a dict literal; interpolations are resolved. The text is then
formatted by black, as LiBai formats it. ``LazyConfig.to_py(cfg, runnable=True)`` prints
source that executes back to the config instead (:mod:`libai.config.to_py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from libai.config.instantiate import target_to_string

__all__ = ["config_to_readable_py"]


def _target(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, Mapping):  # a lazy node whose result is called
        return _value(target)
    return target_to_string(target) or repr(target)


def _call(node: Mapping) -> str:
    arguments = ", ".join(
        f"{k}={_value(v)}" for k, v in sorted(node.items(), key=_key) if k != "_target_"
    )
    return f"{_target(node['_target_'])}({arguments})"


def _value(value: Any) -> str:
    """An argument or a leaf: calls for lazy nodes, literals for the rest."""
    if isinstance(value, Mapping):
        if "_target_" in value:
            return _call(value)
        items = (f"{k!r}: {_value(v)}" for k, v in sorted(value.items(), key=_key))
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return repr(value)


def _key(item: tuple) -> str:
    return str(item[0])


def _lines(node: Mapping, prefix: str) -> list[str]:
    out = []
    for key, value in sorted(node.items(), key=_key):
        if isinstance(value, Mapping) and "_target_" not in value:
            out += _lines(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key} = {_value(value)}")
    return out


def config_to_readable_py(cfg: Any, prefix: str = "cfg.") -> str:
    """``cfg`` as LiBai's ``LazyConfig.to_py`` prints it (see the module doc)."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        try:
            cfg = OmegaConf.to_container(cfg, resolve=True)
        except Exception:  # an interpolation that does not resolve: shown as written
            cfg = OmegaConf.to_container(cfg, resolve=False)
    text = "\n".join(_lines(cfg, prefix) if isinstance(cfg, Mapping) else [_value(cfg)]) + "\n"
    import black  # a dependency, as in LiBai; imported here: only printing needs it

    try:
        return black.format_str(text, mode=black.Mode())
    except black.InvalidInput:  # not Python (a key that is not a name): as built
        return text
