"""Run a LiBai project's own entry script (``projects/Llama/train_net.py``) with OneFlow's
API for its code: ``python path/to/libai/oneflow_api/run.py SCRIPT [args...]``, which
``tools/train.sh`` uses for a script under a ``projects/`` directory (LiBai's command:
``bash tools/train.sh projects/Llama/train_net.py projects/Llama/configs/llama_sft.py 8``).

The script runs as ``__main__`` with its own directory first on ``sys.path``, as ``python
SCRIPT`` would, and the working directory (the LiBai checkout's root, which LiBai's ``pip
install -e .`` puts on the path) last, for ``projects.<name>`` and ``configs``. This libai
is imported before that directory is on the path, so a LiBai checkout's own ``libai/``
package there never stands in for it (which ``python -m`` from the checkout would do). Its
project directory (``projects/<name>``) is registered as project code
(:data:`libai.oneflow_api.imports.PROJECT_DIRS`), so ``import oneflow`` in the script and in
the modules it imports by their short names (``from utils.weight_convert import ...``) gets
:mod:`libai.oneflow_api`.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == HERE:
    del sys.path[0]  # run as a file: its own directory is no import root

from libai.oneflow_api import imports  # noqa: E402 (after the path fix above)


def project_dir(script: str) -> str:
    """``.../projects/<name>`` of ``script`` (its own directory when it is under no
    ``projects/``)."""
    path = os.path.dirname(os.path.abspath(script))
    parts = path.split(os.sep)
    if "projects" in parts[:-1]:
        index = len(parts) - 1 - parts[::-1].index("projects")
        return os.sep.join(parts[: index + 2])
    return path


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python libai/oneflow_api/run.py SCRIPT [args...]")
    script = argv[0]
    if not os.path.isfile(script):
        raise SystemExit(f"libai.oneflow_api.run: no script {script}")
    # libai's config package registers flowvision's names for project code (a script may
    # import flowvision before it imports libai)
    importlib.import_module("libai.config")
    imports.PROJECT_DIRS.append(project_dir(script))
    imports.served = True
    imports.install_project_imports()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
