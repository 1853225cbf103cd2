"""The process's locale for tests of text files written or read without an explicit encoding."""

from __future__ import annotations

import contextlib
import locale


@contextlib.contextmanager
def ascii_locale():
    """The C locale (``LC_CTYPE=C``, as on a bare container): ``open`` without an encoding is
    ASCII (unless Python is in UTF-8 mode). The previous locale is restored after."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
