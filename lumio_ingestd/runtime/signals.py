"""Signals reach the main thread as items on a queue, nothing more.

The handler installed here does exactly one thing: `SimpleQueue.put_nowait`
of the signal number (gunicorn's shape). `SimpleQueue.put` is reentrant, so it
is safe inside a handler that interrupted the very thread blocked in `get`; a
handler takes no lock, logs nothing, raises nothing. The main thread waits
with `wait(timeout)` and does the work in ordinary code: stopping threads,
logging, notifying systemd.

Other threads may call `wake()` to end the main thread's wait early (a
sentinel that `wait` swallows). Nothing durable lives here.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

#: What the daemon listens for: stop (TERM, INT) and reload (HUP).
HANDLED: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_SIGNALS: frozenset[int] = frozenset({signal.SIGTERM, signal.SIGINT})
RELOAD_SIGNALS: frozenset[int] = frozenset({signal.SIGHUP})

_WAKE = 0  # never a real signal number

_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class SignalQueue:
    """Install once in the main thread; `wait()` there, `wake()` from anywhere."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._previous: dict[int, _Handler] = {}

    def install(self, signals: Iterable[int] = HANDLED) -> None:
        """Route `signals` to the queue (main thread only: Python's rule)."""
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before `install`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # The one thing a handler may do: a reentrant, lock-free enqueue.
        self._queue.put_nowait(signum)

    def put(self, signum: int) -> None:
        """Queue a signal number as if it had been received (from any thread)."""
        self._queue.put_nowait(signum)

    def wake(self) -> None:
        """End a pending `wait` early (from any thread)."""
        self._queue.put_nowait(_WAKE)

    def wait(self, timeout: float) -> list[int]:
        """Signals received, waiting up to `timeout` for the first one; [] on timeout or wake."""
        received: list[int] = []
        try:
            first = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return received
        if first != _WAKE:
            received.append(first)
        while True:  # take whatever else is already queued, without waiting
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return received
            if item != _WAKE:
                received.append(item)
