"""Helpers for scripts run by ``tests/support/launch.py`` under torchrun."""

from __future__ import annotations

import argparse
import json
import os
import traceback
from pathlib import Path

import torch.distributed as torch_dist


def parse_out_dir() -> tuple[Path, argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args, rest = parser.parse_known_args()
    return Path(args.out), args, rest


def write_result(out_dir: Path, result: dict) -> None:
    """Write this rank's result; the test reads these instead of trusting the exit code.
    Atomically (a temporary file renamed): a rank killed while writing (its peer failed)
    leaves no half-written result behind."""
    rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0
    tmp = out_dir / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out_dir / f"rank{rank}.json")


def run_checks(out_dir: Path, checks) -> None:
    """Run ``checks()`` (returning a dict), record it or the exception, then tear down."""
    from libai import dist

    try:
        result = {"ok": True, **checks()}
    except Exception as exc:  # recorded, so the test shows which rank failed and why
        result = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "trace": traceback.format_exc(),
        }
        write_result(out_dir, result)
        os._exit(1)  # torchrun then stops the peers, which may wait in a collective
    write_result(out_dir, result)
    dist.destroy_dist()


def run_cases(check_case) -> None:
    """The main of a layout script: ``--out DIR REFERENCES CASES_JSON``; every rank runs
    ``check_case(case, references)`` for each case (see launch.torchrun_cases)."""
    import torch

    out_dir, _, rest = parse_out_dir()
    refs, cases = torch.load(rest[0]), json.loads(rest[1])
    run_checks(out_dir, lambda: {"cases": [check_case(case, refs) for case in cases]})
