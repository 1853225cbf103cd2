"""Run a script on CPU/gloo ranks and collect one JSON result per rank.

Tests judge from the results every rank wrote, not only from a clean exit: roughly one
torchrun run in four aborts on one rank at exit on these machines, after every check passed.

The ranks are forked from a server that imported torch, libai and transformers once per
test session (:mod:`forked_ranks`): each rank still is a process of its own that joins a gloo
group through ``torch.distributed``'s environment (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``,
...), as under ``torchrun``, without the 3-4 s every rank and every ``torchrun`` spent
importing. Under ``tools/mutation.sh``, or when the environment changed since the server
started, the script runs under ``torchrun`` itself. The launchers users run
(``tools/train.sh``, ``tools/infer.sh``) are tested with ``torchrun`` in the door tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import forked_ranks

SUPPORT = Path(__file__).resolve().parent  # tests/support: the helpers
ROOT = SUPPORT.parents[1]  # the checkout
SCRIPTS = SUPPORT / "dist_scripts"


def free_port() -> int:
    """A TCP port nobody listens on now, from the OS (bind to port 0): for the ``PORT`` of
    ``tools/train.sh`` runs, so parallel test workers (``pytest -n``) never share one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(script: str, nproc: int, *args: str, timeout: float = 600) -> list[dict]:
    """Launch ``dist_scripts/<script>`` on ``nproc`` ranks; return each rank's result dict.

    The script receives ``--out DIR`` first and must call
    :func:`dist_scripts.common.write_result` on every rank.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        argv = [str(SCRIPTS / script), "--out", out_dir, *args]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
        cmd += [f"--nproc_per_node={nproc}", *argv]
        # tests/support/ for the helpers, then this checkout's root: its libai and projects/,
        # not an editable install of another checkout (a git worktree shares the environment)
        path = [str(SUPPORT), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, path)),
        }
        if forked_ranks.usable(env):
            proc = forked_ranks.run(argv, nproc, env, timeout, free_port())
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        paths = [Path(out_dir) / f"rank{rank}.json" for rank in range(nproc)]
        written = {r: json.loads(p.read_text()) for r, p in enumerate(paths) if p.exists()}
        missing = [r for r in range(nproc) if r not in written]
        if missing:
            # a failing rank exits at once and torchrun stops its peers: show its own error
            errors = "".join(
                f"--- rank {r}: {res['error']} ---\n{res.get('trace', '')}\n"
                for r, res in written.items()
                if not res.get("ok", True)
            )
            raise AssertionError(
                f"ranks {missing} of {script} wrote no result (exit {proc.returncode}).\n"
                f"{errors}--- stdout ---\n{proc.stdout[-4000:]}\n"
                f"--- stderr ---\n{proc.stderr[-8000:]}"
            )
        return [written[r] for r in range(nproc)]


def torchrun_cases(script: str, nproc: int, references: str, cases: list[dict]):
    """``dist_scripts/<script>`` (one using :func:`dist_scripts.common.run_cases`) on
    ``nproc`` ranks over ``cases`` against the references saved at ``references``: each
    case's name -> the list of every rank's result (a rank's failure fails the test)."""
    results = torchrun(script, nproc, references, json.dumps(cases))
    for rank, result in enumerate(results):
        assert result["ok"], f"rank {rank}: {result['error']}\n{result['trace']}"
    by_case: dict[str, list[dict]] = {}
    for result in results:
        for item in result["cases"]:
            by_case.setdefault(item["name"], []).append(item)
    return by_case
