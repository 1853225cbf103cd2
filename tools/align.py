"""Numerics alignment of two causal language models: ``python tools/align.py --base SIDE
--raw SIDE`` (or under torchrun). The command line, its sides and exit status are described
in :mod:`libai.align.cli` (``--help``) and docs/align.md."""

import os
import sys

# the working directory first (the user's own modules and projects/<name> win), then this
# checkout (its libai, and its projects/ after the user's)
sys.path[:0] = [os.getcwd(), os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))]

from libai.align.cli import main  # noqa: E402

if __name__ == "__main__":
    code = main()
    if "libai.dist" in sys.modules:  # not on bad input: nothing was set up
        from libai import dist

        dist.destroy_dist()
    sys.exit(code)
