"""Command-line overrides in Hydra's grammar, checked against the keys the config has.

Each override is parsed by Hydra's own parser, so values are typed the way Hydra types them::

    train.train_iter=1000            # int
    optim.lr=3e-4                    # float
    train.amp.enabled=true           # bool
    train.dist.pipeline_num_layers=null
    train.dist.custom_pipeline_stage_id=[0,0,1,1]
    train.output_dir='runs/my run'   # quoted string (spaces, commas, ...)
    +optim.amsgrad=true              # add a key that the config does not have yet
    ++train.new_or_old=1             # add or change
    ~train.evaluation.evaluator      # delete

Changing a key that does not exist is an error naming the closest existing keys, so a typo
never silently adds a new, unused setting.
"""

from __future__ import annotations

import difflib
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = ["ConfigKeyError", "OverrideError", "apply_overrides", "all_keys"]


class OverrideError(ValueError):
    """An override that cannot be parsed or applied."""


class ConfigKeyError(OverrideError, KeyError):
    """An override names a key the config does not have (or adds one that exists)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


_MISSING = object()


def _lookup(cfg: Any, key: str) -> tuple[Any, Any]:
    """``(parent_node, value)`` for dotted ``key``; ``value`` is ``_MISSING`` if absent.

    ``parent_node`` is ``_MISSING`` when the path breaks before the last part, and raises
    ``OverrideError`` when it runs through a value that is not a config node.
    """
    node: Any = cfg
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if isinstance(node, DictConfig):
            if part not in node.keys():
                return (node if depth == len(parts) - 1 else _MISSING), _MISSING
            child = node._get_node(part)
            node_value = child if isinstance(child, (DictConfig, ListConfig)) else node[part]
        elif isinstance(node, ListConfig):
            if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                return (node if depth == len(parts) - 1 else _MISSING), _MISSING
            node_value = node[int(part)]
        else:
            prefix = ".".join(parts[:depth])
            raise OverrideError(
                f"cannot set '{key}': '{prefix}' is a {type(node).__name__} "
                f"({node!r}), not a config node"
            )
        if depth == len(parts) - 1:
            return node, node_value
        node = node_value
    raise AssertionError("unreachable")


def all_keys(cfg: Any, prefix: str = "") -> list[str]:
    """Every dotted key path in ``cfg`` (inner nodes included), depth first."""
    keys = []
    if isinstance(cfg, DictConfig):
        for k in cfg.keys():
            path = f"{prefix}.{k}" if prefix else str(k)
            keys.append(path)
            child = cfg._get_node(k)
            if isinstance(child, (DictConfig, ListConfig)):
                keys.extend(all_keys(child, path))
    return keys


def _closest_keys(cfg: Any, key: str, n: int = 3) -> list[str]:
    """Existing keys closest to ``key``: siblings with a similar name first, else any path."""
    candidates = all_keys(cfg)
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in candidates if k.rpartition(".")[0] == parent}
    close = [siblings[s] for s in difflib.get_close_matches(leaf, list(siblings), n=n)]
    if close:
        return close
    ancestors = {".".join(key.split(".")[:i]) for i in range(1, key.count(".") + 1)}
    others = [k for k in candidates if k not in ancestors]
    return difflib.get_close_matches(key, others, n=n, cutoff=0.6)


def _unknown_key_message(cfg: Any, key: str, override: str) -> str:
    close = _closest_keys(cfg, key)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return (
        f"Override '{override}': the config has no key '{key}'.{hint} "
        f"To add a new key, write '+{override.lstrip('+~')}'."
    )


def _parse(overrides: list[str]):
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException
    except ImportError as e:  # pragma: no cover - hydra-core is a dependency
        raise ImportError("config overrides need hydra-core: pip install hydra-core") from e
    parser = OverridesParser.create()
    parsed = []
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException as e:
            raise OverrideError(f"cannot parse override {line!r}: {e}") from e
        if override.is_sweep_override():
            raise OverrideError(
                f"override {line!r} is a sweep (several values); quote the value if it is one "
                "string, e.g. key='a,b'"
            )
        parsed.append(override)
    return parsed


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """Apply ``overrides`` (Hydra's grammar, see the module doc) to ``cfg`` in place.

    Raises:
        ConfigKeyError: changing or deleting a key that does not exist (the message names
            the closest existing keys), or ``+adding`` one that does.
        OverrideError: unparseable overrides, sweeps, paths through non-config values.

    Returns ``cfg``.
    """
    from hydra.core.override_parser.types import OverrideType

    for override in _parse(list(overrides)):
        key, line = override.key_or_group, override.input_line
        parent, current = _lookup(cfg, key)
        exists = current is not _MISSING
        if override.type is OverrideType.DEL:
            if not exists:
                raise ConfigKeyError(_unknown_key_message(cfg, key, line))
            leaf = key.rpartition(".")[2]
            del parent[int(leaf) if isinstance(parent, ListConfig) else leaf]
            continue
        if override.type is OverrideType.CHANGE and not exists:
            raise ConfigKeyError(_unknown_key_message(cfg, key, line))
        if override.type is OverrideType.ADD and exists:
            raise ConfigKeyError(
                f"Override '{line}': key '{key}' already exists (value {current!r}); "
                f"drop the '+' to change it, or write '++{line.lstrip('+')}'."
            )
        value = override.value()
        if isinstance(value, (dict, list)):
            value = OmegaConf.create(value, flags={"allow_objects": True})
        OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    return cfg
