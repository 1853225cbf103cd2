"""The test launcher's forked ranks (``tests/support/forked_ranks.py``) against ranks that
``torchrun`` starts: the same probe script reports the same job environment, argv, path,
working directory and thread count, fresh Python / NumPy / torch seeds per rank and a
working gloo group; a rank that fails or hangs ends the job with its error."""

from __future__ import annotations

import json
import os

import forked_ranks
import pytest
from launch import SCRIPTS, free_port, torchrun

#: what must not differ between the two launches (random draws are compared apart)
SAME = ("env", "job_variable", "path0", "cwd", "main", "threads", "sum", "rest")


def probe(monkeypatch, *, torchrun_itself: bool) -> list[dict]:
    monkeypatch.setenv("LAUNCH_PROBE", "job")
    if not torchrun_itself:  # the server's environment holds it: the forked path applies
        monkeypatch.setattr(forked_ranks, "_server_env", None)
    monkeypatch.setenv("LIBAI_TEST_TORCHRUN", "1" if torchrun_itself else "0")
    results = torchrun("launch_probe.py", 2, "a", "--b=1")
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
    return results


def test_forked_ranks_see_what_torchrun_ranks_see(monkeypatch):
    forked = probe(monkeypatch, torchrun_itself=False)
    assert forked_ranks._server_env is not None  # this launch went through the server
    plain = probe(monkeypatch, torchrun_itself=True)
    for rank in range(2):
        got, want = forked[rank], plain[rank]
        assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}, (
            rank,
            got["env"],
            want["env"],
        )
        assert got["argv"][2:] == want["argv"][2:] == ["a", "--b=1"]  # after --out DIR
    assert forked[0]["env"]["RANK"] == "0" and forked[1]["env"]["WORLD_SIZE"] == "2"
    assert forked[0]["sum"] == 3.0 and forked[0]["path0"] == str(SCRIPTS)
    assert forked[0]["threads"] == 1 and forked[0]["main"] == "__main__"
    # each fresh interpreter seeds Python's, NumPy's and torch's generators anew: so does
    # each fork (not the server's state, which every fork would share)
    for runs in (forked, plain):
        for generator in ("python_random", "numpy_random", "torch_random"):
            assert runs[0][generator] != runs[1][generator], (generator, runs)


def test_a_failing_rank_ends_the_job_with_its_error(tmp_path, monkeypatch):
    """A rank that raises (the other waits in a collective) and a job that passes its
    timeout: both end, the first naming the rank's exception."""
    monkeypatch.setattr(forked_ranks, "_server_env", None)
    argv = [str(SCRIPTS / "launch_probe.py"), "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LAUNCH_PROBE_FAIL": "1"}
    assert forked_ranks.usable(env)
    proc = forked_ranks.run(argv, 2, env, 60, free_port())
    assert proc.returncode != 0 and "process 1 terminated" in proc.stderr, proc
    assert "rank 1 fails on purpose" in (tmp_path / "rank1.json").read_text()
    # rank 0 waited in the all-reduce: stopped there, or (when the peer's exit closes the gloo
    # connection first) its all-reduce raised; never a result
    rank0 = tmp_path / "rank0.json"
    assert not rank0.exists() or json.loads(rank0.read_text())["ok"] is False
    with pytest.raises(Exception, match="timed out after 3 seconds"):
        forked_ranks.run(argv, 2, {**env, "LAUNCH_PROBE_FAIL": "hang"}, 3, free_port())
