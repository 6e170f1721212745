"""Viewer statistics: the in-memory minute windows and their rows in `stream_stats`.

The stream-status poller hands every live sample to `add()`. Samples of one
account, platform and minute accumulate in memory (sum, maximum, count,
the latest title and category). A window is written when its minute has
ended (`flush_due`, called by the poller at every minute boundary) and, at
a stop, also the current partial one (`flush_all`, from the poller's
`final()`, inside the shutdown budget).

A write is an upsert that merges: `samples` add up, `viewers_avg` is the
average weighted by samples, `viewers_max` the larger, title and category
the newer non-null ones. So the partial window written at SIGTERM and the
samples a restarted process takes in the same minute end as one row.

Each window write carries an id, inserted into `stream_stats_writes` in the
same transaction as the merge, so a write that is replayed (below) after it
did commit merges nothing a second time.

When the database does not take a batch (down, or its bounded attempt ran
out), every window of it is parked as a record entry (events/records.py,
kind "stream_stats") on the events' dead-letter list of its account, else
appended to the local spool; the event retry worker (or the spool replay)
writes it later through `write_record`. Only when Redis and the spool both
refuse is a window lost (counted, and logged with what it held).

Durable when `flush_due`/`flush_all` return: each window taken is committed,
parked in Redis, fsynced in the spool, or counted lost. Samples still in
memory (the current minute) are durable only once a flush took them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2.extensions
import psycopg2.extras

from lumio_ingestd.db.errors import classify, describe_db_error
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.events.persist import EventSpool
from lumio_ingestd.events.records import record_entry
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import Kind, PlatformEvent, parse_time
from lumio_ingestd.outage import Outage
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.spool import SpoolError
from lumio_ingestd.worker import STOP_GRACE_SECS

log = logging.getLogger("lumio_ingestd.streamstats")

Cursor = psycopg2.extensions.cursor

#: The record kind of a parked window (events/records.py).
KIND = "stream_stats"
#: The spool kind parked records travel under (the events' own).
SPOOL_KIND = "event"
#: Write ids are kept this long: past the 72 h after which a parked entry is
#: quarantined as expired instead of written, with room to spare.
WRITE_IDS_KEPT = timedelta(days=8)
_PRUNE_EVERY_SECS = 3600.0
_TITLE_MAX = 500

_CLAIM_IDS = """
INSERT INTO stream_stats_writes (id, ts) VALUES %s
ON CONFLICT (id) DO NOTHING
RETURNING id
"""
_MERGE = """
INSERT INTO stream_stats AS s
    (account_id, platform, ts, viewers_avg, viewers_max, samples, title, category)
VALUES %s
ON CONFLICT (account_id, platform, ts) DO UPDATE SET
    viewers_avg = (s.viewers_avg * s.samples + EXCLUDED.viewers_avg * EXCLUDED.samples)
                  / (s.samples + EXCLUDED.samples),
    viewers_max = GREATEST(s.viewers_max, EXCLUDED.viewers_max),
    samples = s.samples + EXCLUDED.samples,
    title = COALESCE(EXCLUDED.title, s.title),
    category = COALESCE(EXCLUDED.category, s.category)
"""
_PRUNE = "DELETE FROM stream_stats_writes WHERE ts < %s"


def minute_of(at: datetime) -> datetime:
    """The start of the minute `at` falls in (UTC)."""
    return at.astimezone(UTC).replace(second=0, microsecond=0)


@dataclass(slots=True)
class Window:
    """The samples of one account, platform and minute."""

    account_id: int
    platform: str
    ts: datetime
    total: float = 0.0
    maximum: int = 0
    samples: int = 0
    title: str | None = None
    category: str | None = None

    @property
    def average(self) -> float:
        return self.total / self.samples if self.samples else 0.0

    def add(self, viewers: int, title: str | None, category: str | None) -> None:
        self.total += viewers
        self.maximum = max(self.maximum, viewers) if self.samples else viewers
        self.samples += 1
        if title is not None:
            self.title = title[:_TITLE_MAX]
        if category is not None:
            self.category = category[:_TITLE_MAX]

    def row(self) -> tuple[Any, ...]:
        return (self.account_id, self.platform, self.ts, self.average, self.maximum, self.samples,
                self.title, self.category)

    def to_record(self, write_id: uuid.UUID) -> PlatformEvent:
        """The window as a parked record (an event entry with kind "stream_stats")."""
        return PlatformEvent.new(
            id=write_id, account_id=self.account_id, platform=self.platform, type=KIND,
            created_at=self.ts, payload={
                "ts": self.ts.isoformat(), "viewers_avg": self.average,
                "viewers_max": self.maximum, "samples": self.samples, "title": self.title,
                "category": self.category})

    @classmethod
    def from_record(cls, ev: PlatformEvent) -> Window:
        """Raises ValueError (or KeyError/TypeError) for a payload that is not a window."""
        p = ev.payload
        samples = int(p["samples"])
        maximum = int(p["viewers_max"])
        average = float(p["viewers_avg"])
        if samples <= 0 or maximum < 0 or average < 0:
            raise ValueError(f"window with {samples} samples, max {maximum}, avg {average}")
        title, category = p.get("title"), p.get("category")
        return cls(ev.account_id, ev.platform, minute_of(parse_time(str(p["ts"]))),
                   average * samples, maximum, samples,
                   title if isinstance(title, str) else None,
                   category if isinstance(category, str) else None)


def merge_windows(cur: Cursor, writes: Sequence[tuple[uuid.UUID, Window]]) -> int:
    """Merge the windows whose write id is new, in the caller's transaction; how many."""
    if not writes:
        return 0
    claimed = psycopg2.extras.execute_values(
        cur, _CLAIM_IDS, [(str(wid), w.ts) for wid, w in writes], template="(%s::uuid, %s)",
        fetch=True)
    fresh = {str(row[0]) for row in claimed}
    rows = [w.row() for wid, w in writes if str(wid) in fresh]
    if rows:
        psycopg2.extras.execute_values(cur, _MERGE, rows)
    return len(rows)


class StreamStats:
    """The minute windows of every polled account, and their way into `stream_stats`."""

    def __init__(self, pool: Pool, deadletters: DeadLetters, spool: EventSpool | None,
                 metrics: Metrics, *, timeout_secs: float = 3.0,
                 clock: Callable[[], datetime] | None = None) -> None:
        self._pool = pool
        self._deadletters = deadletters
        self._spool = spool
        self._metrics = metrics
        self.timeout_secs = timeout_secs
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._windows: dict[tuple[int, str, datetime], Window] = {}
        self._outage = Outage("stream stats: the database", log)
        self._pruned_at = 0.0

    # -- samples --------------------------------------------------------------------

    def add(self, account_id: int, platform: str, viewers: int, *, title: str | None = None,
            category: str | None = None, at: datetime | None = None) -> None:
        ts = minute_of(at or self._clock())
        key = (account_id, platform, ts)
        with self._lock:
            window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = Window(account_id, platform, ts)
            window.add(max(0, int(viewers)), title, category)

    def cut_calls_of(self, thread_ident: int | None) -> None:
        """A stop: cut the database calls of the stopping poller (its final write comes after)."""
        self._pool.expire_calls_of(thread_ident, STOP_GRACE_SECS)

    def held(self) -> int:
        """Windows in memory (not yet written)."""
        with self._lock:
            return len(self._windows)

    # -- writing ----------------------------------------------------------------------

    def flush_due(self, now: datetime | None = None) -> int:
        """Write every window whose minute has ended; how many were taken."""
        current = minute_of(now or self._clock())
        with self._lock:
            due = [k for k in self._windows if k[2] < current]
            windows = [self._windows.pop(k) for k in due]
        return self._store(windows, time.monotonic() + self.timeout_secs)

    def flush_all(self, budget_secs: float | None = None) -> int:
        """Write every window, the current partial one included (at a stop)."""
        with self._lock:
            windows = list(self._windows.values())
            self._windows.clear()
        bound = self.timeout_secs if budget_secs is None else min(self.timeout_secs, budget_secs)
        return self._store(windows, time.monotonic() + bound)

    def _store(self, windows: list[Window], deadline: float) -> int:
        if not windows:
            return 0
        writes = [(uuid.uuid4(), w) for w in windows]
        try:
            with self._pool.transaction(deadline=deadline) as cur:
                merge_windows(cur, writes)
                self._prune(cur)
        # Any failure at all must end with the windows parked, not dropped.
        except Exception as exc:  # noqa: BLE001 - classify() judges it
            why = classify(exc)
            if why.kind is Kind.ENVIRONMENTAL:
                self._metrics.db_environmental_errors.inc()
            if why.kind is Kind.PERMANENT:
                # A window is numbers and short text: a refusal is a bug or a
                # schema problem that no retry fixes; say what was dropped.
                self._metrics.stream_stats_windows.labels("lost").inc(len(writes))
                log.error("stream stats: the database refused %d window(s) (%s); LOST: %s",
                          len(writes), why.reason, _describe(windows))
                return len(writes)
            self._outage.failed(describe_db_error(exc, why))
            self._park(writes)
            return len(writes)
        self._outage.ok()
        self._metrics.stream_stats_windows.labels("written").inc(len(writes))
        return len(writes)

    def _prune(self, cur: Cursor) -> None:
        now = time.monotonic()
        if now - self._pruned_at < _PRUNE_EVERY_SECS:
            return
        self._pruned_at = now
        cur.execute(_PRUNE, (self._clock() - WRITE_IDS_KEPT,))

    def _park(self, writes: list[tuple[uuid.UUID, Window]]) -> None:
        entries: dict[int, list[bytes]] = {}
        for wid, window in writes:
            entries.setdefault(window.account_id, []).append(record_entry(KIND, window.to_record(wid)))
        try:
            self._deadletters.park_many(entries)
        except REDIS_ERRORS as exc:
            log.warning("stream stats: Redis refused %d window(s) (%s); spooling them",
                        len(writes), exc)
        else:
            self._metrics.stream_stats_windows.labels("parked").inc(len(writes))
            return
        flat = [e for batch in entries.values() for e in batch]
        if self._spool is not None:
            try:
                self._spool.append(SPOOL_KIND, flat)
            except (SpoolError, OSError) as exc:
                log.error("stream stats: the spool refused them too (%s)", exc)
            else:
                self._metrics.stream_stats_windows.labels("parked").inc(len(writes))
                return
        self._metrics.stream_stats_windows.labels("lost").inc(len(writes))
        log.error("stream stats: %d window(s) LOST (database, Redis and the spool refused "
                  "them): %s", len(writes), _describe([w for _, w in writes]))

    # -- replay -------------------------------------------------------------------------

    def write_record(self, cur: Cursor, ev: PlatformEvent) -> bool:
        """The `RecordWriter` of kind "stream_stats": merge one parked window, once."""
        try:
            window = Window.from_record(ev)
        except (KeyError, TypeError, ValueError) as exc:
            # A ValueError is "permanent": the retry worker quarantines it.
            raise ValueError(f"parked stream stats window {ev.id} is malformed: "
                             f"{exc!r}"[:300]) from exc
        new = merge_windows(cur, [(ev.id, window)]) > 0
        if new:
            self._metrics.stream_stats_windows.labels("replayed").inc()
        return new


def canary_record(cur: Cursor, ev: PlatformEvent) -> None:
    """The `RecordCanary` of kind "stream_stats": a one-sample window merged on a fresh id."""
    merge_windows(cur, [(uuid.uuid4(), Window(ev.account_id, ev.platform, minute_of(ev.created_at),
                                               0.0, 0, 1))])


def _describe(windows: Sequence[Window]) -> str:
    shown = ", ".join(f"account {w.account_id} {w.platform} {w.ts:%Y-%m-%dT%H:%MZ} "
                      f"avg {w.average:.1f} max {w.maximum} n {w.samples}" for w in windows[:5])
    more = f" and {len(windows) - 5} more" if len(windows) > 5 else ""
    return shown + more
