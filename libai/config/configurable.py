"""``@configurable``: let ``__init__`` take either keyword arguments or one ``cfg`` mapping."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Mapping


def _kwargs_from_cfg(init_func, cfg: Mapping, owner: str) -> dict:
    params = inspect.signature(init_func).parameters
    names = [n for n in params if n not in ("self", "cfg")]
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {}
    for key, value in cfg.items():
        if key in names or accepts_any:
            kwargs[key] = value
            continue
        close = difflib.get_close_matches(str(key), names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"{owner} got an unknown config key model.cfg.{key}.{hint}")
    return kwargs


def _resolved_arguments(init_func, instance, args, kwargs) -> dict:
    """The arguments of this call with defaults filled in, ``**kwargs`` flattened."""
    signature = inspect.signature(init_func)
    bound = signature.bind(instance, *args, **kwargs)
    bound.apply_defaults()
    out = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif name != "self" and kind is not inspect.Parameter.VAR_POSITIONAL:
            out[name] = value
    return out


def configurable(init_func):
    """Decorate ``__init__`` so ``Model(cfg=cfg)`` equals ``Model(**cfg)`` (LiBai's style).

    Unknown keys in ``cfg`` raise a ``ValueError`` naming the closest valid ones; explicit
    keyword arguments override values from ``cfg``. The resolved hyper-parameters (defaults
    included) are kept in ``instance.libai_cfg`` (used to export a Hugging Face config).
    """

    @functools.wraps(init_func)
    def wrapped(self, *args, cfg: Mapping | None = None, **kwargs):
        if cfg is not None:
            merged = _kwargs_from_cfg(init_func, cfg, type(self).__name__)
            merged.update(kwargs)
            kwargs = merged
        out = init_func(self, *args, **kwargs)
        # the outermost __init__ finishes last, so a subclass's arguments win
        self.__dict__["libai_cfg"] = _resolved_arguments(init_func, self, args, kwargs)
        return out

    return wrapped
