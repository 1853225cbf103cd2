"""The judgements of ``tools/mutation/judged/<package>.toml``: equivalent mutants and
untestable code.

An equivalent mutant changes no observable behaviour (``x >= 0`` -> ``x > 0`` where ``x`` is
never 0, a default that every caller overrides, ...). Each is listed by name with the change
it makes and a one-line reason; mutmut numbers a function's mutants in order, so when a
function is edited the number can point at another change: the report compares the stored
change with the mutant's diff and calls a judgement that no longer matches STALE.

Untestable code is code no test on this machine can run (CUDA-only branches, ...): listed by
function name (globs allowed) with the reason; its mutants are reported apart. A single
mutant can be judged untestable too (a change only another device could see: a tensor made
on the default device instead of its input's, where this machine has one device): listed by
name with its change and reason like an equivalent one, and checked for staleness alike.
"""

from __future__ import annotations

import fnmatch
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import toml as tomllib  # type: ignore[no-redef]

#: one file per package of libai: judged/checkpoint.toml, judged/runtime.toml, ...
#: (LIBAI_MUTATION_JUDGED names another folder: the tool's own test uses an empty one)
JUDGED_DIR = Path(
    os.environ.get("LIBAI_MUTATION_JUDGED") or Path(__file__).resolve().parent / "judged"
)


@dataclass(frozen=True)
class Equivalent:
    """One mutant's judgement: its change as the report prints it, and why."""

    change: str
    reason: str


@dataclass(frozen=True)
class Judgements:
    equivalent: dict[str, Equivalent]
    #: function-name glob (``libai.runtime.blocks.x_cuda_*``) -> reason
    untestable: dict[str, str]
    #: single mutants no test on this machine can see, judged like the equivalent ones
    untestable_mutants: dict[str, Equivalent] = field(default_factory=dict)

    def untestable_reason(self, mutant_name: str) -> str | None:
        function = mutant_name.partition("__mutmut_")[0]
        for pattern, reason in self.untestable.items():
            if fnmatch.fnmatchcase(function, pattern):
                return reason
        return None


def load_judgements(folder: Path = JUDGED_DIR) -> Judgements:
    """Every judgement of every ``*.toml`` file in ``folder``.

    A file holds ``[equivalent."<mutant name>"]`` tables (``change``: the mutant's
    ``- old | + new`` line as the report prints it; ``reason``: why no behaviour changes) and
    an ``[untestable]`` table of ``"<function name glob>" = "<reason>"`` and
    ``[untestable."<mutant name>"]`` tables (``change`` and ``reason``, as equivalent ones).
    """
    equivalent: dict[str, Equivalent] = {}
    untestable: dict[str, str] = {}
    untestable_mutants: dict[str, Equivalent] = {}
    for path in sorted(folder.glob("*.toml")):
        table = tomllib.loads(path.read_text(encoding="utf-8"))
        for name, entry in table.get("equivalent", {}).items():
            equivalent[name] = _mutant_judgement(path, "equivalent", name, entry)
        for name, entry in table.get("untestable", {}).items():
            if isinstance(entry, str):  # a function glob
                untestable[name] = entry
            else:
                untestable_mutants[name] = _mutant_judgement(path, "untestable", name, entry)
    return Judgements(equivalent, untestable, untestable_mutants)


def _mutant_judgement(path: Path, kind: str, name: str, entry: dict) -> Equivalent:
    if not entry.get("reason") or "change" not in entry:
        raise SystemExit(f"{path}: [{kind}.{name!r}] needs a change and a reason")
    return Equivalent(change=entry["change"], reason=entry["reason"])


@contextmanager
def cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def mutant_change(workdir: Path, mutant_name: str) -> str:
    """The lines a mutant removes and adds, stripped, as one line: ``- old | + new``."""
    from mutmut.configuration import reset_config
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    with cwd(workdir):
        reset_config()
        try:
            diff = get_diff_for_mutant(mutant_name)
        except FileNotFoundError:
            return ""
        finally:
            reset_config()
    changed = [
        line[0] + " " + line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return " | ".join(changed)
