"""pytest plugin of ``tools/mutation.sh`` (loaded with ``-p libai_mutation_plugin``).

Two things mutmut 3 does not do on its own, both only while it collects statistics
(``MUTANT_UNDER_TEST=stats``):

* **Subprocess calls count.** A folder is named in ``LIBAI_MUTATION_HITS_DIR`` for the
  subprocesses (see ``sitecustomize.py`` beside this file); before mutmut files the
  functions a test called, the names its subprocesses wrote are added, so a mutant in code
  that only runs in ``torchrun`` ranks is run against the distributed test that reaches it.
* **Shared fixtures count for every test that uses them.** A module fixture that launches
  ``torchrun`` once (or trains a model once) runs during the first test's setup, so mutmut
  would credit what it called to the first test alone, and a mutant that breaks what the
  second test checks would run against the first only. The calls made while a fixture of
  wider than function scope is set up are kept, and credited to each test that uses it.
* **Slow tests wait for a second round.** With ``LIBAI_MUTATION_FAST_SECONDS=T`` in the
  environment, a mutant's run (and the clean and forced-fail runs) leaves out the tests that
  took longer than ``T`` seconds when the statistics were collected (fixture time included):
  a first round kills what the fast tests kill, and ``tools/mutation.sh --slow`` runs the
  survivors again with every test. A mutant none of whose tests is fast ends with pytest's
  "no tests collected" (mutmut's ``no tests``), and waits for the second round as well.
* **A hung test ends as a timeout.** In a mutant's run each test gets 5x its profiled time
  plus 20 s; past that the run ends with mutmut's timeout code (36) and the processes the test
  started are killed. mutmut's own limit adds up every test of the function, fast round or
  not, so a mutant that hangs a collective would hold a worker for an hour.
* **Fixture time counts.** mutmut times only a test's call phase; a test whose module
  fixture trains a model would get a timeout a hundred times too short. Setup and teardown
  are added to the test's duration, and a shared fixture's setup time to each of its tests.
* **Tests marked ``not_under_mutation`` are left out** of every run of the tool: those that
  cannot hold under mutmut's trampolines whatever the mutant (torch.compile traces through
  them, so a test that counts compiled graphs sees twenty where it asserts one).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import tempfile
import time

import pytest

_STATS = os.environ.get("MUTANT_UNDER_TEST") == "stats"
#: mutmut's runs that list or profile tests: they must see every test
_PROFILING_MODES = ("stats", "list_all_tests", "mutant_generation")
#: mutmut's exit code for a timeout
TIMEOUT_EXIT = 36
_hits_dir: str | None = None
#: id(fixturedef) -> (functions called while it was set up, seconds it took)
_fixture_calls: dict[int, tuple[set[str], float]] = {}


def _mutmut_state():
    from mutmut.state import state

    return state()


def pytest_configure(config):
    global _hits_dir
    if _STATS:
        _hits_dir = tempfile.mkdtemp(prefix="libai-mutation-hits-")
        os.environ["LIBAI_MUTATION_HITS_DIR"] = _hits_dir


def pytest_unconfigure(config):
    global _hits_dir
    if _hits_dir is not None:
        os.environ.pop("LIBAI_MUTATION_HITS_DIR", None)
        shutil.rmtree(_hits_dir, ignore_errors=True)
        _hits_dir = None


def _subprocess_hits() -> set[str]:
    names: set[str] = set()
    for entry in os.scandir(_hits_dir):
        with open(entry.path, encoding="utf-8") as hits:
            names.update(line.strip() for line in hits if line.strip())
        os.unlink(entry.path)
    return names


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if not _STATS or fixturedef.scope == "function":
        yield
        return
    state = _mutmut_state()
    outer, state._stats = state._stats, set()  # the fixture's own calls, apart
    start = time.perf_counter()
    try:
        yield
    finally:
        calls = state._stats | _subprocess_hits()
        state._stats = outer | calls
        _fixture_calls[id(fixturedef)] = (calls, time.perf_counter() - start)


def _shared_fixture_calls(item) -> tuple[set[str], float]:
    calls: set[str] = set()
    seconds = 0.0
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        for fixturedef in defs:
            found = _fixture_calls.get(id(fixturedef))
            if found is not None:
                calls |= found[0]
                seconds += found[1]
    return calls, seconds


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    # tryfirst: before mutmut's own teardown hook files the calls of this test
    if _hits_dir is not None:
        state = _mutmut_state()
        state._stats.update(_subprocess_hits())
        calls, seconds = _shared_fixture_calls(item)
        state._stats.update(calls)
        state.duration_by_test[item.nodeid] += seconds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    if _STATS and call.when in ("setup", "teardown"):
        # shared fixtures are added to every test that uses them (teardown hook above)
        shared = _shared_fixture_calls(item)[1] if call.when == "setup" else 0.0
        _mutmut_state().duration_by_test[item.nodeid] += max(call.duration - shared, 0.0)


def pytest_collection_modifyitems(config, items):
    # tests that cannot hold under mutmut's trampolines (torch.compile traces through them:
    # a test that counts compiled graphs) are left out of every run of the tool (clean run,
    # profiling and mutants alike: the trampolines are there whichever mutant is on)
    left_out = [item for item in items if item.get_closest_marker("not_under_mutation")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
    limit = os.environ.get("LIBAI_MUTATION_FAST_SECONDS")
    if not limit or os.environ.get("MUTANT_UNDER_TEST") in _PROFILING_MODES:
        return
    durations = _durations()
    slow = [item for item in items if durations.get(item.nodeid, 0.0) > float(limit)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


@functools.cache
def _durations() -> dict[str, float]:
    with open("mutmut-stats.json", encoding="utf-8") as stats:  # mutmut runs tests in mutants/
        return json.load(stats)["duration_by_test"]


def _in_mutant_run() -> bool:
    mode = os.environ.get("MUTANT_UNDER_TEST", "")
    return "__mutmut_" in mode


def _kill_descendants() -> None:
    """SIGKILL every process started (directly or not) by this one: torchrun and its ranks."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    stack, found = [os.getpid()], []
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _timed_out(signum, frame):
    _kill_descendants()
    os._exit(TIMEOUT_EXIT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _in_mutant_run():
        yield
        return
    budget = 5.0 * _durations().get(item.nodeid, 0.0) + 20.0
    previous = signal.signal(signal.SIGALRM, _timed_out)
    signal.alarm(int(budget) + 1)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
