"""Whether the database is known unwell: the event path's circuit breaker.

One `DatabaseBreaker` per process, shared by every thread that writes events
(the sources' inline inserts, webhook requests, the spool replay), the event
retry worker, the insert probe and the stream-session writes. It opens at the
first transient or environmental failure one of them reports (`failed`: a
timeout, a refused connection, a missing grant) and closes when one of them
sees the database answer again (`ok`): a committed replay, the probe's canary
insert (events/probe.py), any write that went through.

While it is open `allows()` is False, and the callers that must not wait (a
source's inline insert, on the thread that reads its socket) park at once
instead of trying: a black-holed database costs the first event one insert
timeout, not every event one each. A live insert never probes an open
breaker; closing it is the probe's and the retry worker's job.

It also keeps the attempts in flight (`attempt()`). One that has not answered
within `stall_secs` makes `allows()` False for every other caller while it
lasts, so the first events of other sockets do not each wait for a timeout of
their own before the first one has failed; its own outcome then opens the
breaker or lets it be. At a stop, `in_flight()` says which threads to cut.

Nothing durable lives here. The log says when it opens and when it closes,
once per outage (`Outage`), never once per event.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from lumio_ingestd.outage import Outage

#: How long an attempt in flight may go unanswered before the other callers stop trying.
#: A healthy insert takes milliseconds; this is far beyond that, and far below the 3 s bound.
STALL_SECS = 0.5


@dataclass(frozen=True, slots=True)
class Attempt:
    """One database call in flight: its thread and when it began (monotonic)."""

    thread: int
    started: float


class DatabaseBreaker:
    def __init__(self, what: str, logger: logging.Logger, *, stall_secs: float = STALL_SECS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_secs = stall_secs
        self._outage = Outage(what, logger)
        self._clock = clock
        self._lock = threading.Lock()
        # Read without the lock on the hot path (one attribute read); written under it.
        self._open = False
        self._attempts: dict[int, Attempt] = {}
        self._tokens = itertools.count()

    @property
    def open(self) -> bool:
        """A failure was reported and nothing has answered since."""
        return self._open

    def allows(self, now: float | None = None) -> bool:
        """Whether a caller that must not wait should try the database now."""
        return not self._open and self.stalled(now) is None

    def stalled(self, now: float | None = None) -> Attempt | None:
        """The oldest attempt in flight for longer than `stall_secs`, if any."""
        if not self._attempts:  # the common case, without the lock
            return None
        now = self._clock() if now is None else now
        with self._lock:
            oldest = min(self._attempts.values(), key=lambda a: a.started, default=None)
        if oldest is not None and now - oldest.started >= self.stall_secs:
            return oldest
        return None

    @contextmanager
    def attempt(self) -> Iterator[None]:
        """Around one database call whose outcome the caller reports (`ok` or `failed`)."""
        token = next(self._tokens)
        with self._lock:
            self._attempts[token] = Attempt(threading.get_ident(), self._clock())
        try:
            yield
        finally:
            with self._lock:
                del self._attempts[token]

    def in_flight(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts.values())

    def failed(self, detail: str) -> None:
        """A transient or environmental failure: open (logged once per outage)."""
        with self._lock:
            self._outage.failed(detail)
            self._open = True

    def ok(self) -> None:
        """The database answered: close (the outage's end is logged)."""
        if not self._open:
            return
        with self._lock:
            self._outage.ok()
            self._open = False
