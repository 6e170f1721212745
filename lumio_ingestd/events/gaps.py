"""The gaps ledger: when each source path was away, what healing stored, and the heal threads.

`GapLedgerWorker` (thread `gap-ledger`) is the `GapLedger` every socket
source is given (sources/base.py calls it; sources/interfaces.py has the
protocol):

- `up(keys, at)` / `down(keys, at)` only queue the change and return; the
  ledger's thread handles them in order. A path that comes up has its last
  record read from `lumio:sourceseen:{A}` (stores/sourceseen.py): a record
  older than `at` is a gap [record, at]; no record (a first start) is none.
  Then `at` is recorded. A path that goes down has `at` recorded, so the gap
  it starts begins exactly there.
- every `seen_interval_secs` every path that is up is recorded, so after a
  SIGKILL the next start's gap begins at most that long before the kill.
- `stopped(keys, at)`, called by a stopping source on its own thread, records
  the stop time before it returns: a deploy's gap is exact.

A gap gets its row in `source_gaps` (stores/gaps.py): `not_healable` (chat)
and `healed` (7TV, Jetstream: their own mechanisms) at once; a path with a
history API (`heal`) gets an `open` row and a `HealJob` for the heal threads.
When a path comes up, open rows an earlier process (or the replica that had
the account before) left for it are healed too.

`HealWorker` threads (`gap-heal-N`) run the jobs: the window is [start - 5 s,
end + 5 s], cut to `heal_max_hours` before the end (the row then says
`partial`). A `HealRetry` (5xx, 429, a timeout, garbage) is tried again after
a jittered, doubling wait (at least what the platform asked for), at most
`max_tries` times, then the row says `partial`; `HealFailed` ends it
`partial` at once. A heal thread is never a source's: a slow or failing
history API holds up no socket, and each attempt is bounded by the healer's
request timeouts. Healed events go through `persist_event` (insert, park,
spool) like live ones and are counted, never sent as live alerts.

Durable when `stopped` returns: the stop time, in Redis. A gap's row is
written by the ledger's thread (retried while the database is away); what
is queued in memory when the process ends is found again by the next start
(the sourceseen records stay).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import Gap, GapKey, GapStatus, HealFailed, HealRetry, HealWindow
from lumio_ingestd.stores.gaps import GapTable
from lumio_ingestd.stores.sourceseen import SourceSeen
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.events.gaps")

#: Healing reads this much before a gap's start and after its end (clock skew, in-flight frames).
MARGIN_MS = 5_000
#: Tries of one gap's healing before it ends `partial`, and the waits between them.
MAX_TRIES = 6
RETRY_MIN_SECS = 1.0
RETRY_MAX_SECS = 60.0
#: How many open gaps the ledger keeps in memory to write while the database is away.
MAX_PENDING_ROWS = 10_000
_KeyId = tuple[int, str, str]


def _kid(key: GapKey) -> _KeyId:
    return (key.account_id, key.platform, key.source)


@dataclass
class HealJob:
    gap: Gap
    attempts: int = 0
    due: float = 0.0
    rows: int = 0
    requests: int = 0
    #: Set once healing is over: the row's final status and why; then only the close remains.
    result: tuple[GapStatus, str | None] | None = None


class HealQueue:
    """The heal jobs, shared by the heal threads. A job is taken by one thread at a time, and
    so is a healer: two gaps of one path (a resumed one and a new one) never heal at once, as
    a healer's request state (its cancel handle) is its own."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: list[HealJob] = []
        self._busy: set[int] = set()  # id() of the healers a thread is using

    def put(self, job: HealJob) -> None:
        """Queue a job (a new one, or one taken and handed back for a later try)."""
        with self._cond:
            self._busy.discard(id(job.gap.key.healer))
            self._jobs.append(job)
            self._cond.notify_all()

    def done(self, job: HealJob) -> None:
        """A taken job is over: its healer is free for the next."""
        with self._cond:
            self._busy.discard(id(job.gap.key.healer))
            self._cond.notify_all()

    def take(self, timeout: float, stopping: Callable[[], bool] = lambda: False) -> HealJob | None:
        """The job due first whose healer is free, once it is due (waits at most `timeout`;
        None at once when `stopping()` says so after a `wake()`)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if stopping():
                    return None
                now = time.monotonic()
                due = [j for j in self._jobs if j.due <= now and id(j.gap.key.healer) not in self._busy]
                if due:
                    job = min(due, key=lambda j: j.due)
                    self._jobs.remove(job)
                    self._busy.add(id(job.gap.key.healer))
                    return job
                left = deadline - now
                if left <= 0:
                    return None
                nxt = min((j.due for j in self._jobs), default=now + left)
                self._cond.wait(max(0.001, min(left, nxt - now)))

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._jobs)


class GapLedgerWorker(Worker):
    """The `GapLedger` (see the module docstring)."""

    max_turn_secs = 60.0

    def __init__(self, seen: SourceSeen, table: GapTable, metrics: Metrics, heal: HealQueue, *,
                 seen_interval_secs: float, name: str = "gap-ledger") -> None:
        super().__init__(name, metrics)
        self._seen = seen
        self._table = table
        self._heal = heal
        self._interval = seen_interval_secs
        self._cond = threading.Condition()
        self._changes: deque[tuple[str, GapKey, int]] = deque()
        self._up: dict[_KeyId, GapKey] = {}
        self._rows: deque[Gap] = deque()
        self._resumed: set[_KeyId] = set()
        self._next_record = 0.0

    # -- GapLedger -----------------------------------------------------------------------------

    def up(self, keys: Sequence[GapKey], at_ms: int) -> None:
        with self._cond:
            self._changes.extend(("up", k, at_ms) for k in keys)
            self._cond.notify_all()

    def down(self, keys: Sequence[GapKey], at_ms: int) -> None:
        with self._cond:
            self._changes.extend(("down", k, at_ms) for k in keys)
            self._cond.notify_all()

    def stopped(self, keys: Sequence[GapKey], at_ms: int) -> None:
        with self._cond:
            for k in keys:
                self._up.pop(_kid(k), None)
            # An up still queued for these keys (stopped before the ledger saw it) is dropped:
            # the path was up from then until now, which the record below says.
            self._changes = deque(c for c in self._changes if _kid(c[1]) not in {_kid(k) for k in keys})
        self._seen.record(keys, at_ms)

    # -- the thread ----------------------------------------------------------------------------

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def run_once(self) -> float:
        self._changes_once()
        self._rows_once()
        now = time.monotonic()
        if now >= self._next_record:
            with self._cond:
                keys = list(self._up.values())
            if keys:
                self._seen.record(keys, _now_ms())
            self._next_record = now + self._interval
        with self._cond:
            if not self._changes and not self.stopping:
                self._cond.wait(max(0.0, self._next_record - time.monotonic()))
        return 0.0

    def final(self) -> None:
        # One last turn: a down queued at the stop still records its time.
        try:
            self._changes_once()
        except Exception:  # noqa: BLE001 - the next start counts from the last record instead
            log.exception("gaps: the last changes could not be recorded")
        if self._rows:
            log.warning("gaps: %d gap row(s) not written (database away); the next start finds "
                        "those gaps again only if their paths had not come up since", len(self._rows))

    def _changes_once(self) -> None:
        while True:
            with self._cond:
                if not self._changes:
                    return
                kind, key, at_ms = self._changes[0]
            if kind == "up":
                prev = self._seen.last(key)  # a Redis error leaves the change queued
                self._seen.record([key], at_ms)
                with self._cond:
                    self._up[_kid(key)] = key
                if prev is not None and prev < at_ms:
                    gap = Gap(key, prev, at_ms)
                    log.info("gaps: account %d %s %s was away %.1fs", key.account_id, key.platform,
                             key.source, gap.seconds)
                    self._rows.append(gap)
                    if len(self._rows) > MAX_PENDING_ROWS:
                        lost = self._rows.popleft()
                        log.error("gaps: too many gap rows waiting for the database; dropped %s", lost)
                if key.mode == "heal" and _kid(key) not in self._resumed:
                    self._resume(key)
            else:
                with self._cond:
                    self._up.pop(_kid(key), None)
                self._seen.record([key], at_ms)
            with self._cond:
                if self._changes and self._changes[0] == (kind, key, at_ms):
                    self._changes.popleft()

    def _resume(self, key: GapKey) -> None:
        """Open rows left for this path by an earlier process or another replica: heal them."""
        try:
            rows = self._table.open_gaps(key.account_id, key.platform, key.source)
        except Exception as exc:  # noqa: BLE001 - asked again when the path next comes up
            log.warning("gaps: cannot read the open gaps of account %d %s %s: %s", key.account_id,
                        key.platform, key.source, exc)
            return
        self._resumed.add(_kid(key))
        for started_ms, ended_ms in rows:
            log.info("gaps: account %d %s %s: resuming the healing of an open gap", key.account_id,
                     key.platform, key.source)
            self._heal.put(HealJob(Gap(key, started_ms, ended_ms)))

    def _rows_once(self) -> None:
        while self._rows:
            gap = self._rows[0]
            status = first_status(gap.key)
            try:
                new = self._table.insert(gap, status)
            except Exception as exc:  # noqa: BLE001 - the database is away: retried next turn
                log.warning("gaps: writing a gap row failed (%s); retrying", exc)
                return
            self._rows.popleft()
            if not new:
                continue  # the same gap reported twice (another replica, a retried turn)
            if status == "open":
                self._heal.put(HealJob(gap))
            else:
                count_closed(self.metrics, gap, status, 0)


def first_status(key: GapKey) -> GapStatus:
    if key.mode == "heal":
        return "open"
    return "healed" if key.mode == "healed" else "not_healable"


def count_closed(metrics: Metrics, gap: Gap, status: GapStatus, rows: int) -> None:
    metrics.source_gaps.labels(gap.key.platform, status).inc()
    metrics.source_gap_seconds.labels(gap.key.platform).inc(gap.seconds)
    if rows:
        metrics.source_gap_healed_rows.labels(gap.key.platform).inc(rows)


def _now_ms() -> int:
    return int(time.time() * 1000)


class HealWorker(Worker):
    """One heal thread: takes due jobs from the queue (see the module docstring)."""

    max_turn_secs = 300.0

    def __init__(self, name: str, queue: HealQueue, table: GapTable, metrics: Metrics, *,
                 heal_max_hours: float, max_tries: int = MAX_TRIES,
                 retry_min_secs: float = RETRY_MIN_SECS, retry_max_secs: float = RETRY_MAX_SECS,
                 poll_secs: float = 1.0) -> None:
        super().__init__(name, metrics, role="gap-heal")
        self._queue = queue
        self._table = table
        self._max_ms = int(heal_max_hours * 3600 * 1000)
        self._max_tries = max_tries
        self._retry_min = retry_min_secs
        self._retry_max = retry_max_secs
        self._poll = poll_secs
        self._rng = random.Random()
        self._current: object = None

    def wake(self) -> None:
        self._queue.wake()
        cancel = getattr(self._current, "cancel", None)
        if callable(cancel):
            cancel()  # a history request in flight must not hold up the stop

    def run_once(self) -> float:
        job = self._queue.take(self._poll, lambda: self.stopping)
        if job is None or self.stopping:
            if job is not None:
                self._queue.put(job)  # left open: the next start resumes it
            return 0.0
        if job.result is None:
            self._attempt(job)
            if job.result is None:
                self._queue.put(job)
                return 0.0
        self._close(job)
        return 0.0

    def window(self, gap: Gap) -> tuple[HealWindow, bool]:
        """The window healed and whether it was cut to heal_max_hours."""
        until = gap.ended_ms + MARGIN_MS
        since = gap.started_ms - MARGIN_MS
        floor = gap.ended_ms - self._max_ms
        return HealWindow(gap, max(since, floor), until), since < floor

    def _attempt(self, job: HealJob) -> None:
        gap = job.gap
        healer = gap.key.healer
        if healer is None:
            job.result = ("partial", "no healer for this path")
            return
        window, cut = self.window(gap)
        job.attempts += 1
        platform = gap.key.platform
        self._current = healer
        try:
            outcome = healer.heal(window)
        except HealRetry as exc:
            job.rows += exc.rows
            job.requests += exc.requests
            if job.attempts >= self._max_tries:
                job.result = ("partial", f"gave up after {job.attempts} tries: {exc}"[:300])
                log.warning("gaps: account %d %s %s: healing gave up after %d tries (%s)",
                            gap.key.account_id, platform, gap.key.source, job.attempts, exc)
                return
            ceiling = min(self._retry_max, self._retry_min * 2.0 ** (job.attempts - 1))
            wait = max(exc.after_secs or 0.0, self._rng.uniform(self._retry_min, ceiling))
            job.due = time.monotonic() + wait
            log.info("gaps: account %d %s %s: healing failed (%s); try %d in %.1fs",
                     gap.key.account_id, platform, gap.key.source, exc, job.attempts + 1, wait)
            return
        except HealFailed as exc:
            job.rows += exc.rows
            job.requests += exc.requests
            job.result = ("partial", f"failed: {exc}"[:300])
            log.warning("gaps: account %d %s %s: healing failed for good (%s)", gap.key.account_id,
                        platform, gap.key.source, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a bug in a healer: counted as a failed try
            log.exception("gaps: account %d %s %s: healing raised", gap.key.account_id, platform,
                          gap.key.source)
            if job.attempts >= self._max_tries:
                job.result = ("partial", f"{type(exc).__name__}: {exc}"[:300])
            else:
                job.due = time.monotonic() + self._retry_min * 2.0 ** (job.attempts - 1)
            return
        finally:
            self._current = None
        job.rows += outcome.rows
        job.requests += outcome.requests
        detail = f"healed the last {self._max_ms / 3_600_000:g} h only" if cut else None
        job.result = ("partial" if cut else "healed", detail)

    def _close(self, job: HealJob) -> None:
        assert job.result is not None
        status, detail = job.result
        gap = job.gap
        try:
            self._table.close(gap, status, job.rows, detail)
        except Exception as exc:  # noqa: BLE001 - the database is away: closed on a later turn
            log.warning("gaps: closing a gap row failed (%s); retrying", exc)
            job.due = time.monotonic() + 1.0
            self._queue.put(job)
            return
        self._queue.done(job)
        count_closed(self.metrics, gap, status, job.rows)
        self.metrics.source_heal_duration.labels(gap.key.platform).observe(
            max(0.0, _now_ms() - gap.ended_ms) / 1000.0)
        log.info("gaps: account %d %s %s: gap of %.1fs %s, %d row(s) stored late, %d request(s)",
                 gap.key.account_id, gap.key.platform, gap.key.source, gap.seconds, status, job.rows,
                 job.requests)
