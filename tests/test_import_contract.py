"""The import rule (pyproject.toml [tool.importlinter], docs/architecture.md): imports flow
one way through libai's layers, checked by import-linter on the installed package; and the
old import paths of the runtime's modules stay importable."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

importlinter_cli = pytest.importorskip("importlinter.cli")

ROOT = Path(__file__).resolve().parents[1]


def lint(config: Path) -> int:
    """import-linter's exit status on ``config``, in a process of its own (it reconfigures
    logging, which would silence libai's loggers for the tests after it)."""
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(config)!r}, no_cache=True, no_logo=True))"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=300).returncode


def test_the_layers_contract_is_kept():
    assert lint(ROOT / "pyproject.toml") == importlinter_cli.EXIT_STATUS_SUCCESS


def test_the_checker_sees_an_upward_import(tmp_path):
    """The same tool on a contract the code breaks (the models import the layers, so the
    layers cannot sit above them): it must fail, or the kept contract above proves nothing."""
    config = tmp_path / "inverted.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "libai"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "inverted"\ntype = "layers"\nlayers = ["libai.layers", "libai.models"]\n'
    )
    assert lint(config) == importlinter_cli.EXIT_STATUS_ERROR


RUNTIME = [
    "amp",
    "amp_lists",
    "blocks",
    "core",
    "fsdp",
    "grad_clip",
    "grad_overlap",
    "hooks",
    "parallel",
    "pipeline_stages",
    "sequence_parallel",
    "trainer",
    "zero",
]


FLEETX = ["engine", "module", "module_hooks", "yaml_setup", "yaml_optim", "export", "modules"]
FLEETX += [f"modules.{m}" for m in ("base", "classification", "gpt", "llama", "vit")]
MOVED = [(f"libai.engine.{m}", f"libai.runtime.{m}") for m in RUNTIME]
MOVED += [(f"libai.engine.{m}", f"libai.fleetx.{m}") for m in FLEETX]
MOVED += [("libai.utils.checkpoint", "libai.checkpoint.checkpointer")]  # LiBai's path
MOVED += [("libai.utils.memory_estimator", "libai.runtime.memory_estimator")]


@pytest.mark.parametrize("old, new", MOVED)
def test_old_paths_are_the_same_modules(old, new):
    """``libai.engine.<name>`` (the path of earlier releases, and of users' code) is the very
    module at its new path: patching one patches the other, and classes are identical."""
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is module


def test_old_names_keep_working():
    from libai.engine import (
        BasicModule,
        DefaultTrainer,
        EagerTrainer,
        Engine,
        HookBase,
        ModelRunner,
        default_setup,
    )
    from libai.engine.hooks import BestCheckpointer, EvalHook, PeriodicCheckpointer
    from libai.engine.modules.gpt import GPTModule
    from libai.engine.parallel import ModelRunner as Runner
    from libai.fleetx import BasicModule as FleetXModule
    from libai.fleetx import Engine as FleetXEngine
    from libai.fleetx.modules import gpt
    from libai.runtime import hooks, parallel, trainer

    assert Runner is ModelRunner is parallel.ModelRunner
    assert (EagerTrainer, HookBase) == (trainer.EagerTrainer, trainer.HookBase)
    assert (BestCheckpointer, EvalHook, PeriodicCheckpointer) == (
        hooks.BestCheckpointer,
        hooks.EvalHook,
        hooks.PeriodicCheckpointer,
    )
    assert (Engine, BasicModule, GPTModule) == (FleetXEngine, FleetXModule, gpt.GPTModule)
    assert callable(default_setup) and DefaultTrainer
    from libai.checkpoint import Checkpointer as New
    from libai.utils.checkpoint import Checkpointer as Old

    assert Old is New


def test_libai_paths_of_earlier_releases_are_the_same_modules():
    """LiBai's ``libai.utils.distributed`` and ``libai.utils.checkpoint`` are aliases of the
    packages that hold the code now (the same module objects, so monkeypatching and
    ``isinstance`` see one thing)."""
    import libai.checkpoint.checkpointer
    import libai.dist
    from libai.utils import checkpoint, distributed

    assert distributed is libai.dist
    assert checkpoint is libai.checkpoint.checkpointer
    assert distributed.DistLayout is libai.dist.DistLayout


def test_importing_libai_engine_leaves_fleetx_alone():
    """LiBai's door does not pay for FleetX's: ``import libai.engine`` (a fresh interpreter)
    imports no ``libai.fleetx`` module until an old FleetX path is used, and the module
    imported through an old path keeps its own name and spec."""
    code = (
        "import sys, libai.engine\n"
        "print(sorted(m for m in sys.modules if m.startswith('libai.fleetx')))\n"
        "from libai.engine.modules import gpt\n"
        "print(gpt.__name__, gpt.__spec__.name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    assert out == ["[]", "libai.fleetx.modules.gpt libai.fleetx.modules.gpt"]


#: the process-global mesh accessors; layers and models keep the mesh they were built on
GLOBAL_MESH_READS = {"get_dist_util", "current_dist_util"}


def global_mesh_reads(source: str) -> list[int]:
    """Line numbers of calls to :data:`GLOBAL_MESH_READS` (as ``dist.f()`` or ``f()``)."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in GLOBAL_MESH_READS:
                lines.append(node.lineno)
    return sorted(lines)


def test_layers_and_models_never_read_the_global_mesh():
    """Layers and models capture their mesh at build (``dist.capture_mesh``) and use it at
    run time; the runtime finds it with ``dist.mesh_of(model)``. Two models on two meshes
    then train in one process group (tests/distributed/test_gpt_parallel.py)."""
    found = {}
    for package in ("layers", "models"):
        for path in sorted((ROOT / "libai" / package).rglob("*.py")):
            lines = global_mesh_reads(path.read_text())
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}
    # the scan sees both spellings
    assert global_mesh_reads("a = dist.get_dist_util().tp_group\nb = current_dist_util()") == [
        1,
        2,
    ]
