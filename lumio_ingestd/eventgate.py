"""The event gate: the threads that move chat step aside while an event is on its way to its alert.

One process moves chat and events on threads that share the interpreter lock.
Under a chat flood the threads that move chat (a source thread mapping frames
into its `ChatQueue`, the flush threads making COPY rows) want the lock all the
time, and an event's thread waits for it at every hand-over on its way: after
its socket read, after the database answered its insert, and the alert
thread again after each Redis reply. Each such wait lasts up to the
interpreter's switch interval, and the waits add up (tens of ms under load,
against ~3 ms idle).

The gate removes the waits that come after the event was mapped:

- `EventSink.persist` holds it (`held()`) from the moment a mapped event is
  handed over until its persistence outcome is settled and its alert queued;
- the alert publisher holds it once more for each alert it queued, until its
  PUBLISH was answered (or failed);
- chat threads call `step_aside()` where waiting costs nothing (before a
  message joins its queue, between the flusher's rows). While the gate is held
  they wait on it, with the lock released, so the event's thread and the
  alert thread get the lock the moment they want it.

A chat thread waits at most `max_hold_secs` after the gate closed: a slow
event path (a database at its insert timeout, a Redis failover) costs chat a
bounded pause, never a stall. The wait a chat thread makes is counted by the
caller's metric, not here.

Nothing durable here: the gate only orders who runs first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: The longest a chat thread waits for the event path once the gate closed. An event's path
#: under load takes 2-10 ms; past this bound chat goes on as if the gate were open.
MAX_HOLD_SECS = 0.02


class EventGate:
    def __init__(self, max_hold_secs: float = MAX_HOLD_SECS) -> None:
        self.max_hold_secs = max_hold_secs
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._holds = 0
        self._closed_at = 0.0

    def hold(self) -> None:
        """One more event on its way; each `hold` needs one `release`."""
        with self._lock:
            self._holds += 1
            if self._holds == 1:
                self._closed_at = time.monotonic()
                self._open.clear()

    def release(self, n: int = 1) -> None:
        with self._lock:
            self._holds = max(0, self._holds - n)
            if self._holds == 0:
                self._open.set()

    @contextmanager
    def held(self) -> Iterator[None]:
        self.hold()
        try:
            yield
        finally:
            self.release()

    @property
    def holds(self) -> int:
        return self._holds

    def step_aside(self) -> None:
        """For chat threads: wait while an event is on its way (bounded). Costs one
        attribute read when the gate is open, the common case."""
        if self._open.is_set():
            return
        left = self._closed_at + self.max_hold_secs - time.monotonic()
        if left > 0:
            self._open.wait(left)
