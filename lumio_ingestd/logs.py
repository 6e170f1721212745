"""Logging setup: one line per record on stderr.

Under systemd (`$JOURNAL_STREAM` set) every line starts with a `<N>` syslog
priority and carries no timestamp, because the journal adds its own; a
traceback stays in the same record (its newlines are escaped for the
journal's line protocol). Elsewhere a readable timestamped format is used.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TextIO

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def _priority(levelno: int) -> int:
    for level in sorted(_PRIORITY, reverse=True):
        if levelno >= level:
            return _PRIORITY[level]
    return 7


class JournalFormatter(logging.Formatter):
    """`<N>logger: message`, one physical line per record."""

    def __init__(self) -> None:
        super().__init__("%(name)s [%(threadName)s]: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        # The journal splits records on newlines; keep a traceback in one.
        return f"<{_priority(record.levelno)}>" + text.replace("\n", "\\n")


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s [%(threadName)s]: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\n    ")


def setup_logging(level: str, environ: Mapping[str, str], stream: TextIO | None = None) -> logging.Handler:
    """Install one stderr handler on the root logger and return it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JournalFormatter() if environ.get("JOURNAL_STREAM") else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    set_level(level)
    return handler


def set_level(level: str) -> None:
    logging.getLogger().setLevel(level.upper())
