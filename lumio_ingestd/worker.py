"""The one thread abstraction of the daemon.

A `Worker` is a named, non-daemon thread with a stop event. Its loop calls
`run_once()`; an exception there is logged with its traceback, counted, and
followed by a backoff, so one bad turn never kills the thread. Every wait is
`stop_event.wait(delay)`, so a stop request wakes it at once. `final()` runs
once after the loop, for work that must happen on the way out (a last flush,
handing memory to Redis). The worker keeps a progress deadline: the time by
which it promises to report again; the watchdog reads it.

Nothing durable lives here; what a worker stores is its subclass's business.
"""

from __future__ import annotations

import logging
import threading
import time

from lumio_ingestd.metrics import Metrics

log = logging.getLogger("lumio_ingestd.worker")

#: How long a worker asked to stop lets a database call in progress go on
#: before it is cut (a healthy commit takes milliseconds).
STOP_GRACE_SECS = 0.5


class Worker:
    """Subclasses implement `run_once()` and return the delay before the next turn."""

    #: How long one turn may take before the watchdog calls the worker stuck.
    max_turn_secs: float = 60.0
    #: Backoff after a failed turn: doubles from `min` up to `max`.
    backoff_min_secs: float = 0.5
    backoff_max_secs: float = 30.0

    def __init__(self, name: str, metrics: Metrics, *, role: str | None = None) -> None:
        self.name = name
        # The metric label: the kind of worker, never its account (thread names
        # may carry one; metric labels must not).
        self.role = role or name
        self.metrics = metrics
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress_deadline = time.monotonic() + self.max_turn_secs
        self._failures = 0
        self.turns = 0

    # -- for subclasses --------------------------------------------------------

    def run_once(self) -> float:
        """One loop turn; returns the delay before the next one (seconds)."""
        raise NotImplementedError

    def final(self) -> None:
        """Runs once after the loop ends, in the worker's thread."""

    def wake(self) -> None:
        """Interrupt a blocking call of `run_once` (a socket read, say)."""

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start (or, after it died, restart) the thread."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"worker {self.name} is already running")
        self._progress_deadline = time.monotonic() + self.max_turn_secs
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=False)
        self._thread.start()

    def request_stop(self) -> None:
        self.stop_event.set()
        self.wake()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` for the thread to end; True when it has."""
        if self._thread is None:
            return True
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    @property
    def ident(self) -> int | None:
        """The thread's identifier while it runs (a dead thread's may be reused)."""
        thread = self._thread
        return thread.ident if thread is not None and thread.is_alive() else None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self.stop_event.is_set()

    def healthy(self, now: float | None = None) -> bool:
        """Making progress: inside a turn no longer than allowed, or waiting as planned."""
        return self.alive and (now if now is not None else time.monotonic()) <= self._progress_deadline

    # -- the loop ----------------------------------------------------------------

    def _main(self) -> None:
        try:
            while not self.stop_event.is_set():
                delay = self._turn()
                self._progress_deadline = time.monotonic() + delay + self.max_turn_secs
                if self.stop_event.wait(delay):
                    break
        finally:
            self._progress_deadline = time.monotonic() + self.max_turn_secs
            try:
                self.final()
            except Exception:
                log.exception("worker %s: final step failed", self.name)
                self.metrics.worker_errors.labels(self.role).inc()

    def _turn(self) -> float:
        self._progress_deadline = time.monotonic() + self.max_turn_secs
        try:
            delay = self.run_once()
        except Exception:
            self._failures += 1
            backoff: float = min(self.backoff_max_secs,
                                 self.backoff_min_secs * 2.0 ** (self._failures - 1))
            log.exception("worker %s: turn failed (%d in a row); next try in %.1fs",
                          self.name, self._failures, backoff)
            self.metrics.worker_errors.labels(self.role).inc()
            return backoff
        self._failures = 0
        self.turns += 1
        return float(delay)


class IntervalWorker(Worker):
    """Calls `tick()` every `interval_secs` (measured from the end of a turn)."""

    def __init__(self, name: str, metrics: Metrics, interval_secs: float, *,
                 role: str | None = None) -> None:
        super().__init__(name, metrics, role=role)
        self.interval_secs = interval_secs

    def tick(self) -> None:
        raise NotImplementedError

    def run_once(self) -> float:
        self.tick()
        return self.interval_secs
