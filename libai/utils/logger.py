"""Logging setup for training runs: console on rank 0, one log file per rank.

``setup_logger(output_dir, rank)`` configures the ``libai`` logger once per run; every module
logs through ``logging.getLogger(__name__)`` (a child of ``libai``) and needs nothing else.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter

__all__ = ["log_every_n", "log_every_n_seconds", "log_first_n", "setup_logger"]

_FORMAT = "[%(asctime)s] %(name)s %(levelname)s: %(message)s"
_DATEFMT = "%m/%d %H:%M:%S"


def _log_file(output: str, distributed_rank: int) -> str:
    if output.endswith((".txt", ".log")):
        filename = output
    else:
        filename = os.path.join(output, "log.txt")
    if distributed_rank > 0:
        filename = f"{filename}.rank{distributed_rank}"
    return filename


def setup_logger(
    output: str | None = None, distributed_rank: int = 0, name: str = "libai"
) -> logging.Logger:
    """Configure the logger ``name`` for this process and return it.

    * console (stdout): rank 0 at INFO, other ranks at WARNING only;
    * file: ``output/log.txt`` on rank 0 and ``output/log.txt.rank{r}`` on rank ``r`` (all
      levels from DEBUG). ``output`` ending in ``.txt`` or ``.log`` is taken as the file name.

    Idempotent: calling it again replaces the handlers it installed before (so a second call
    never duplicates lines, and may point the file elsewhere). The logger does not propagate
    to the root logger, so lines are not printed twice when the root is configured too.
    """
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    for handler in [h for h in logger.handlers if getattr(h, "_libai_handler", False)]:
        logger.removeHandler(handler)
        handler.close()

    formatter = logging.Formatter(_FORMAT, datefmt=_DATEFMT)
    console = logging.StreamHandler(stream=sys.stdout)
    console.setLevel(logging.INFO if distributed_rank == 0 else logging.WARNING)
    console.setFormatter(formatter)
    console._libai_handler = True
    logger.addHandler(console)

    if output is not None:
        filename = _log_file(output, distributed_rank)
        os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
        file_handler = logging.FileHandler(filename, mode="a")
        file_handler.setLevel(logging.DEBUG)
        file_handler.setFormatter(formatter)
        file_handler._libai_handler = True
        logger.addHandler(file_handler)
    return logger


# ---- rate-limited logging (LiBai / detectron2 helpers) ---------------------------------------
_LOG_COUNTER: Counter = Counter()
_LOG_TIMER: dict = {}


# not mutated (tools/mutation.sh): these read the frames of their callers; under mutation a
# trampoline would be the caller
def _caller_key() -> tuple[str, int, str]:  # pragma: no mutate block
    """(file, line, logger name) of the code that called the log_* helper."""
    frame = sys._getframe(2)
    module = frame.f_globals.get("__name__", "libai")
    return frame.f_code.co_filename, frame.f_lineno, module


def log_first_n(
    lvl: int, msg: str, n: int = 1, *, name: str | None = None
) -> None:  # pragma: no mutate block
    """Log ``msg`` only the first ``n`` times it is reached from the same call site."""
    file, line, module = _caller_key()
    key = (file, line, msg)
    _LOG_COUNTER[key] += 1
    if _LOG_COUNTER[key] <= n:
        logging.getLogger(name or module).log(lvl, msg)


def log_every_n(
    lvl: int, msg: str, n: int = 1, *, name: str | None = None
) -> None:  # pragma: no mutate block
    """Log ``msg`` once every ``n`` times it is reached from the same call site."""
    file, line, module = _caller_key()
    key = (file, line)
    _LOG_COUNTER[key] += 1
    if n == 1 or _LOG_COUNTER[key] % n == 1:
        logging.getLogger(name or module).log(lvl, msg)


def log_every_n_seconds(
    lvl: int, msg: str, n: float = 1, *, name: str | None = None
) -> None:  # pragma: no mutate block
    """Log ``msg`` at most once every ``n`` seconds from the same call site."""
    file, line, module = _caller_key()
    key = (file, line)
    last = _LOG_TIMER.get(key)
    now = time.time()
    if last is None or now - last >= n:
        logging.getLogger(name or module).log(lvl, msg)
        _LOG_TIMER[key] = now
