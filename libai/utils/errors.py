"""Errors whose message alone says what is wrong and how to fix it."""


class OneLineError(Exception):
    """Bad input or a failed save that the command-line tools report as one line on stderr
    (:func:`libai.dist.cli.run_cli`), not a traceback: subclasses name the file or key."""
