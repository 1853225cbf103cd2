"""Checking the keys of a settings mapping against the fields of a dataclass."""

from __future__ import annotations

import dataclasses
import difflib


def dataclass_items(cls, value, section: str) -> dict:
    """``value`` (a mapping or an omegaconf node) as ``{key: value}`` for the dataclass
    ``cls``; an unknown key raises ``ValueError`` naming ``section``, the key, the closest
    valid one and every valid key."""
    items = {str(k): v for k, v in dict(value).items()}
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in items if k not in names]
    if unknown:
        hints = [
            f"{k!r}"
            + "".join(f" (did you mean {c}?)" for c in difflib.get_close_matches(k, names, 1))
            for k in unknown
        ]
        raise ValueError(f"unknown {section} key(s) {', '.join(hints)}; valid keys: {names}")
    return items
