"""``libai-accelerate --user-script FILE ...``: the file runs as ``__main__`` (as ``python
FILE`` would run it, with ``sys.argv`` = the file and the command's words), and while it runs
Rapidformer's names are importable:

- ``rapidformer``: :mod:`libai.accelerate.rapidformer_api` (``RapidformerEngine``,
  ``get_args``, ``Finetuner``, ``PreTrainer`` / ``Pretrainer``, ...);
- ``megatron`` (``get_args``, ``get_tokenizer``, ``get_timers``) and ``megatron.mpu``
  (:mod:`libai.accelerate.mpu`).

The entries exist in ``sys.modules`` only while the script runs: no package of another
product's name is installed, and other code never sees them. The script's own
``trainer.train()`` is the run; a script that only defines one template class (and trains
nothing) has that class trained with the command's flags. A bare ``args`` in the script
(the documented scripts read it without defining it) is the engine's parsed flags.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import types

from libai.accelerate import mpu, rapidformer_api
from libai.accelerate.templates import Finetuner, PreTrainer, trainings

__all__ = ["SCOPED_NAMES", "rapidformer_names", "run_user_script"]

SCOPED_NAMES = ("rapidformer", "megatron", "megatron.mpu")


def _modules() -> dict[str, types.ModuleType]:
    rapidformer = types.ModuleType("rapidformer", rapidformer_api.__doc__)
    for name in rapidformer_api.__all__:
        setattr(rapidformer, name, getattr(rapidformer_api, name))
    rapidformer.__all__ = list(rapidformer_api.__all__)
    megatron = types.ModuleType("megatron", "Megatron's names used by Rapidformer scripts")
    megatron.__path__ = []  # a package: ``import megatron.mpu`` finds the entry below
    megatron.mpu = mpu
    for name in ("get_args", "get_tokenizer", "get_timers"):
        setattr(megatron, name, getattr(rapidformer_api, name))
    return {"rapidformer": rapidformer, "megatron": megatron, "megatron.mpu": mpu}


@contextlib.contextmanager
def rapidformer_names():
    """``rapidformer`` / ``megatron`` / ``megatron.mpu`` importable inside the block; the
    previous ``sys.modules`` entries (normally none) restored after."""
    saved = {name: sys.modules.get(name) for name in SCOPED_NAMES}
    sys.modules.update(_modules())
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


class _Args:
    """A script's bare ``args``: the parsed flags of the engine (looked up at each use, so
    it reads the engine created later in the script)."""

    def __getattr__(self, name):
        return getattr(rapidformer_api.get_args(), name)

    def __repr__(self) -> str:
        return repr(rapidformer_api.get_args())


def _template_classes(namespace: dict, run_name: str) -> list[type]:
    return [
        v
        for v in namespace.values()
        if isinstance(v, type)
        and issubclass(v, Finetuner)
        and v not in (Finetuner, PreTrainer)
        and v.__module__ == run_name
    ]


def run_user_script(path: str, argv: list[str]) -> dict:
    """Run the script ``path`` as ``__main__`` with ``sys.argv = [path, *argv]`` and
    Rapidformer's names importable; then, if it trained nothing itself, train its one
    template class with the flags of ``argv``. Returns the script's globals."""
    from libai.accelerate.arguments import parse_args
    from libai.accelerate.engine import AccelerateEngine

    if not os.path.isfile(path):
        raise FileNotFoundError(f"--user-script {path!r} is not a file")
    before = trainings()
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as ``python FILE``
    try:
        with rapidformer_names():
            namespace = runpy.run_path(path, init_globals={"args": _Args()}, run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    if trainings() == before:
        found = _template_classes(namespace, "__main__")
        if len(found) > 1:
            raise ValueError(
                f"--user-script {path} trains nothing itself and defines "
                f"{[c.__name__ for c in found]}: call trainer.train() or keep one template"
            )
        if found:
            found[0](AccelerateEngine(parse_args(argv))).train()
    return namespace


def user_script_of(argv: list[str]) -> str | None:
    """The ``--user-script`` of the command's words (``None`` when not given)."""
    from libai.accelerate.arguments import _expand_config_file

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--user-script")
    known, _ = parser.parse_known_args(_expand_config_file(list(argv)))
    return known.user_script
