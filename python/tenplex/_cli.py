"""Logging for the package's command-line entry points (``python -m tenplex.interop``,
``tenplex.hostagent``, ``tenplex.data``).

The library modules log to module loggers under ``tenplex`` and configure no handlers:
an application decides where their messages go. An entry point is such an application:
`cli_logging` gives the ``tenplex`` loggers one handler on stderr, so that what the
command says reads as it did when it printed it.
"""

from __future__ import annotations

import logging
import sys


def cli_logging(fmt: str = "%(message)s", level: int = logging.WARNING) -> None:
    """A stderr handler with format `fmt` on the ``tenplex`` logger, at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger("tenplex")
    root.addHandler(handler)
    root.setLevel(level)
