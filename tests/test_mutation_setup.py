"""The mutation-testing setup itself (``tools/mutation.sh``), on a fixed sample of mutants.

Running mutation testing on a package takes tens of minutes (docs/testing.md, "Mutation
testing"); this runs three mutants of ``libai/evaluation/utils.py`` through the real tool
(mutmut, the pytest plugin, the subprocess recorder) in about a minute, so a change that
breaks the setup shows here:

* a mutant only a ``torchrun`` rank executes (the module's fixture launches the ranks):
  killed only if calls in subprocesses count; and what the fixture called is credited to
  every test of the module, not only to the first;
* a mutant killed in-process;
* two rounds (``--fast-seconds``, then ``--slow``): the slow torchrun tests are left out of
  the first round and run in the second for the mutants the fast tests did not kill;
* a mutant no test on a CPU can tell apart (``.to(None)`` is a no-op where every tensor is on
  the CPU): it must be reported as surviving, never as killed; and a judgement of it is
  honoured while its change matches and called stale when it does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "mutation"
TARGET = "libai/evaluation/utils.py"
DIST_MODULE = "tests/distributed/test_evaluation_dist.py"
#: the 2-rank tests of the module (one launch, shared by a module fixture) and a unit test
DIST_TESTS = [
    f"{DIST_MODULE}::{name}"
    for name in (
        "test_dp_sums_tokens_and_correct_counts",
        "test_tp_peers_are_not_summed",
        "test_pp_last_stage_results_reach_every_rank",
        "test_json_writer_writes_on_rank0_only",
    )
]
TESTS = [*DIST_TESTS, "tests/unit/evaluation/test_evaluation.py::test_flatten_and_csv"]

REDUCE = "libai.evaluation.utils.x_all_reduce_over_data_parallel"
EXPECTED = {
    # if group is not None: -> if group is None: nothing is reduced over dp2
    f"{REDUCE}__mutmut_10": "killed",
    # flat = {} -> flat = None
    "libai.evaluation.utils.x_flatten_results_dict__mutmut_1": "killed",
    # values.to(util.device) -> values.to(None): the same on a CPU
    f"{REDUCE}__mutmut_9": "survived",
}
SURVIVOR_CHANGE = "- reduced = values.to(util.device) | + reduced = values.to(None)"


def _tool(tmp_path, *args) -> dict:
    """Run tools/mutation/run.py on the target with the sample's tests; its JSON report."""
    judged = tmp_path / "no_judgements"  # the verdicts here, not the repository's judgements
    judged.mkdir(exist_ok=True)
    env = {**os.environ, "LIBAI_MUTATION_WORK": str(tmp_path), "LIBAI_MUTATION_JUDGED": str(judged)}
    report_path = tmp_path / "report.json"
    cmd = [sys.executable, str(TOOL / "run.py"), TARGET, "--tests", *TESTS, *args]
    cmd += ["--max-children", "2", "--json", str(report_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(report_path.read_text())


def test_a_fixed_sample_of_mutants_gets_its_known_verdicts(tmp_path, monkeypatch):
    # first round: only the tests that took at most a second (the unit test); the two
    # mutants only the torchrun module reaches have no test yet and wait for --slow
    first = _tool(tmp_path, "--fast-seconds", "1", "--mutants", *EXPECTED)
    waiting = sorted([f"{REDUCE}__mutmut_10", f"{REDUCE}__mutmut_9"])
    assert {name: first["status"][name] for name in waiting} == dict.fromkeys(waiting, "no tests")
    assert first["fast_tests_only"] == waiting
    # second round: those two against every test
    report = _tool(tmp_path, "--fast-seconds", "1", "--slow", "--mutants", *EXPECTED)
    assert {name: report["status"][name] for name in EXPECTED} == EXPECTED
    assert report["fast_tests_only"] == []

    work = tmp_path / "libai.evaluation.utils"
    stats = json.loads((work / "mutants" / "mutmut-stats.json").read_text())
    credited = stats["tests_by_mangled_function_name"][REDUCE]
    # called only inside the torchrun ranks, and credited to every test of the module
    assert set(credited) == set(DIST_TESTS)

    # the report's judgements: a matching change is equivalent, a different one is stale
    monkeypatch.syspath_prepend(str(TOOL))
    import judged
    import run

    monkeypatch.setattr(run, "WORK_ROOT", tmp_path)
    target = run.resolve_target(TARGET, TESTS)
    results = run.Results.load(target)
    survivor = f"{REDUCE}__mutmut_9"
    assert judged.mutant_change(work, survivor) == SURVIVOR_CHANGE
    for change, verdict in ((SURVIVOR_CHANGE, "equivalent"), ("- x | + y", "stale_judgements")):
        judgements = judged.Judgements({survivor: judged.Equivalent(change, "why")}, {})
        summary = run.summarize(results, judgements)
        assert survivor in summary[verdict]
    untestable = judged.Judgements({}, {REDUCE: "needs a GPU"})
    assert survivor in run.summarize(results, untestable)["untestable"]
    # one mutant judged untestable: by its change, stale like an equivalent one
    for change, verdict in ((SURVIVOR_CHANGE, "untestable"), ("- x | + y", "stale_judgements")):
        one = judged.Judgements({}, {}, {survivor: judged.Equivalent(change, "a 2nd device")})
        assert survivor in run.summarize(results, one)[verdict]


def test_edited_tests_are_profiled_again_and_no_tests_verdicts_rerun(tmp_path, monkeypatch):
    """mutmut profiles a test once by name and lets every verdict stand: the tool drops the
    tests of an edited file from mutmut's stats (profiled again as new tests), names again
    the "no tests" mutants whose function a test calls now, and knows the test files not
    profiled yet (their mutants' fast tests are known only after the run profiled them)."""
    monkeypatch.syspath_prepend(str(TOOL))
    import run

    repo = tmp_path / "repo"
    (repo / "tests" / "unit").mkdir(parents=True)
    edited, kept = repo / "tests" / "unit" / "test_a.py", repo / "tests" / "unit" / "test_b.py"
    edited.write_text("def test_one(): pass\n")
    kept.write_text("def test_two(): pass\n")
    monkeypatch.setattr(run, "REPO", repo)
    monkeypatch.setattr(run, "WORK_ROOT", tmp_path / "work")
    target = run.Target("libai/pkg", ["tests/unit"])
    work = target.workdir
    (work / "mutants" / "libai" / "pkg").mkdir(parents=True)
    one, two = "tests/unit/test_a.py::test_one", "tests/unit/test_b.py::test_two"
    stats = {
        "tests_by_mangled_function_name": {"libai.pkg.x_f": [one, two], "libai.pkg.x_g": [one]},
        "duration_by_test": {one: 0.5, two: 0.25},
    }
    stats_path = work / "mutants" / "mutmut-stats.json"
    stats_path.write_text(json.dumps(stats))

    run.forget_edited_tests(target, work)  # the first run only records the files
    assert json.loads(stats_path.read_text()) == stats
    edited.write_text("def test_one(): assert 1\n")
    run.forget_edited_tests(target, work)
    after = json.loads(stats_path.read_text())
    assert after["duration_by_test"] == {two: 0.25}
    assert after["tests_by_mangled_function_name"] == {"libai.pkg.x_f": [two], "libai.pkg.x_g": []}
    run.forget_edited_tests(target, work)  # nothing edited since: nothing dropped
    assert json.loads(stats_path.read_text()) == after

    meta = {
        "exit_code_by_key": {
            "libai.pkg.x_f__mutmut_1": 33,  # no tests then; test_two calls f now
            "libai.pkg.x_g__mutmut_1": 33,  # no tests then and now
            "libai.pkg.x_f__mutmut_2": 0,  # survived: stands
        }
    }
    (work / "mutants" / "libai" / "pkg" / "__init__.py.meta").write_text(json.dumps(meta))
    assert run.no_tests_with_tests_now(target, work) == ["libai.pkg.x_f__mutmut_1"]

    # a new test file is profiled by the next run: until then its calls are unknown
    assert run.unprofiled_test_files(target, work) == ["tests/unit/test_a.py"]
    (repo / "tests" / "unit" / "test_c.py").write_text("def test_three(): pass\n")
    after["duration_by_test"][one] = 0.5
    stats_path.write_text(json.dumps(after))
    assert run.unprofiled_test_files(target, work) == ["tests/unit/test_c.py"]


def _pkg_target(tmp_path, monkeypatch, exit_codes: dict[str, int]):
    """A target ``libai/pkg`` whose cached verdicts are ``exit_codes`` (mutmut's meta file)."""
    monkeypatch.syspath_prepend(str(TOOL))
    import run

    monkeypatch.setattr(run, "WORK_ROOT", tmp_path / "work")
    target = run.Target("libai/pkg", ["tests/unit"])
    pkg = target.workdir / "mutants" / "libai" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py.meta").write_text(json.dumps({"exit_code_by_key": exit_codes}))
    return run, target


def test_mutants_killed_by_a_signal_run_again_with_one_child(tmp_path, monkeypatch):
    """A verdict of -9 / -11 (mutmut's "segfault": the process died of a signal, not of a
    failed test) under two children is run again with one child, for the mutants the run
    asked for (names or globs, or all when none), and within the sample."""
    codes = {
        "libai.pkg.x_f__mutmut_1": -9,
        "libai.pkg.x_f__mutmut_2": -11,
        "libai.pkg.x_g__mutmut_1": -9,
        "libai.pkg.x_g__mutmut_2": 0,  # survived: not run again
        "libai.pkg.x_g__mutmut_3": 1,  # killed: not run again
    }
    run, target = _pkg_target(tmp_path, monkeypatch, codes)
    calls = []
    monkeypatch.setattr(
        run, "mutmut", lambda work, *args, fast_seconds=None: calls.append(args) or 0
    )

    def rerun(names, sample=None):
        calls.clear()
        assert run.rerun_signalled(target, target.workdir, names, sample, None) == 0
        return [list(c) for c in calls]

    f1, f2, g1 = "libai.pkg.x_f__mutmut_1", "libai.pkg.x_f__mutmut_2", "libai.pkg.x_g__mutmut_1"
    assert rerun([]) == [["run", "--max-children", "1", f1, f2, g1]]
    assert rerun(["libai.pkg.x_f__*"]) == [["run", "--max-children", "1", f1, f2]]
    assert rerun([g1, "libai.pkg.x_g__mutmut_2"]) == [["run", "--max-children", "1", g1]]
    assert rerun([], sample=[f2, "libai.pkg.x_g__mutmut_3"]) == [["run", "--max-children", "1", f2]]
    assert rerun(["libai.pkg.x_g__mutmut_3"]) == []


def test_processes_left_by_a_target_run_are_killed_and_no_others(tmp_path, monkeypatch):
    """Processes with mutmut's command line working in the target's copy are killed after the
    run; one working elsewhere, one in the copy without mutmut's command line, and those of a
    run going on while ``--show`` reads a mutant, live on."""
    run, target = _pkg_target(tmp_path, monkeypatch, {})
    copy = target.workdir / "mutants"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sleeper = "import time; time.sleep(120)  # from mutmut.__main__ import cli"
    plain = "import time; time.sleep(120)"
    procs = {
        "stray": subprocess.Popen([sys.executable, "-c", sleeper], cwd=copy / "libai"),
        "elsewhere": subprocess.Popen([sys.executable, "-c", sleeper], cwd=elsewhere),
        "not mutmut": subprocess.Popen([sys.executable, "-c", plain], cwd=copy),
    }
    try:
        assert run.reap_strays(target.workdir) == 1
        assert procs["stray"].wait(timeout=30) == -9
        assert procs["elsewhere"].poll() is None and procs["not mutmut"].poll() is None
        # a --show while a run goes on: the run's processes live on
        procs["a run's"] = subprocess.Popen([sys.executable, "-c", sleeper], cwd=copy)
        run.mutmut(target.workdir, "show", "libai.pkg.x_f__mutmut_1")
        with pytest.raises(subprocess.TimeoutExpired):  # a killed one would end at once
            procs["a run's"].wait(timeout=2)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_a_changed_list_of_tests_drops_the_results_but_a_report_keeps_them(tmp_path, monkeypatch):
    """Verdicts hold for the tests they ran against: when a target's tests change, a run
    starts again (a "no tests" or "survived" would stand otherwise); a report only says so."""
    run, target = _pkg_target(tmp_path, monkeypatch, {"libai.pkg.x_f__mutmut_1": 0})
    monkeypatch.setattr(run, "REPO", ROOT)
    meta = target.workdir / "mutants" / "libai" / "pkg" / "__init__.py.meta"
    run.prepare_workdir(target)  # the first run records the list
    assert meta.exists()
    run.prepare_workdir(run.Target("libai/pkg", ["tests/unit"]))  # the same list: kept
    assert meta.exists()
    changed = run.Target("libai/pkg", ["tests/unit", "tests/distributed"])
    run.prepare_workdir(changed, report_only=True)
    assert meta.exists()
    run.prepare_workdir(changed)
    assert not meta.exists()
    assert (target.workdir / "tests.list").read_text() == "tests/unit\ntests/distributed\n"


def test_tests_marked_not_under_mutation_are_left_out_of_the_tools_runs(tmp_path):
    """The plugin deselects ``not_under_mutation`` tests; without it both tests run."""
    (tmp_path / "test_two.py").write_text(
        "import pytest\n\n"
        "def test_kept():\n    pass\n\n"
        "@pytest.mark.not_under_mutation(reason='counts compiled graphs')\n"
        "def test_left_out():\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOOL / "site"), str(ROOT)])}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN", "-W", "ignore"]

    def passed(*plugin) -> str:
        proc = subprocess.run(
            [*base, *plugin, str(tmp_path / "test_two.py")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout.strip().splitlines()[-1]

    assert passed("-p", "libai_mutation_plugin").startswith("1 passed, 1 deselected")
    assert passed().startswith("2 passed")


def test_the_slow_round_runs_the_unconfirmed_not_killed_and_the_unchecked(tmp_path, monkeypatch):
    """``--slow`` runs, with every test, the not-killed mutants whose verdict came from the
    fast tests only and those the fast round never ran (no fast test calls their function);
    a verdict of a run with every test stands, unless a test file was added since."""
    codes = {
        "libai.pkg.x_f__mutmut_1": 0,  # survived the fast tests
        "libai.pkg.x_f__mutmut_2": 0,  # survived every test: confirmed
        "libai.pkg.x_g__mutmut_1": None,  # never run: no fast test calls g
        "libai.pkg.x_g__mutmut_2": 1,  # killed
    }
    run, target = _pkg_target(tmp_path, monkeypatch, codes)
    target = run.Target(target.path, target.tests, fast_seconds=1.0)
    work = target.workdir
    calls = []
    monkeypatch.setattr(
        run, "mutmut", lambda work, *args, fast_seconds=None: calls.append(args) or 0
    )
    monkeypatch.setattr(run, "function_hashes", lambda work: {"libai.pkg.x_f": "h"})
    rounds = run.AllTestsRounds(work)
    rounds.record(["libai.pkg.x_f__mutmut_2"], {"libai.pkg.x_f": "h"})
    args = run.parse_args(["libai/pkg", "--slow", "--max-children", "1"])
    assert run.run_round(target, work, args, None, rounds) == 0
    assert calls[0] == (
        "run",
        "--max-children",
        "1",
        "libai.pkg.x_f__mutmut_1",
        "libai.pkg.x_g__mutmut_1",
    )
    # a sample limits the round to its mutants
    calls.clear()
    assert run.run_round(target, work, args, ["libai.pkg.x_g__mutmut_1"], rounds) == 0
    assert calls[0] == ("run", "--max-children", "1", "libai.pkg.x_g__mutmut_1")
    # named mutants: the unchecked ones among them only, each name once
    calls.clear()
    named = ["libai.pkg.x_f__*", "libai.pkg.x_f__mutmut_1"]
    args = run.parse_args(["libai/pkg", "--slow", "--max-children", "1", "--mutants", *named])
    assert run.run_round(target, work, args, None, rounds) == 0
    assert calls[0] == ("run", "--max-children", "1", "libai.pkg.x_f__*", "libai.pkg.x_f__mutmut_1")
