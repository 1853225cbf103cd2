"""``LazyConfig.to_py``: a config as Python source that executes back to an equal config.

detectron2 prints configs as Python-like pseudo code; here the text is real Python. With the
default ``prefix="cfg."`` it creates ``cfg`` and assigns each top-level key::

    from omegaconf import OmegaConf
    from libai.config import LazyCall as L

    cfg = OmegaConf.create(flags={"allow_objects": True})
    cfg.optim = L("torch.optim.AdamW")(lr=0.0001, betas=[0.9, 0.999])

so ``exec`` of the text leaves in ``cfg`` a config equal to the one printed. With
``prefix=""`` the text is a config file: every top-level key is a module-level name, and
:meth:`LazyConfig.load` of the written file gives the config back.

Lazy targets are written as the dotted-path strings the config holds (``LazyCall`` stores
importable callables that way), interpolations as the ``"${...}"`` strings they are, dataclass
and namedtuple values, enums, functions and classes through their import paths. A value
without a source form (a lambda, a tensor, an object of a local class) is a ``ValueError``
naming its key; :meth:`LazyConfig.save` pickles such configs instead.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import keyword
import math
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, SCMode

from libai.config.instantiate import constructor_arguments, target_to_string

__all__ = ["config_to_py"]

#: line length the printer wraps at (the project's ruff line length)
LINE_LENGTH = 100


@dataclasses.dataclass
class _Group:
    """A bracketed expression: ``head`` + items joined by ", " + ``close``; wrapped one item
    per line (with a trailing comma) when it does not fit on one."""

    head: str
    items: list[tuple[str, Any]]  # (text before the item, e.g. "lr=", and the item)
    close: str


def _flat(expr: str | _Group) -> str:
    if isinstance(expr, str):
        return expr
    inner = ", ".join(prefix + _flat(item) for prefix, item in expr.items)
    return expr.head + inner + expr.close


def _render(expr: str | _Group, column: int, indent: int, trail: int = 0) -> str:
    """``expr`` starting at ``column`` inside a block indented by ``indent`` spaces, followed
    on its line by ``trail`` more characters (the comma after a wrapped group's item)."""
    flat = _flat(expr)
    if isinstance(expr, str) or column + len(flat) + trail <= LINE_LENGTH or not expr.items:
        return flat
    pad = " " * (indent + 4)
    lines = [expr.head]
    for prefix, item in expr.items:
        body = _render(item, indent + 4 + len(prefix), indent + 4, trail=1)
        lines.append(f"{pad}{prefix}{body},")
    lines.append(" " * indent + expr.close)
    return "\n".join(lines)


def _is_name(key: Any) -> bool:
    return isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)


def _module_of(dotted: str) -> str:
    """The longest importable module prefix of an importable dotted name."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return ".".join(parts[:i])
    raise ValueError(f"{dotted} has no importable module")


class _Writer:
    """Turns the containers of a config into expressions, collecting the imports they need."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.uses_lazy = False

    def _named(self, obj: Any, path: str) -> str:
        name = target_to_string(obj)
        if name is None:
            raise self._error(obj, path, "its type or value has no import path")
        self.modules.add(_module_of(name))
        return name

    @staticmethod
    def _error(value: Any, path: str, why: str) -> ValueError:
        return ValueError(
            f"LazyConfig.to_py cannot write '{path or '<root>'}' ({type(value).__name__}: "
            f"{value!r:.60}) as Python source: {why}. LazyConfig.save keeps such configs in a "
            ".pkl beside the YAML."
        )

    def _keywords(self, mapping: dict, path: str, head: str, close: str) -> _Group:
        if all(_is_name(k) for k in mapping):
            items = [(f"{k}=", self.expr(v, f"{path}.{k}")) for k, v in mapping.items()]
            return _Group(head, items, close)
        literal = self._literal_dict(mapping, path)
        return _Group(head, [("**", literal)], close)

    def _literal_dict(self, mapping: dict, path: str) -> _Group:
        items = [
            (f"{self.expr(k, path)}: ", self.expr(v, f"{path}.{k}")) for k, v in mapping.items()
        ]
        return _Group("{", items, "}")

    def _lazy(self, node: dict, path: str) -> _Group:
        self.uses_lazy = True
        target = node["_target_"]
        target_path = f"{path}._target_"
        if isinstance(target, dict):
            target_expr = _flat(self.expr(target, target_path))
        elif isinstance(target, str):
            target_expr = json.dumps(target, ensure_ascii=False)
        else:
            name = target_to_string(target)
            if name is None:
                raise self._error(target, target_path, "the target has no import path")
            target_expr = json.dumps(name)
        kwargs = {k: v for k, v in node.items() if k != "_target_"}
        return self._keywords(kwargs, path, f"L({target_expr})(", ")")

    def expr(self, value: Any, path: str) -> str | _Group:
        """The source expression of one config value (``path`` names it in errors)."""
        if isinstance(value, enum.Enum):
            return f"{self._named(type(value), path)}.{value.name}"
        if value is None or isinstance(value, (bool, int, bytes)):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f'float("{value}")'
        if isinstance(value, str):
            return json.dumps(value, ensure_ascii=False)
        if isinstance(value, dict):
            if "_target_" in value:
                return self._lazy(value, path)
            if not value:
                return "{}"
            if all(_is_name(k) for k in value):
                return self._keywords(value, path, "dict(", ")")
            return self._literal_dict(value, path)
        arguments = constructor_arguments(value)  # a dataclass or namedtuple instance
        if arguments is not None:
            return self._keywords(arguments, path, self._named(type(value), path) + "(", ")")
        if isinstance(value, (list, tuple)):
            items = [("", self.expr(v, f"{path}[{i}]")) for i, v in enumerate(value)]
            return _Group("[", items, "]")
        if isinstance(value, torch.dtype):
            self.modules.add("torch")
            return str(value)
        if callable(value):
            return self._named(value, path)
        raise self._error(value, path, "it has no source form")


def config_to_py(cfg: Any, prefix: str = "cfg.") -> str:
    """Python source for ``cfg``; see the module docstring and :meth:`LazyConfig.to_py`."""
    if not isinstance(cfg, (DictConfig, dict)):
        raise TypeError(f"LazyConfig.to_py needs a DictConfig or dict, got {type(cfg).__name__}")
    root = prefix[:-1] if prefix.endswith(".") else None
    if prefix and not (root and _is_name(root)):
        raise ValueError(
            f"to_py prefix must be '' (a config file) or '<name>.' such as 'cfg.', got {prefix!r}"
        )
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=False, structured_config_mode=SCMode.INSTANTIATE)
    writer = _Writer()
    statements = []
    for key, value in cfg.items():
        expr = writer.expr(value, str(key))
        if root:
            target = f"{root}.{key}" if _is_name(key) else f"{root}[{json.dumps(key)}]"
        elif _is_name(key) and isinstance(value, dict):
            target = key
        else:
            raise ValueError(
                f"to_py(prefix='') writes a config file, whose top-level names are dicts or "
                f"LazyCall nodes; {key!r} is not one (or not a Python name). Use prefix='cfg.'"
            )
        statements.append(f"{target} = {_render(expr, len(target) + 3, 0)}")

    reserved = {m.split(".")[0] for m in writer.modules} | {"L", "OmegaConf", "dict", "float"}
    clash = [k for k in cfg if k in reserved]
    if clash and not root:
        raise ValueError(
            f"top-level keys {clash} clash with names to_py imports; use prefix='cfg.'"
        )
    header = []
    if root:
        header.append("from omegaconf import OmegaConf")
    if writer.uses_lazy:
        header.append("from libai.config import LazyCall as L")
    header += [f"import {m}" for m in sorted(writer.modules)]
    body = [f'{root} = OmegaConf.create(flags={{"allow_objects": True}})'] if root else []
    return "\n".join(header) + ("\n\n" if header else "") + "\n".join(body + statements) + "\n"
