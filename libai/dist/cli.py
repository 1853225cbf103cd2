"""How the command-line tools end: bad input is one clear line, not a traceback wall."""

from __future__ import annotations

import sys

from libai import dist
from libai.utils.errors import OneLineError

#: errors that mean bad input (a config key, a path, a size, a bad or unsafe checkpoint, a
#: full disk): reported in one line
INPUT_ERRORS = (ValueError, FileNotFoundError, KeyError, NotImplementedError, OneLineError)


def run_cli(main) -> None:
    """Run ``main()`` (returns an exit code) and exit with it. Bad input is one line on
    stderr per rank and exit code 1; after success the process group is torn down cleanly."""
    code = 1
    try:
        code = main()
    except INPUT_ERRORS as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        if code == 0:
            dist.destroy_dist()
    sys.exit(code)
