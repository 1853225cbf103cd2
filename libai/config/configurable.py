"""``@configurable``: let ``__init__`` take either keyword arguments or one ``cfg`` mapping."""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
from collections.abc import Mapping

from omegaconf import DictConfig

logger = logging.getLogger(__name__)


def _kwargs_from_cfg(init_func, cfg: Mapping, owner_cls: type, passed_down: bool = False) -> dict:
    """``init_func``'s keyword arguments from ``cfg``. An unknown key is an error, unless
    the config was ``passed_down`` (``Model(cfg)``, LiBai's style for a project model that
    hands its whole config to the encoder it wraps: the keys it adds are the wrapper's)."""
    owner = owner_cls.__name__
    params = inspect.signature(init_func).parameters
    names = [n for n in params if n not in ("self", "cfg")]
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    no_effect = getattr(owner_cls, "libai_no_effect_keys", {})
    kwargs, ignored = {}, []
    for key, value in cfg.items():
        if key in names or accepts_any:
            kwargs[key] = value
            continue
        if key in no_effect:
            ignored.append(f"model.cfg.{key} ({no_effect[key]})")
            continue
        if passed_down:
            ignored.append(f"model.cfg.{key} (not one of {owner}'s arguments)")
            continue
        close = difflib.get_close_matches(str(key), names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"{owner} got an unknown config key model.cfg.{key}.{hint}")
    if ignored:
        logger.info("%s: keys with no effect here: %s", owner, "; ".join(ignored))
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
    """Decorate ``__init__`` so ``Model(cfg=cfg)`` and ``Model(cfg)`` equal ``Model(**cfg)``
    (LiBai's style: a mapping as the only positional argument is the config).

    A class with a ``from_config(cls, cfg)`` classmethod (LiBai's protocol, which its
    projects' models use) gets its arguments from it. Otherwise unknown keys in ``cfg``
    raise a ``ValueError`` naming the closest valid ones (keys the
    class lists in ``libai_no_effect_keys``, LiBai's, are dropped with a log line); explicit
    keyword arguments override values from ``cfg``. The resolved hyper-parameters (defaults
    included) are kept in ``instance.libai_cfg`` (used to export a Hugging Face config).
    """

    @functools.wraps(init_func)
    def wrapped(self, *args, cfg: Mapping | None = None, **kwargs):
        passed_down = cfg is None and len(args) == 1 and isinstance(args[0], (Mapping, DictConfig))
        if passed_down:
            cfg, args = args[0], ()
        from_config = getattr(type(self), "from_config", None)
        if cfg is not None and inspect.ismethod(from_config):
            # LiBai's protocol: the class picks its arguments from the config itself
            kwargs = {**from_config(cfg), **kwargs}
        elif cfg is not None:
            merged = _kwargs_from_cfg(init_func, cfg, type(self), passed_down)
            merged.update(kwargs)
            kwargs = merged
        out = init_func(self, *args, **kwargs)
        # the outermost __init__ finishes last, so a subclass's arguments win
        self.__dict__["libai_cfg"] = _resolved_arguments(init_func, self, args, kwargs)
        return out

    return wrapped


def init_signature(cls: type) -> inspect.Signature:
    """``cls.__init__``'s signature without ``self``: what ``inspect.signature(cls)`` should
    show for a class whose ``__new__`` dispatches (``*args, **kwargs``) to a variant."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return inspect.Signature(params)
