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
never silently adds a new, unused setting. So is a path through an interpolation
(``a: ${d}``, ``a.x=2``): override ``d.x``, or replace ``a`` whole.

A changed value must fit the type of the value it replaces (:func:`check_override_type`), so
``train.train_iter=abc`` fails at once with ``train.train_iter expects an int, got 'abc'``:

- int: an int (an integral float such as ``1e3`` becomes ``1000``; ``2.5`` and bools fail);
  an int ``0`` takes any number, as Python configs write ``0`` for ``0.0`` (LiBai's
  ``warmup_ratio=0``);
- float: an int or a float (stored as a float); bool: ``true`` / ``false`` only;
- str: any value, stored as Hydra types it, as LiBai stores it (``lazyobj.x=123`` over a str
  is the int ``123``; quote it for the string: ``output_dir='2024'``); a list too
  (``data_prefix=[0.3,a,0.7,b]`` blends datasets);
- list (or tuple): a list;
- a quoted value is a string for any key, as in LiBai (``dir1b_dict.a="123"`` over an int
  stores ``"123"``); unquoted, ``abc`` for an int key still fails;
- ``null`` fits every key, and a key that is ``None`` takes any value; an interpolation
  (``${...}``) is checked as the value it resolves to (not checked if it does not resolve);
  mappings (``LazyCall`` nodes too), ``+added`` keys and values that are interpolations are
  not checked.
"""

from __future__ import annotations

import difflib
from typing import Any

from omegaconf import DictConfig, ListConfig, Node, OmegaConf

__all__ = [
    "ConfigKeyError",
    "OverrideError",
    "OverrideTypeError",
    "all_keys",
    "apply_overrides",
    "check_override_type",
]


class OverrideError(ValueError):
    """An override that cannot be parsed or applied."""


class ConfigKeyError(OverrideError, KeyError):
    """An override names a key the config does not have (or adds one that exists)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class OverrideTypeError(OverrideError):
    """An override whose value does not fit the type of the value it replaces."""


_MISSING = object()


def _lookup(cfg: Any, key: str) -> tuple[Any, Any]:
    """``(parent_node, node)`` for dotted ``key``; ``node`` is ``_MISSING`` if absent.

    ``node`` is the key's own (unresolved) config node. ``parent_node`` is ``_MISSING``
    when the path breaks before the last part, and raises ``ConfigKeyError`` when it runs
    through a value that is not a config node.
    """
    node: Any = cfg
    parts = key.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, DictConfig):
            if part not in node.keys():
                return (node if last else _MISSING), _MISSING
            if last:
                return node, node._get_node(part)
            node_value = _step(node, part, key, parts[: depth + 1])
        elif isinstance(node, ListConfig):
            if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                return (node if last else _MISSING), _MISSING
            if last:
                return node, node._get_node(int(part))
            node_value = _step(node, int(part), key, parts[: depth + 1])
        else:
            prefix = ".".join(parts[:depth])
            raise ConfigKeyError(
                f"cannot set '{key}': '{prefix}' is a {type(node).__name__} "
                f"({node!r}), not a config node"
            )
        node = node_value
    raise AssertionError("unreachable")


def has_key(cfg: Any, key: str) -> bool:
    """Whether dotted ``key`` exists in ``cfg`` (a ``None`` value counts; nothing is
    resolved). Raises ``ConfigKeyError`` for a path through a value or an interpolation."""
    return _lookup(cfg, key)[1] is not _MISSING


def _step(node: Any, index: Any, key: str, path: list[str]) -> Any:
    """The child ``index`` of container ``node`` that ``_lookup`` walks into: a config node as
    it is, a plain value resolved. A path cannot run through an interpolation (``a: ${d}``):
    a write there would replace the alias, or change what it points to."""
    child = node._get_node(index)
    if isinstance(child, (DictConfig, ListConfig)):
        return child
    if child._is_interpolation():
        raise ConfigKeyError(
            f"cannot set '{key}': '{'.'.join(path)}' is an interpolation ({child._value()}); "
            "override the key it refers to, or replace it whole"
        )
    return node[index]


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


# ---- type checks ------------------------------------------------------------------------------
#: what a key holding the int ``0`` expects: any number (a config's ``0`` may mean ``0.0``)
NUMBER = (int, float)
#: the article and name of each checked type, for the error message
_TYPE_NAMES = {
    bool: "a bool",
    int: "an int",
    float: "a float",
    str: "a str",
    list: "a list",
    NUMBER: "a number",
}


def _expected_type(node: Any) -> type | tuple | None:
    """The type an override of config node ``node`` must fit (``bool``, ``int``, ``float``,
    ``str``, ``list``, or :data:`NUMBER` for an int ``0``), or ``None`` for no check: an
    absent, ``None`` or ``???`` value, a mapping, an interpolation that does not resolve,
    any other object."""
    if not isinstance(node, Node):
        return None
    if node._is_interpolation():
        try:
            node = node._dereference_node()
        except Exception:  # unresolvable here (a missing key, a resolver's error): accept
            return None
    if node is None or node._is_none() or node._is_missing():
        return None
    if isinstance(node, (DictConfig, ListConfig)):
        return list if isinstance(node, ListConfig) else None
    value = node._value()
    if isinstance(value, (list, tuple)):
        return list
    if type(value) is int and value == 0:
        return NUMBER
    return next((t for t in (bool, int, float, str) if isinstance(value, t)), None)


def _is_interpolation_text(value: Any) -> bool:
    """Whether an override's value is an interpolation (checked when it is resolved)."""
    return isinstance(value, str) and "${" in value


def _quoted(text: str) -> bool:
    """Whether an override's value was typed in quotes (``key="123"``, ``key='a b'``)."""
    return len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""


def _converted(expected: type | tuple, value: Any) -> Any:
    """``value`` as a value of ``expected`` (not ``str``), or ``_MISSING`` if it does not fit."""
    if isinstance(value, bool) or expected is bool:
        return value if expected is bool and isinstance(value, bool) else _MISSING
    if expected in (int, NUMBER) and isinstance(value, float) and value.is_integer():
        return int(value)
    if expected is float and isinstance(value, int):
        return float(value)
    return value if isinstance(value, expected) else _MISSING


def check_override_type(key: str, expected: type | tuple | None, value: Any, text: str) -> Any:
    """The value to store for override ``key=text``, which Hydra parsed as ``value``, where
    the config's current value has type ``expected`` (``None``: anything goes).

    The rules are in the module doc. ``text`` is the value as typed: quoted, the value is a
    string for any key; the error quotes it. Raises :class:`OverrideTypeError`
    (``train.train_iter expects an int, got 'abc'``).
    """
    if expected is None or value is None or _is_interpolation_text(value):
        return value
    if expected is str or (isinstance(value, str) and _quoted(text)):
        return value  # LiBai's way: Hydra's type of the value typed; quotes make a string
    converted = _converted(expected, value)
    if converted is _MISSING:
        raise OverrideTypeError(f"{key} expects {_TYPE_NAMES[expected]}, got {text!r}")
    return converted


def _typed_value(override: Any, node: Any) -> Any:
    """Hydra's value of ``override`` checked against (and converted to the type of) the
    config's current ``node`` (``_MISSING`` when the key is new: not checked)."""
    value = override.value()
    if node is _MISSING:
        return value
    text = override.input_line.partition("=")[2].strip()
    return check_override_type(override.key_or_group, _expected_type(node), value, text)


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


def _shown(node: Any) -> Any:
    """A config node as the error messages show it: a leaf's raw value, else the node."""
    return node if isinstance(node, (DictConfig, ListConfig)) else node._value()


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """Apply ``overrides`` (Hydra's grammar, see the module doc) to ``cfg`` in place.

    Raises:
        ConfigKeyError: changing or deleting a key that does not exist (the message names
            the closest existing keys), or ``+adding`` one that does.
        OverrideTypeError: a value that does not fit the type of the value it replaces.
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
                f"Override '{line}': key '{key}' already exists (value {_shown(current)!r}); "
                f"drop the '+' to change it, or write '++{line.lstrip('+')}'."
            )
        value = _typed_value(override, current)
        if isinstance(value, (dict, list)):
            value = OmegaConf.create(value, flags={"allow_objects": True})
        OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    return cfg
