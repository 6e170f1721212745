"""The demo's terminal output: one live progress line, notices above it.

On a terminal the progress line is rewritten in place (`\\r`, clear to the
end of the line, cut to the terminal's width so it never wraps); notices
(a raid, the database stopping) are printed above it as lines of their own.
When standard output is not a terminal (a pipe, a log, CI), the same line is
printed as a plain line every `plain_every_secs` instead. Safe to call from
several threads (the traffic thread prints notices). Nothing durable here.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import TextIO

from lumio_ingestd.devkit.demo.observe import Snapshot

_CLEAR = "\r\x1b[K"


def _chat_rate(now: Snapshot, before: Snapshot | None) -> float:
    """Chat messages sent per second since the previous snapshot."""
    if before is None or now.at <= before.at:
        return 0.0
    return (now.sent.chat - before.sent.chat) / (now.at - before.at)


def status_line(snap: Snapshot, before: Snapshot | None, elapsed: float, phase: str) -> str:
    """One line: rates, rows, Redis depths, parked events, alerts, the database's state."""
    sent = snap.sent
    rows, depths = snap.rows, snap.depths
    stored_chat = f"{rows.chat:,}" if rows else "?"
    stored_events = f"{rows.events:,}" if rows else "?"
    bluesky = f"{rows.bluesky}/{sent.bluesky}" if rows else f"?/{sent.bluesky}"
    buffer = f"{depths.chat_buffer + depths.chat_inflight:,}" if depths else "?"
    chat_dl = f"{depths.chat_deadletter:,}" if depths else "?"
    parked = f"{depths.events_parked:,}" if depths else "?"
    return (f"[{elapsed:6.1f}s] {phase} | chat {_chat_rate(snap, before):4.0f}/s sent {sent.chat:,} "
            f"stored {stored_chat} buffer {buffer} | events sent {sent.events:,} stored {stored_events} "
            f"parked {parked} | dead letters chat {chat_dl} | alerts {snap.alerts:,} | bluesky {bluesky} "
            f"| viewers {sent.viewers:,} | db {'up' if rows is not None else 'DOWN'}")


class Console:
    def __init__(self, out: TextIO, *, tty: bool, plain_every_secs: float = 2.0) -> None:
        self._out = out
        self.tty = tty
        self._plain_every = plain_every_secs
        self._lock = threading.Lock()
        self._line = ""  # the progress line currently shown (TTY)
        self._printed_at = 0.0
        self.started: float | None = None  # when the traffic started: the clock of every line

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def notice(self, text: str) -> None:
        """A line of its own, above the progress line (before the traffic started: a setup step)."""
        with self._lock:
            prefix = _CLEAR if self.tty and self._line else ""
            when = "  -" if self.started is None else f"[{self.elapsed():6.1f}s]"
            self._out.write(f"{prefix}{when} {text}\n")
            if self.tty and self._line:
                self._out.write(self._line)
            self._out.flush()

    def status(self, line: str, *, force: bool = False) -> None:
        with self._lock:
            if self.tty:
                width = max(20, shutil.get_terminal_size((160, 24)).columns - 1)
                self._line = line[:width]
                self._out.write(_CLEAR + self._line)
                self._out.flush()
                return
            now = time.monotonic()
            if force or now - self._printed_at >= self._plain_every:
                self._printed_at = now
                self._out.write(line + "\n")
                self._out.flush()

    def end_status(self) -> None:
        """Leave the progress line where it is and go on below it."""
        with self._lock:
            if self.tty and self._line:
                self._out.write("\n")
                self._out.flush()
            self._line = ""

    def print(self, text: str = "") -> None:
        with self._lock:
            self._out.write(text + "\n")
            self._out.flush()
