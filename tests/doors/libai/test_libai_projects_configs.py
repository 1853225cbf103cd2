"""LiBai's projects QQP, text_classification and SimCSE (tests/fixtures/libai/projects: their
config files and the Python files those import, byte for byte from LiBai 9dcbe3b2).

Their config files load through LazyConfig as in a LiBai checkout -- ``from
configs.common.optim import optim`` (LiBai's config tree, itself ``import oneflow``) loads as a
config file -- and so do the project's own modules, OneFlow code (``import oneflow as flow``,
``from oneflow.utils.data import Dataset``, ``flow.sbp``, ``.to_global``) given OneFlow's API
on torch (``libai.oneflow_api``); QQP, text_classification and SimCSE's supervised config
train in test_libai_projects_run.py. Every ``libai`` name the project files import exists
here.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys

import pytest
from train_net_helpers import ROOT

LIBAI_CHECKOUT = ROOT / "tests" / "fixtures" / "libai"
PROJECTS = LIBAI_CHECKOUT / "projects"

CONFIGS = [
    "QQP/configs/config_qqp.py",
    "text_classification/configs/config.py",
    "SimCSE/config/config_simcse_sup.py",
    "SimCSE/config/config_simcse_unsup.py",
]
#: libai names the project files import that libai does not have: none (the last one,
#: tokenization_base.PreTrainedTokenizer, is LiBai's slow tokenizer base class, now here)
MISSING_LIBAI_NAMES: set[tuple[str, str]] = set()

_LOAD = """
import json, sys, traceback
from libai.config import LazyConfig
out = {}
for config in sys.argv[1:]:
    try:
        LazyConfig.load("projects/" + config)
        out[config] = None
    except ImportError as e:
        frames = [f.filename for f in traceback.extract_tb(e.__traceback__)]
        out[config] = [getattr(e, "name", None), frames]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Load every config in one interpreter, run as LiBai's users run: from the checkout's
    root (``configs`` and ``projects`` importable), libai from this clone only."""
    path = tmp_path_factory.mktemp("libai_only")
    (path / "libai").symlink_to(ROOT / "libai")  # not the clone's own configs/ and projects/
    env = {**os.environ, "PYTHONPATH": f"{LIBAI_CHECKOUT}{os.pathsep}{path}"}
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD, *CONFIGS],
        cwd=LIBAI_CHECKOUT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config", CONFIGS)
def test_config_loads_with_the_projects_own_oneflow_code(loaded, config):
    """LiBai's own config files imported with ``from configs.common...`` load, oneflow
    mapped inside them and inside the project modules they import."""
    assert loaded[config] is None, f"{config} stops at an import: {loaded[config]}"


def _libai_imports():
    for path in sorted(PROJECTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("libai"):
                for alias in node.names:
                    yield path.relative_to(PROJECTS), node.module, alias.name


def test_libai_names_the_projects_import_exist():
    """Every ``from libai... import X`` in the project files resolves in this libai (a name
    or a submodule), except :data:`MISSING_LIBAI_NAMES`."""
    missing, seen = set(), 0
    for _, module, name in _libai_imports():
        seen += 1
        owner = importlib.import_module(module)
        if hasattr(owner, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.add((module, name))
    assert seen > 20
    assert missing == MISSING_LIBAI_NAMES
