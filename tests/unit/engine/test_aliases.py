"""The old paths under ``libai.engine`` resolve, in this process, to the modules at their new
paths: the attribute hook (PEP 562) and the import finder's loader, called the way the
import system calls them (a fresh interpreter's view is in tests/test_import_contract.py)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

import libai.engine as engine
import libai.fleetx
import libai.fleetx.modules
import libai.runtime.hooks
import libai.runtime.parallel


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("hooks", libai.runtime.hooks),
        ("parallel", libai.runtime.parallel),
        ("modules", libai.fleetx.modules),
    ],
)
def test_an_old_module_name_is_the_module_at_its_new_path(name, module):
    assert engine.__getattr__(name) is module


def test_fleetx_names_come_from_fleetx():
    for name in ("BasicModule", "Engine", "InputSpec"):
        assert engine.__getattr__(name) is getattr(libai.fleetx, name)


@pytest.mark.parametrize("name", ["nothing_here", "MODULES", "memory_estimator"])
def test_an_unknown_name_is_an_attribute_error_naming_the_module(name):
    with pytest.raises(AttributeError, match=rf"module 'libai.engine' has no attribute '{name}'"):
        engine.__getattr__(name)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("libai.engine.hooks", "libai.runtime.hooks"),
        ("libai.engine.engine", "libai.fleetx.engine"),
        ("libai.engine.modules.gpt", "libai.fleetx.modules.gpt"),
    ],
)
def test_the_alias_loader_gives_the_module_back_with_its_own_spec(old, new):
    """As the import system does: a spec from the finder, a module from the spec (which sets
    ``__spec__`` to the alias's), then ``exec_module``: the module is the new path's, and
    its ``__spec__`` names the new path again (``importlib.reload`` and pickling read it)."""
    finder = next(f for f in sys.meta_path if type(f).__name__ == "_AliasFinder")
    spec = finder.find_spec(old)
    module = importlib.util.module_from_spec(spec)
    assert module is importlib.import_module(new)
    spec.loader.exec_module(module)
    assert module.__spec__.name == new
    assert module.__spec__.origin.endswith(new.replace(".", "/") + ".py")


def test_the_finder_ignores_paths_that_are_not_old_ones():
    finder = next(f for f in sys.meta_path if type(f).__name__ == "_AliasFinder")
    assert finder.find_spec("libai.engine.default") is None
    assert finder.find_spec("libai.runtime.hooks") is None
    assert finder.find_spec("libai.engineering") is None
