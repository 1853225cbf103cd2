"""Freeze, kill and watch a whole process tree from ``/proc`` (Linux), without psutil.

torchrun starts its workers in process sessions of their own, so killing the launcher (or its
process group) leaves them running, training and writing checkpoints. A test that means "the
job died here" must kill the launcher and every descendant: :func:`kill_tree`.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """One process as seen when the tree was listed; ``start`` (clock ticks after boot) tells
    it apart from a later process that reuses the pid."""

    pid: int
    ppid: int
    start: int
    cmdline: str


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of ``pid`` from /proc/<pid>/stat; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _children_by_parent() -> dict[int, list[int]]:
    """ppid -> pids of every live process (a scan of /proc: /proc/<pid>/task/*/children needs
    a kernel built with CONFIG_PROC_CHILDREN, which not every machine has)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[1], []).append(int(entry))
    return children


def process_tree(pid: int) -> list[Proc]:
    """``pid`` and all its live descendants, parents before children."""
    children = _children_by_parent()
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        stat = _stat(current)
        if stat is None or stat[0] in "ZX":  # gone, or dead and waiting to be reaped
            continue
        found.append(Proc(current, stat[1], stat[2], _cmdline(current)))
        queue.extend(children.get(current, []))
    return found


def _signal(proc: Proc, sig: int) -> None:
    stat = _stat(proc.pid)
    if stat is not None and stat[2] == proc.start:  # still the process we listed
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def stop_tree(pid: int) -> list[Proc]:
    """SIGSTOP ``pid`` and every descendant, parents first, listing again until no new one
    appears: a stopped process starts no child, so the whole tree is frozen on return."""
    stopped: dict[int, Proc] = {}
    while True:
        new = [p for p in process_tree(pid) if p.pid not in stopped]
        if not new:
            return list(stopped.values())
        for proc in new:
            _signal(proc, signal.SIGSTOP)
            stopped[proc.pid] = proc


def kill_tree(pid: int) -> list[Proc]:
    """Freeze the tree of ``pid`` (:func:`stop_tree`), then SIGKILL every process in it; returns
    the processes killed (check them with :func:`wait_gone`)."""
    procs = stop_tree(pid)
    for proc in procs:
        _signal(proc, signal.SIGKILL)
    return procs


def is_gone(proc: Proc) -> bool:
    """True once ``proc`` no longer runs: no such pid, a zombie, or the pid now names another
    process."""
    stat = _stat(proc.pid)
    return stat is None or stat[0] in "ZX" or stat[2] != proc.start


def wait_gone(procs: list[Proc], timeout: float = 30) -> list[Proc]:
    """Wait until every process of ``procs`` is gone; returns those still running after
    ``timeout`` seconds (empty when all are gone)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if not is_gone(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
