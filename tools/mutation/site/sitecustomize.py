"""Mutation runs only: record which libai functions a test's subprocesses call.

``tools/mutation.sh`` puts this folder on ``PYTHONPATH``, so every Python process a test
starts (``torchrun`` ranks, ``tools/train_net.py``, ``libai-accelerate``) imports this module
at start-up. mutmut learns which tests exercise a function from the trampolines of the
process that runs pytest; calls made in a subprocess never reach it, so code that only runs
inside ``torchrun`` workers would have no tests and its mutants would never run.

While mutmut collects its statistics, the pytest plugin (``libai_mutation_plugin``) names a
folder in ``LIBAI_MUTATION_HITS_DIR``. Here, in the subprocess, each function the mutated
``libai`` calls is appended to ``<that folder>/<pid>.hits`` the first time it is called
(written at once, so a rank that aborts at exit loses nothing); the plugin credits those
names to the test that was running. Outside statistics collection this module does nothing.
"""

from __future__ import annotations

import os


def _install_hit_recorder(hits_dir: str) -> None:
    from mutmut.mutation import trampoline

    seen: set[str] = set()
    path = os.path.join(hits_dir, f"{os.getpid()}.hits")

    def record_in_subprocess(name: str, caller: str | None = None) -> None:
        if name in seen:
            return
        seen.add(name)
        with open(path, "a", encoding="utf-8") as out:
            out.write(name + "\n")

    trampoline.record_trampoline_hit = record_in_subprocess


_hits_dir = os.environ.get("LIBAI_MUTATION_HITS_DIR")
if _hits_dir and os.environ.get("MUTANT_UNDER_TEST") == "stats":
    _install_hit_recorder(_hits_dir)
