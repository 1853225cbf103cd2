"""Comparison keys: the names under which two models' modules and parameters are matched.

A module's key is its route (its name in ``named_modules``) after the rename rules:

- **user rules**: ``[(regex, replacement), ...]`` applied with ``re.sub`` in order;
- **loader rules**: a libai model that has a Hugging Face loader is keyed by the Hugging Face
  names, derived from the same weight tables the loaders use
  (:mod:`libai.models.utils.weight_mapping`). Each :class:`~libai.models.utils.
  weight_mapping.Copy` rule pairs the libai module holding the parameter with the Hugging
  Face module holding the tensor (``...layers.0.mlp.dense_4h_to_h`` ↔ ``...h.0.mlp.c_proj``);
  a container is paired when all of its mapped descendants, walked up by the same number of
  levels on the Hugging Face side, land on one module (``...layers.0`` ↔ ``...h.0``). Fused
  projections (``GroupedFuse``: q/k/v in one matrix) have no counterpart module and are not
  keyed; pairs claimed twice (a tied head and its embedding, the embeddings and the backbone
  both landing on ``transformer``) are dropped, so ambiguity never pairs the wrong modules.

Parameters of such a model are exported by their rules (``Rule.export``: the Hugging Face
names and layouts, e.g. GPT-2's transposed ``Conv1D`` weights and split q/k/v), so weights
and gradients compare with a transformers model's tensor for tensor.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import nn

from libai.models.utils.weight_mapping import Copy, Rule

RenameRules = Sequence[tuple[str, str]]


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _up(route: str, levels: int) -> str | None:
    parts = route.split(".") if route else []
    if levels > len(parts):
        return None
    return ".".join(parts[: len(parts) - levels])


def _depth_below(route: str, ancestor: str) -> int | None:
    if ancestor == "":
        return len(route.split(".")) if route else 0
    if route == ancestor:
        return 0
    if route.startswith(ancestor + "."):
        return len(route[len(ancestor) + 1 :].split("."))
    return None


def leaf_pairs(rules: dict[str, Rule], skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """libai module -> Hugging Face module, from the 1:1 ``Copy`` rules (see module doc);
    rules of the parameters in ``skip`` (tied copies) are ignored."""
    pairs: dict[str, str] = {}
    conflicted: set[str] = set()
    for rule in rules.values():
        if rule.libai_name in skip:
            continue
        if not isinstance(rule, Copy):
            ours = _parent(rule.libai_name)
            conflicted.add(ours)  # a fused projection: this module has no counterpart
            continue
        ours, theirs = _parent(rule.libai_name), _parent(rule.hf_name)
        if pairs.get(ours, theirs) != theirs:
            conflicted.add(ours)
        pairs.setdefault(ours, theirs)
    pairs = {k: v for k, v in pairs.items() if k not in conflicted}
    return _drop_claimed_twice(pairs)


def _drop_claimed_twice(pairs: dict[str, str]) -> dict[str, str]:
    claims: dict[str, int] = {}
    for theirs in pairs.values():
        claims[theirs] = claims.get(theirs, 0) + 1
    return {k: v for k, v in pairs.items() if claims[v] == 1}


def container_pairs(routes: Sequence[str], leaves: dict[str, str]) -> dict[str, str]:
    """Pairs for the containers among ``routes`` whose mapped descendants agree."""
    found: dict[str, str] = {}
    for route in routes:
        if route in leaves:
            continue
        target: str | None = None
        ok = False
        for leaf, theirs in leaves.items():
            depth = _depth_below(leaf, route)
            if not depth:
                continue
            up = _up(theirs, depth)
            if up is None or (target is not None and up != target):
                ok = False
                break
            target, ok = up, True
        if ok:
            found[route] = target
    return found


def loader_module_keys(model: nn.Module, rules: dict[str, Rule]) -> dict[str, str]:
    """Route -> Hugging Face module name for every module of ``model`` that has one."""
    # a pipeline-parallel model holds the tied head as a copy of the embedding: not a pair
    tied = frozenset(
        n
        for n, p in model.named_parameters(remove_duplicate=False)
        if getattr(p, "libai_tied_copy", False)
    )
    leaves = leaf_pairs(rules, tied)
    routes = [name for name, _ in model.named_modules()]
    pairs = {**leaves, **container_pairs(routes, leaves)}
    return _drop_claimed_twice(pairs)


def loader_rules(model: nn.Module) -> dict[str, Rule] | None:
    """The Hugging Face weight rules of a libai model, by libai parameter name (or None)."""
    from libai.models.utils import loader_for_model
    from libai.models.utils.hf_export import model_libai_cfg
    from libai.models.utils.model_loader.base_loader import complete_rules

    try:
        loader = loader_for_model(model)
    except TypeError:
        return None
    return complete_rules(model, loader.rules(model_libai_cfg(model), type(model)))


def apply_rename(name: str, rules: RenameRules) -> str:
    """``name`` after each ``(regex, replacement)`` of ``rules`` in turn."""
    for pattern, replacement in rules:
        name = re.sub(pattern, replacement, name)
    return name


def validate_rename(rules) -> list[tuple[str, str]]:
    """``rules`` as a list of compiled-checked pairs; a clear error otherwise."""
    if rules is None:
        return []
    out = []
    for i, rule in enumerate(rules):
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2):
            raise TypeError(f"rename[{i}] must be a (regex, replacement) pair, got {rule!r}")
        pattern, replacement = rule
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"rename[{i}]: bad regular expression {pattern!r}: {e}") from e
        out.append((str(pattern), str(replacement)))
    return out
