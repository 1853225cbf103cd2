"""The judgements of ``tools/mutation/judged/<package>.toml``: equivalent mutants and
untestable code.

An equivalent mutant changes no observable behaviour (``x >= 0`` -> ``x > 0`` where ``x`` is
never 0, a default that every caller overrides, ...). Each is listed by name with the change
it makes and a one-line reason; mutmut numbers a function's mutants in order, so when a
function is edited the number can point at another change: the report compares the stored
change with the mutant's diff and calls a judgement that no longer matches STALE.

Untestable code is code no test on this machine can run (CUDA-only branches, ...): listed by
function name (globs allowed) with the reason; its mutants are reported apart. A single
mutant's name is accepted too, for a change only another device could see (a tensor made
on the default device instead of its input's, where this machine has one device).
"""

from __future__ import annotations

import fnmatch
import os
from contextlib import contextmanager
from dataclasses import dataclass
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
    change: str
    reason: str


@dataclass(frozen=True)
class Judgements:
    equivalent: dict[str, Equivalent]
    #: function-name glob (``libai.runtime.blocks.x_cuda_*``) -> reason
    untestable: dict[str, str]

    def untestable_reason(self, mutant_name: str) -> str | None:
        function = mutant_name.partition("__mutmut_")[0]
        for pattern, reason in self.untestable.items():
            if fnmatch.fnmatchcase(function, pattern) or pattern == mutant_name:
                return reason
        return None


def load_judgements(folder: Path = JUDGED_DIR) -> Judgements:
    """Every judgement of every ``*.toml`` file in ``folder``.

    A file holds ``[equivalent."<mutant name>"]`` tables (``change``: the mutant's
    ``- old | + new`` line as the report prints it; ``reason``: why no behaviour changes) and
    an ``[untestable]`` table of ``"<function name glob or mutant name>" = "<reason>"``.
    """
    equivalent: dict[str, Equivalent] = {}
    untestable: dict[str, str] = {}
    for path in sorted(folder.glob("*.toml")):
        table = tomllib.loads(path.read_text(encoding="utf-8"))
        for name, entry in table.get("equivalent", {}).items():
            if not entry.get("reason") or "change" not in entry:
                raise SystemExit(f"{path}: [equivalent.{name!r}] needs a change and a reason")
            equivalent[name] = Equivalent(change=entry["change"], reason=entry["reason"])
        untestable.update(table.get("untestable", {}))
    return Judgements(equivalent, untestable)


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
