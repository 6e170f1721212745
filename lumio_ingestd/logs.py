"""Logging setup: one line per record on stderr.

Under systemd (`$JOURNAL_STREAM` set) every line starts with a `<N>` syslog
priority and carries no timestamp, because the journal adds its own; a
traceback stays in the same record (its newlines are escaped for the
journal's line protocol). Elsewhere a readable timestamped format is used.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
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


class Throttled:
    """At most one log line per `interval_secs` for one kind of repeated refusal.

    Anyone can send what is refused (a flood must not push real lines past
    journald's rate limit); the metric counts every one, the log says how many
    it held back since its last line. Thread-safe.
    """

    def __init__(self, logger: logging.Logger, interval_secs: float = 60.0) -> None:
        self._logger = logger
        self._interval = interval_secs
        self._last = -math.inf
        self._held = 0
        self._lock = threading.Lock()

    def log(self, level: int, msg: str, *args: object) -> bool:
        """Log now (True) or count it as held back (False)."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < self._interval:
                self._held += 1
                return False
            held, self._held, self._last = self._held, 0, now
        self._logger.log(level, msg + " (%d more since the last such line)", *args, held)
        return True
