"""Ranks of a test's gloo job forked from a server that imported the heavy modules once.

``multiprocessing``'s forkserver, with torch, libai and transformers preloaded: a rank is a
fork of it, so it starts in milliseconds instead of the 3-4 s a fresh interpreter spends on
its imports. Each rank then sets up what ``torchrun`` would give it: the job's environment
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), the working directory, ``sys.argv`` and ``sys.path[0]``, fresh Python,
NumPy and torch random seeds, torch's thread count from ``OMP_NUM_THREADS``, and runs the script as
``__main__``. As under torchrun, a rank that fails stops its peers.

Only modules whose import-time state matches the job's may be shared, so :func:`usable` says
no when the environment differs from the one the server started with (a test that set a
variable), under ``tools/mutation.sh`` (its recorder is installed at a process's start), or
when the server would import another checkout's libai than the ranks should.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import random
import runpy
import subprocess
import sys
import time
import warnings
from pathlib import Path

#: imported once, in the server, before the first fork
PRELOAD = ["torch", "torch.distributed.tensor", "libai.engine", "libai.models", "transformers"]
#: variables that may differ from the server's (set per test by pytest, or here per rank):
#: none of them is read while the preloaded modules import (libai reads its own at run time)
_PER_JOB = {
    "PYTEST_CURRENT_TEST",
    "OMP_NUM_THREADS",
    "PYTHONPATH",
    "PATH",  # tools/train.sh's torchrun; train_net_helpers.train_env puts this venv first
    "PORT",  # tools/train.sh's rendezvous port
    "LIBAI_SAMPLE_DATA_DIR",  # the sample dataset's directory, read when a config resolves
    # set by torch inductor in this process before each compiled library loads (a pointer
    # of this process); a rank's inductor sets its own the same way
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
}
_server_env: dict[str, str] | None = None


def _environment_key(env) -> dict:
    return {k: v for k, v in env.items() if k not in _PER_JOB}


def usable(env: dict) -> bool:
    """Whether a job with environment ``env`` may run on forked ranks (else: torchrun)."""
    if "MUTANT_UNDER_TEST" in env or "LIBAI_MUTATION_HITS_DIR" in env:
        return False
    if env.get("LIBAI_TEST_TORCHRUN") == "1":  # the plain torchrun path, on request
        return False
    root = str(Path(__file__).resolve().parents[2])
    import libai  # the libai this session tests: the ranks must import the same one

    if not str(Path(libai.__file__).resolve()).startswith(root + os.sep):
        return False
    if _server_env is None or _environment_key(env) == _server_env:
        return True
    changed = sorted(set(_environment_key(env).items()) ^ set(_server_env.items()))
    warnings.warn(
        f"environment differs from the forked ranks' server in {sorted({k for k, _ in changed})}: "
        "this job runs under torchrun (slower); set the variable for the whole session in "
        "tests/conftest.py, or add it to forked_ranks._PER_JOB if no import reads it",
        stacklevel=2,
    )
    return False


def _rank_main(rank: int, argv: list, env: dict, world: int, port: int, cwd: str, logs: str):
    """One rank, in a fork of the server: torchrun's setup, then the script as __main__."""
    log = os.open(os.path.join(logs, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        ROLE_WORLD_SIZE=str(world),
        MASTER_ADDR="localhost",  # as torchrun --standalone
        MASTER_PORT=str(port),
    )
    os.chdir(cwd)
    random.seed()
    import numpy as np
    import torch

    np.random.seed()
    torch.seed()
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # a fresh interpreter runs them at exit; a fork would not
        sys.stdout.flush()
        sys.stderr.flush()


def run(
    argv: list, nproc: int, env: dict, timeout: float, port: int, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``argv`` (a script and its arguments) on ``nproc`` forked ranks meeting on
    ``port``, in ``cwd`` (default: this one); the ranks' exit status and output
    (``stdout``: every rank's log) as ``subprocess.run`` reports them."""
    global _server_env
    import tempfile

    import torch.multiprocessing as torch_mp

    context = multiprocessing.get_context("forkserver")
    if _server_env is None:
        context.set_forkserver_preload(PRELOAD)
        _server_env = _environment_key(os.environ)
    with tempfile.TemporaryDirectory() as logs:
        job = torch_mp.start_processes(
            _rank_main,
            args=(argv, env, nproc, port, cwd or os.getcwd(), logs),
            nprocs=nproc,
            join=False,
            start_method="forkserver",
        )
        deadline, error = time.monotonic() + timeout, ""
        try:
            while not job.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(argv, timeout)
        # a rank failed (raised, or exited non-zero): start_processes stopped the others
        except (torch_mp.ProcessExitedException, torch_mp.ProcessRaisedException) as exc:
            error = f"{type(exc).__name__}: {exc}\n"
        finally:
            for process in job.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        output = "".join(
            f"--- rank {r} ---\n{(Path(logs) / f'rank{r}.log').read_text(errors='replace')}"
            for r in range(nproc)
            if (Path(logs) / f"rank{r}.log").exists()
        )
        # as subprocess reports it: a rank's own exit status first, else the signal that
        # stopped it (negative), e.g. -9 for a rank that SIGKILLed itself
        codes = [p.exitcode or 0 for p in job.processes]
        code = max(codes) if max(codes) > 0 else min(codes)
        return subprocess.CompletedProcess(argv, code, output, error)
