"""LiBai's path of ``GraphBase``; the class lives in :mod:`libai.runtime.graph` (it drives the
runtime's one training step, which the models layer cannot import). Resolved on first use,
so importing the models does not import the runtime."""

from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name == "GraphBase":
        return importlib.import_module("libai.runtime.graph").GraphBase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
