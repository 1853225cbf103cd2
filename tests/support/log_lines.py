"""Capture a libai logger's messages in a test (libai's loggers stop propagating to pytest's
``caplog`` once a run is set up, so listen on the logger itself)."""

from __future__ import annotations

import logging


class LogLines(logging.Handler):
    """The messages of ``logger`` while in the ``with`` block, at INFO and above."""

    def __init__(self, logger: str):
        super().__init__(logging.INFO)
        self.source, self.lines = logging.getLogger(logger), []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        self.level = self.source.level
        self.source.setLevel(logging.INFO)
        self.source.addHandler(self)
        return self.lines

    def __exit__(self, *exc):
        self.source.removeHandler(self)
        self.source.setLevel(self.level)
