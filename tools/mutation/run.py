"""Mutation testing of one package (or file) of libai with mutmut 3.

    bash tools/mutation.sh libai/checkpoint                 # mutate, run, report
    bash tools/mutation.sh libai/checkpoint --retest-survivors   # after adding a test
    bash tools/mutation.sh libai/runtime/evaluate.py        # one file
    bash tools/mutation.sh libai/checkpoint --report        # the last results only
    bash tools/mutation.sh libai/checkpoint --show NAME     # one mutant's diff

Each target gets its own work folder ``.mutation/<target>/``: a generated ``pyproject.toml``
(this checkout's, plus a ``[tool.mutmut]`` section naming the target and its tests), links to
the checkout, and mutmut's ``mutants/`` copy with its cache. A second run re-tests only the
functions whose source changed and the tests that are new (mutmut's per-function hashes);
``--retest-survivors`` runs the survivors again, against the tests as they are now.

Which tests exercise a target is in ``tools/mutation/targets.toml`` (the mirrored
``tests/unit/<package>``, plus the door and distributed tests that reach it). The pytest
plugin and ``sitecustomize`` in ``tools/mutation/site`` make calls in the tests' subprocesses
(``torchrun`` ranks, ``tools/train_net.py``) count, so a mutant in code that only runs in a
worker is run against the distributed test that reaches it. Mutants judged equivalent, and
functions no CPU test can reach, are listed with their reasons in
``tools/mutation/judged/<package>.toml``; the report leaves them out of the kill rate and says so.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from judged import JUDGED_DIR, Judgements, cwd, load_judgements, mutant_change

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mutmut depends on `toml` there
    import toml as tomllib  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SITE = HERE / "site"
TARGETS_FILE = HERE / "targets.toml"
#: the work folders (override with LIBAI_MUTATION_WORK, e.g. a temporary folder in a test)
WORK_ROOT = Path(os.environ.get("LIBAI_MUTATION_WORK") or REPO / ".mutation")
MUTMUT_VERSION = "3.8.1"
#: bump when tools/mutation/site changes which tests are credited with a function
CREDITING_VERSION = 2

#: copied into the mutants/ folder beside libai/ and tests/ (mutmut copies those two): the
#: tests run tools/train_net.py, LiBai's configs and projects/ from the checkout's root
ALSO_COPY = ["configs", "projects", "tools", "benchmarks", "docs", "setup.py", "README.md"]

#: lines whose expressions are not mutated: the prose of raised errors, log lines and
#: warnings. The condition that raises or logs is mutated; the words are not behaviour the
#: tests pin (they check that an error names the key, with pytest.raises(match=...)).
DO_NOT_MUTATE_PATTERNS = [
    r"^\s*raise\s+[\w.]+\(",
    r"^\s*(self\.)?_?(logger|log)\.(debug|info|warning|warn|error|exception|critical)\(",
    r"^\s*warnings\.warn\(",
]

STATUS_BY_EXIT_CODE = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tools/mutation.sh",
        description="Mutation testing of one libai package or file (mutmut 3).",
    )
    parser.add_argument("target", help="libai/<package> or libai/<package>/<file>.py")
    parser.add_argument(
        "--tests",
        nargs="+",
        help="run these tests (paths or node ids) instead of the target's list in "
        "tools/mutation/targets.toml",
    )
    parser.add_argument(
        "--mutants",
        nargs="+",
        help="run only these mutants (names or globs, e.g. 'libai.checkpoint.files.*'), "
        "even when a result is cached",
    )
    parser.add_argument(
        "--retest-survivors",
        action="store_true",
        help="run the surviving and test-less mutants again (after adding a test)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="run (and report) only a fixed sample of N of the target's mutants, the same N "
        "every time (chosen by a hash of their names): a kill-rate estimate of a big package",
    )
    parser.add_argument(
        "--fast-seconds",
        type=float,
        metavar="T",
        help="two rounds: first the tests that took at most T seconds (overrides the target's "
        "fast_seconds in targets.toml)",
    )
    parser.add_argument(
        "--slow",
        action="store_true",
        help="two-round targets (fast_seconds in targets.toml): run the mutants the fast "
        "tests did not kill again, with every test",
    )
    parser.add_argument(
        "--reprofile",
        action="store_true",
        help="learn again which tests call which function (every test runs once; verdicts "
        "stay): after editing a script under tests/support that tests run",
    )
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report", action="store_true", help="report the cached results only")
    parser.add_argument("--show", metavar="MUTANT", help="print one mutant's diff and status")
    parser.add_argument(
        "--equivalent",
        nargs=2,
        metavar=("MUTANT", "REASON"),
        help="record MUTANT as equivalent (no observable behaviour changes), with its change "
        "and the one-line REASON, in tools/mutation/judged/<package>.toml",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the report as JSON (per-mutant statuses)"
    )
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Target:
    """What to mutate (``only_mutate`` globs) and which tests run against it."""

    path: str  # libai/checkpoint or libai/runtime/evaluate.py
    tests: list[str]
    #: first round: only the tests faster than this (seconds, fixtures included); the
    #: survivors get every test with --slow. None: every test in one round.
    fast_seconds: float | None = None

    @property
    def name(self) -> str:
        return self.path.removesuffix(".py").replace("/", ".")

    @property
    def module_prefix(self) -> str:
        """The dotted prefix of every mutant name of this target."""
        return self.name + "."

    @property
    def only_mutate(self) -> list[str]:
        return [self.path] if self.path.endswith(".py") else [self.path + "/*"]

    @property
    def workdir(self) -> Path:
        return WORK_ROOT / self.name


def resolve_target(path: str, tests: list[str] | None, fast_seconds: float | None = None) -> Target:
    path = path.rstrip("/")
    if path.startswith("./"):
        path = path[2:]
    if not (REPO / path).exists() or not path.startswith("libai/"):
        raise SystemExit(
            f"mutation target {path!r}: expected libai/<package> or libai/<package>/<file>.py "
            "of this checkout"
        )
    parts = path.split("/")
    if tests is None:
        table = tomllib.loads(TARGETS_FILE.read_text(encoding="utf-8"))
        entries = table.get("targets", {})
        # the most specific entry: the file, then its package
        for key in (path, "/".join(parts[:2])):
            if key in entries:
                tests = list(entries[key]["tests"])
                if fast_seconds is None:
                    fast_seconds = entries[key].get("fast_seconds")
                break
        else:
            raise SystemExit(
                f"no tests are listed for {path!r} in {TARGETS_FILE.relative_to(REPO)}: add a "
                f'[targets."{"/".join(parts[:2])}"] entry with tests = [...], or pass --tests'
            )
    missing = [t for t in tests if not (REPO / t.split("::")[0]).exists()]
    if missing:
        raise SystemExit(f"tests of {path!r} not found in this checkout: {missing}")
    return Target(path=path, tests=tests, fast_seconds=fast_seconds)


def toml_list(values: list[str]) -> str:
    return json.dumps(values)  # a JSON list of strings is a TOML array


def mutmut_section(target: Target) -> str:
    lines = [
        "",
        "# generated by tools/mutation/run.py for this target: do not edit",
        "[tool.mutmut]",
        f"source_paths = {toml_list(['libai'])}",
        f"only_mutate = {toml_list(target.only_mutate)}",
        f"pytest_add_cli_args_test_selection = {toml_list(target.tests)}",
        "pytest_add_cli_args = "
        + toml_list(["-p", "libai_mutation_plugin", "-p", "no:cacheprovider"]),
        f"also_copy = {toml_list(ALSO_COPY)}",
        f"do_not_mutate_patterns = {toml_list(DO_NOT_MUTATE_PATTERNS)}",
        # torch and fork: children fork from a server that only imported the tests
        'process_isolation = "forkserver"',
        # a test's fixtures (a torchrun launch, a trained model) count in its time; a mutant
        # gets 5x its tests' time plus 20 s (two children share two cores) before it is a
        # timeout: a mutant that hangs a collective costs minutes, not the 10 of a launch
        "timeout_multiplier = 5.0",
        "timeout_constant = 20.0",
        # the per-function hashes see the code; a changed data file is a warning only
        'on_dependency_change = "warn"',
        "",
    ]
    return "\n".join(lines)


def prepare_workdir(target: Target, report_only: bool = False) -> Path:
    """Links to the checkout, the generated pyproject.toml, and the links mutmut skips; the
    results dropped when the target's tests changed (unless only reporting them)."""
    work = target.workdir
    work.mkdir(parents=True, exist_ok=True)
    for name in ["libai", "tests", *ALSO_COPY]:
        link = work / name
        if not link.is_symlink():
            link.symlink_to(REPO / name)
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("pyproject.toml has a [tool.mutmut] section: tools/mutation owns it")
    generated = pyproject + mutmut_section(target)
    path = work / "pyproject.toml"
    if not path.exists() or path.read_text(encoding="utf-8") != generated:
        path.write_text(generated, encoding="utf-8")
    # results depend on how tests are credited with the functions they call (the plugin and
    # sitecustomize): when that changes, CREDITING_VERSION goes up and caches start again
    stamp = work / "crediting.version"
    if stamp.exists() and stamp.read_text().strip() != str(CREDITING_VERSION):
        print(f"tests are credited differently now: the results of {target.path} are dropped")
        shutil.rmtree(work / "mutants", ignore_errors=True)
    stamp.write_text(f"{CREDITING_VERSION}\n")
    # a verdict holds for the tests it ran against: a target whose list of tests changed
    # (targets.toml or --tests) starts again, or "no tests" and "survived" would stand
    listed = work / "tests.list"
    tests = "\n".join(target.tests) + "\n"
    if listed.exists() and listed.read_text(encoding="utf-8") != tests:
        if report_only:
            print(f"the tests of {target.path} changed since these results (a run drops them)")
        else:
            print(f"the tests of {target.path} changed: its results are dropped")
            shutil.rmtree(work / "mutants", ignore_errors=True)
    if not report_only or not listed.exists():
        listed.write_text(tests, encoding="utf-8")
    # os.walk does not follow links, so mutmut does not copy libai/config/configs (a link
    # to ../../configs): make the same link in the copy
    configs = work / "mutants" / "libai" / "config" / "configs"
    configs.parent.mkdir(parents=True, exist_ok=True)
    if not configs.is_symlink():
        configs.symlink_to(Path("..") / ".." / "configs")
    return work


def mutmut_env(work: Path) -> dict[str, str]:
    """The environment of mutmut and of every process a test starts: the mutated copy of
    libai first on the path (not the editable install), the site folder of this tool, and one
    OpenMP thread per process (torch and fork; two children share two cores)."""
    path = [str(work / "mutants"), str(SITE), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def check_mutmut() -> None:
    try:
        from importlib.metadata import version

        found = version("mutmut")
    except Exception:
        found = None
    if found != MUTMUT_VERSION:
        raise SystemExit(
            f"tools/mutation.sh needs mutmut=={MUTMUT_VERSION} (found {found}): "
            'pip install -e ".[test]"'
        )


def mutmut(work: Path, *args: str, fast_seconds: float | None = None) -> int:
    cmd = [sys.executable, "-c", "from mutmut.__main__ import cli; cli()", *args]
    env = mutmut_env(work)
    if fast_seconds is not None:
        env["LIBAI_MUTATION_FAST_SECONDS"] = str(fast_seconds)
    try:
        return subprocess.call(cmd, cwd=work, env=env)
    finally:
        # only after a run: `show` starts no fork server, and a run going on is left alone
        reaped = reap_strays(work) if args[0] == "run" else 0
        if reaped:
            print(f"killed {reaped} mutant processes left running by mutmut's fork server")


def reap_strays(work: Path) -> int:
    """SIGKILL the processes of this target's mutmut runs (mutmut's command line, working in
    its copy) still alive after mutmut returned: with two children, a mutant's process
    forked from the fork server (torch loaded) now and then hangs on a lock and is orphaned
    when the server exits, 200+ MB each, for good. Two runs of one target at once share
    one cache and are not supported anyway."""
    root = (work / "mutants").resolve()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            cwd_path = Path(os.readlink(f"/proc/{entry}/cwd"))
        except OSError:
            continue
        if b"mutmut.__main__" not in cmdline:
            continue
        if cwd_path != root and root not in cwd_path.parents:
            continue
        try:
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


# ------------------------------------------------------ the round with every test

NOT_KILLED = ("survived", "no tests", "suspicious", "segfault")


def function_hashes(work: Path) -> dict[str, str]:
    """mutmut's hash of every mutated function (from its meta files): ``module.x_f`` -> hash."""
    hashes = {}
    for meta in (work / "mutants").rglob("*.py.meta"):
        data = json.loads(meta.read_text(encoding="utf-8"))
        module = str(meta.relative_to(work / "mutants"))[: -len(".py.meta")].replace("/", ".")
        module = module.removesuffix(".__init__")
        for function, digest in data.get("hash_by_function_name", {}).items():
            hashes[f"{module}.{function}"] = digest
    return hashes


def functions_with_fast_tests(work: Path, seconds: float) -> set[str] | None:
    """The functions some test faster than ``seconds`` calls; None before the first run."""
    stats_path = work / "mutants" / "mutmut-stats.json"
    if not stats_path.exists():
        return None
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    durations = stats["duration_by_test"]
    return {
        function
        for function, tests in stats["tests_by_mangled_function_name"].items()
        if any(durations.get(t, 0.0) <= seconds for t in tests)
    }


class AllTestsRounds:
    """Which verdicts of a two-round target came from a run with every test: a mutant's name
    with the hash its function had then (an edited function's verdict is a fast one again)."""

    def __init__(self, work: Path):
        self.path = work / "all-tests-verdicts.json"
        self.done: dict[str, str] = (
            json.loads(self.path.read_text(encoding="utf-8")) if self.path.exists() else {}
        )

    def confirmed(self, names: list[str], hashes: dict[str, str]) -> set[str]:
        return {
            n
            for n in names
            if n in self.done and self.done[n] == hashes.get(n.partition("__mutmut_")[0])
        }

    def record(self, names: list[str], hashes: dict[str, str]) -> None:
        for n in names:
            self.done[n] = hashes.get(n.partition("__mutmut_")[0], "")
        self.path.write_text(json.dumps(self.done, indent=0), encoding="utf-8")


# ---------------------------------------------------------------- results


@dataclass
class Results:
    """Every mutant of a target with its status, and the judgements that apply."""

    target: Target
    status: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    #: with --sample: how many mutants the target has in all (the status holds the sample)
    sampled_from: int | None = None
    #: two-round targets: the not-killed mutants whose verdict is from the fast tests only
    fast_only: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, target: Target) -> Results:
        results = cls(target)
        meta_root = target.workdir / "mutants"
        base = meta_root / target.path
        metas = [Path(str(base) + ".meta")] if target.path.endswith(".py") else base.rglob("*.meta")
        for meta in sorted(metas):
            if not meta.exists():
                continue
            data = json.loads(meta.read_text(encoding="utf-8"))
            for name, code in data.get("exit_code_by_key", {}).items():
                results.status[name] = STATUS_BY_EXIT_CODE.get(code, "suspicious")
                results.durations[name] = data.get("durations_by_key", {}).get(name, 0.0)
        return results

    def names(self, *statuses: str) -> list[str]:
        return sorted(n for n, s in self.status.items() if s in statuses)


def source_of(target: Target, name: str) -> Path:
    module = name.rsplit(".", 1)[0]
    return target.workdir / "mutants" / (module.replace(".", "/") + ".py")


def summarize(results: Results, judgements: Judgements) -> dict:
    """Counts and the kill rate; judged mutants are counted apart, and checked to be current."""
    counts: dict[str, int] = {}
    for status in results.status.values():
        counts[status] = counts.get(status, 0) + 1
    equivalent, untestable, stale = [], [], []
    not_killed = results.names("survived", "no tests", "suspicious", "segfault")
    unexplained = []
    for name in not_killed:
        judged, verdict = judgements.equivalent.get(name), equivalent
        if judged is None:
            judged, verdict = judgements.untestable_mutants.get(name), untestable
        if judged is not None:
            if judged.change != mutant_change(results.target.workdir, name):
                stale.append(name)
                unexplained.append(name)
            else:
                verdict.append(name)
            continue
        reason = judgements.untestable_reason(name)
        if reason is not None:
            untestable.append(name)
            continue
        unexplained.append(name)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    scored = killed + len(unexplained)
    fast_only = sorted(n for n in unexplained if n in results.fast_only)
    return {
        "target": results.target.path,
        "total": len(results.status),
        "counts": counts,
        "killed": killed,
        "equivalent": equivalent,
        "untestable": untestable,
        "stale_judgements": stale,
        "not_killed": unexplained,
        "not_checked": results.names("not checked", "skipped"),
        "fast_tests_only": fast_only,
        "kill_rate": (killed / scored) if scored else None,
    }


def print_report(summary: dict, results: Results, judgements: Judgements) -> None:
    counts = summary["counts"]
    rate = summary["kill_rate"]
    print()
    of = f" sampled from {results.sampled_from}" if results.sampled_from else ""
    print(f"mutation report: {summary['target']}  ({summary['total']} mutants{of})")
    print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(
        f"  killed (timeouts included): {summary['killed']}   "
        f"equivalent (judged): {len(summary['equivalent'])}   "
        f"untestable here (judged): {len(summary['untestable'])}   "
        f"not killed: {len(summary['not_killed'])}"
    )
    if rate is not None:
        print(f"  kill rate of non-equivalent mutants: {100 * rate:.1f} %")
    for name in summary["stale_judgements"]:
        print(f"  STALE judgement (the mutant changed; judge it again): {name}")
    if summary["not_checked"]:
        print(f"  {len(summary['not_checked'])} mutants not checked yet (run again)")
    if summary["fast_tests_only"]:
        print(
            f"  {len(summary['fast_tests_only'])} of the not killed ran against the fast tests "
            "only (marked *): --slow runs them with every test"
        )
    if summary["not_killed"]:
        print("  not killed:")
        fast = set(summary["fast_tests_only"])
        for name in summary["not_killed"]:
            mark = "*" if name in fast else " "
            print(f"   {mark}{results.status[name]:>9}  {name}")
        print("  see one with: bash tools/mutation.sh TARGET --show NAME")


def show(target: Target, name: str) -> None:
    work = target.workdir
    mutmut(work, "show", name)
    print(f"change: {mutant_change(work, name)}")
    judged = load_judgements().equivalent.get(name)
    if judged is not None:
        print(f"judged equivalent: {judged.reason}")


def record_equivalent(target: Target, name: str, reason: str) -> None:
    """Append ``[equivalent."<name>"]`` with the mutant's current change to its package's file."""
    change = mutant_change(target.workdir, name)
    if not change:
        raise SystemExit(f"no mutant {name!r} in {target.workdir} (run the target first)")
    if not name.startswith(target.module_prefix) and not name.startswith(target.name + "."):
        raise SystemExit(f"{name!r} is not a mutant of {target.path}")
    package = name.split(".")[1]
    path = JUDGED_DIR / f"{package}.toml"
    if name in load_judgements().equivalent:
        raise SystemExit(f"{name!r} is already judged (edit {path.relative_to(REPO)})")
    entry = (
        f"\n[equivalent.{json.dumps(name, ensure_ascii=False)}]\n"
        f"change = {json.dumps(change, ensure_ascii=False)}\n"
        f"reason = {json.dumps(reason, ensure_ascii=False)}\n"
    )
    with open(path, "a", encoding="utf-8") as out:
        out.write(entry)
    print(f"recorded in {path.relative_to(REPO)}: {name}\n  {change}\n  {reason}")


def all_mutant_names(target: Target, work: Path) -> list[str]:
    """Every mutant mutmut makes of the target, by name (mutmut's own generator, cached per
    file content in the work folder), without running anything."""
    from mutmut.configuration import reset_config
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    cache_path = work / "mutant-names.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    base = REPO / target.path
    files = [base] if base.is_file() else sorted(base.rglob("*.py"))
    names: list[str] = []
    with cwd(work):
        reset_config()
        try:
            for path in files:
                rel = path.relative_to(REPO)
                source = path.read_text(encoding="utf-8")
                digest = hashlib.sha256(source.encode()).hexdigest()
                cached = cache.get(str(rel))
                if cached is None or cached[0] != digest:
                    mutated = mutate_file_contents(str(rel), source)
                    cached = [digest, [get_mutant_name(rel, m) for m in mutated.mutant_names]]
                    cache[str(rel)] = cached
                names += cached[1]
        finally:
            reset_config()
    cache_path.write_text(json.dumps(cache), encoding="utf-8")
    return names


def sample_of(names: list[str], size: int) -> list[str]:
    """The same ``size`` names every time: the first by a hash of the name."""
    return sorted(names, key=lambda n: hashlib.sha1(n.encode()).hexdigest())[:size]


def test_files(target: Target) -> list[Path]:
    """The test files of a target's list (a folder's ``test_*.py``, a file, a node id's file)."""
    files: set[Path] = set()
    for entry in target.tests:
        path = REPO / entry.partition("::")[0]
        if path.is_dir():
            files.update(path.rglob("test_*.py"))
        elif path.is_file():
            files.add(path)
    return sorted(files)


def forget_edited_tests(target: Target, work: Path) -> None:
    """mutmut profiles a test once, by name: a test whose file was edited since would keep the
    functions it called then. Drop the tests of edited files from mutmut's stats, so that the
    next run profiles them again as new tests."""
    hashes_path = work / "test-file-hashes.json"
    stats_path = work / "mutants" / "mutmut-stats.json"
    now = {
        str(f.relative_to(REPO)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in test_files(target)
    }
    before = json.loads(hashes_path.read_text()) if hashes_path.exists() else None
    if before is not None and stats_path.exists():
        edited = {f for f, digest in now.items() if before.get(f) not in (None, digest)}
        if edited:
            stats = json.loads(stats_path.read_text(encoding="utf-8"))

            def kept(test: str) -> bool:
                return test.partition("::")[0] not in edited

            stats["duration_by_test"] = {
                t: d for t, d in stats["duration_by_test"].items() if kept(t)
            }
            stats["tests_by_mangled_function_name"] = {
                f: [t for t in tests if kept(t)]
                for f, tests in stats["tests_by_mangled_function_name"].items()
            }
            stats_path.write_text(json.dumps(stats), encoding="utf-8")
            print(f"edited since profiled, profiled again: {', '.join(sorted(edited))}")
    hashes_path.write_text(json.dumps(now, indent=0), encoding="utf-8")


def no_tests_with_tests_now(target: Target, work: Path) -> list[str]:
    """Mutants whose verdict is "no tests" while a test calls their function now (a test added
    or edited after that verdict): mutmut lets a verdict stand, so they are named again."""
    stats_path = work / "mutants" / "mutmut-stats.json"
    if not stats_path.exists():
        return []
    called = {
        f
        for f, tests in json.loads(stats_path.read_text(encoding="utf-8"))[
            "tests_by_mangled_function_name"
        ].items()
        if tests
    }
    return [
        n
        for n in Results.load(target).names("no tests")
        if n.partition("__mutmut_")[0].replace("__init__.", "") in called
    ]


def _named(name: str, patterns) -> bool:
    """Whether ``name`` matches one of ``patterns`` (mutant names or globs)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def unprofiled_test_files(target: Target, work: Path) -> list[str]:
    """The test files of the target's list none of whose tests mutmut has profiled yet (new
    files: the next mutmut run profiles them before it runs any mutant)."""
    stats_path = work / "mutants" / "mutmut-stats.json"
    if not stats_path.exists():
        return []
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    profiled = {test.partition("::")[0] for test in stats["duration_by_test"]}
    files = (str(f.relative_to(REPO)) for f in test_files(target))
    return [f for f in files if f not in profiled]


def run_round(target: Target, work: Path, args, sample, rounds: AllTestsRounds) -> int:
    """One mutmut run: the asked-for mutants (all without a result, by default), against
    the fast tests (a two-round target) or every test (--slow, or a one-round target)."""
    previous = Results.load(target)
    names: list[str] = list(args.mutants or [])
    # what new test files call is known after mutmut profiled them, in this run
    new_files = unprofiled_test_files(target, work)
    if new_files:
        print(f"new test files, profiled in this run: {', '.join(new_files)}")
    if args.slow:
        if target.fast_seconds is None:
            raise SystemExit(f"{target.path} has one round (no fast_seconds in targets.toml)")
        not_killed = previous.names(*NOT_KILLED)
        # a verdict with every test stands until a test file is added
        confirmed = set() if new_files else rounds.confirmed(not_killed, function_hashes(work))
        names += [n for n in not_killed if n not in confirmed]
        # and those the fast round left unchecked (no fast test calls their function), of the
        # asked-for ones when mutants are named
        unchecked = previous.names("not checked")
        names += [n for n in unchecked if _named(n, args.mutants)] if args.mutants else unchecked
    elif args.retest_survivors:
        names += previous.names(*NOT_KILLED, "timeout")
    elif sample is not None and not args.mutants:
        # the sample's mutants without a result yet (a cached result stands)
        names += [n for n in sample if previous.status.get(n, "not checked") == "not checked"]
    names = list(dict.fromkeys(names))  # a named mutant may also be a survivor
    if sample is not None and (args.slow or args.retest_survivors):
        names = [n for n in names if n in set(sample)]
    if (args.slow or args.retest_survivors or sample is not None) and not names:
        print("no mutants to run: every one asked for has a result")
        return 0
    all_tests = args.slow or target.fast_seconds is None
    fast = None if all_tests else target.fast_seconds
    runnable = functions_with_fast_tests(work, fast) if fast is not None else None
    if runnable is not None and names and not new_files:
        # a run of named mutants none of whose tests is fast would end in an empty clean run
        names = [n for n in names if "*" in n or n.partition("__mutmut_")[0] in runnable]
        if not names:
            print("no mutants to run with the fast tests: use --slow")
            return 0
    code = mutmut(work, "run", "--max-children", str(args.max_children), *names, fast_seconds=fast)
    # read again: the run just profiled the new tests
    runnable = functions_with_fast_tests(work, fast) if fast is not None else None
    again = [
        n
        for n in ([] if args.mutants else no_tests_with_tests_now(target, work))
        if (sample is None or n in sample)
        and (runnable is None or n.partition("__mutmut_")[0] in runnable)
    ]
    if code == 0 and again:
        print(f"{len(again)} mutants had no tests and have tests now: running them")
        code = mutmut(
            work, "run", "--max-children", str(args.max_children), *again, fast_seconds=fast
        )
        names += again
    if code == 0 and args.max_children > 1:
        code = rerun_signalled(target, work, names, sample, fast)
    if code == 0 and all_tests and target.fast_seconds is not None:
        rounds.record(names, function_hashes(work))
    return code


def rerun_signalled(target: Target, work: Path, names, sample, fast) -> int:
    """Run again, one at a time, the mutants whose process died of a signal from outside
    its tests (exit -9 or -11, mutmut's "segfault"). With two children, a mutant's process
    (forked from a fork server that has torch, tokenizers and sentencepiece loaded) is now
    and then killed within a second whatever its mutant does: of 154 such verdicts in
    libai/tokenizer, none came back with one child. A verdict that comes back stands."""
    signalled = [
        n
        for n in Results.load(target).names("segfault")
        if (sample is None or n in sample) and (not names or _named(n, names))
    ]
    if not signalled:
        return 0
    print(f"{len(signalled)} mutants died of a signal: running them again with one child")
    return mutmut(work, "run", "--max-children", "1", *signalled, fast_seconds=fast)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_mutmut()
    target = resolve_target(args.target, args.tests, args.fast_seconds)
    if args.show:
        show(target, args.show)
        return 0
    if args.equivalent:
        record_equivalent(target, *args.equivalent)
        return 0
    work = prepare_workdir(target, report_only=args.report)
    sample = sample_of(all_mutant_names(target, work), args.sample) if args.sample else None
    rounds = AllTestsRounds(work)
    if not args.report:
        if args.reprofile:
            (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        forget_edited_tests(target, work)
        code = run_round(target, work, args, sample, rounds)
        if code != 0:
            print(f"mutmut run exited with {code}", file=sys.stderr)
            return code
    results = Results.load(target)
    if target.fast_seconds is not None:
        not_killed = results.names(*NOT_KILLED)
        results.fast_only = set(not_killed) - rounds.confirmed(not_killed, function_hashes(work))
    if sample is not None:
        kept = set(sample)
        results.status = {n: s for n, s in results.status.items() if n in kept}
        results.sampled_from = len(all_mutant_names(target, work))
    judgements = load_judgements()
    summary = summarize(results, judgements)
    print_report(summary, results, judgements)
    if args.json:
        summary["status"] = results.status
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
