"""Persisting one platform event: inline insert, else park, else spool.

`EventIngest.persist_event(ev)` is what ingest paths call (platform sockets,
webhooks). The event already has its id and created_at (`PlatformEvent.new`
fixes them once, before any attempt). One inline insert is tried, bounded to
`[events] insert_timeout_secs` in total: the pool wait, every statement and
the commit count against one deadline, and a black-holed database is cut at
it. It is not tried at all, and the event goes straight to the park, while
the process's `breaker` (db/breaker.py) says the database is known unwell: a
failure was reported and nothing has answered since, or another insert has
gone unanswered for longer than its stall bound. So a black-holed database
holds a socket's thread for one insert timeout, not one per event. Then:

- stored (or already stored: a platform redelivery) -> the caller broadcasts;
- transient or environmental failure -> the whole entry (children included)
  is RPUSHed to `lumio:events:deadletter:{A}` and that key's TTL refreshed in
  one MULTI; counted `parked`. The caller gets the row the event will be
  stored as, so the live alert still goes out. Environmental failures (a
  missing table or grant) also raise `db_environmental_errors`;
- permanent failure (SQLSTATE class 22/23 and the like) -> nothing parked,
  counted `rejected`, the error returned;
- Redis refuses the park (or, with `[redis] min_replicas_acked` on, WAIT
  does not confirm it in time) -> the local spool (counted `parked` too: the event
  waits in the local tier, `spool_records{kind="event"}` tells the tiers
  apart); `lost` only when the spool refuses as well.

`insert_event(ev)` is the fail-fast variant for callers that can retry
themselves (REST emit): the same insert and bound, never parks.

Every insert here reports its outcome to the breaker (a transient or
environmental failure opens it, an answer closes it); `probe()` is the canary
the insert probe (events/probe.py) runs while it is open.

`stopping(deadline)` is called when the process stops: the sources must have
handed everything over by `deadline`. Inserts in flight are cut after
`STOP_GRACE_SECS` (their events parked), later ones are bounded to it, and
an event arriving when less than that plus `STOP_RESERVE_SECS` is left is
parked without trying: the drain parks rather than waits.

`event_spool_handler(ingest)` is what the spool replayer calls for event
records: park them in Redis (the retry worker stores them), or insert them
directly when Redis is down. Parked records (events/records.py) ride along:
the same park, or their writer from `EventIngest.records`.

Durable when `persist_event` returns: "stored"/"duplicate" -> committed in
the database; "parked" -> acknowledged by Redis (and by
`min_replicas_acked` replicas); "spooled" -> fsynced in the
spool; "rejected"/"lost" -> nowhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import redis

from lumio_ingestd import boundedjson
from lumio_ingestd.config import Config
from lumio_ingestd.db.breaker import DatabaseBreaker
from lumio_ingestd.db.errors import DeadlineExceeded, classify, describe_db_error
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events import store
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.events.records import RecordWriters, record_kind
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import MAX_ENTRY_BYTES, Classified, EntryError, Kind, PersistResult, PlatformEvent
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.replicas import replica_acks
from lumio_ingestd.stores.spool import SpoolError
from lumio_ingestd.worker import STOP_GRACE_SECS

log = logging.getLogger("lumio_ingestd.events.persist")


SPOOL_KIND = "event"

#: While stopping: what a source still needs after its last event to hand the rest over (its
#: chat queue to Redis, one round trip) and report stopped. An event arriving with less than
#: this plus `STOP_GRACE_SECS` left before the stop's deadline is parked without a try.
STOP_RESERVE_SECS = 1.0
#: The probe's bound never goes below this: with no idle connection it opens one, and libpq's
#: connect timeout is whole seconds, at least 2 (db/pool.py).
PROBE_MIN_SECS = 3.0


class EventSpool(Protocol):
    """The part of `lumio_ingestd.stores.spool.Spool` this module uses."""

    def append(self, kind: str, entries: Sequence[bytes]) -> None: ...




class EventIngest:
    def __init__(self, redis_client: redis.Redis, pool: Pool, spool: EventSpool | None,
                 metrics: Metrics, cfg: Config, *, records: RecordWriters | None = None,
                 breaker: DatabaseBreaker | None = None) -> None:
        self._pool = pool
        #: Writers of parked records (events/records.py), for the spool replay without Redis.
        self.records = records if records is not None else RecordWriters()
        self._spool = spool
        self.metrics = metrics
        self._timeout = cfg.events.insert_timeout_secs
        self.deadletters = DeadLetters(redis_client,
                                       acks=replica_acks(redis_client, cfg.redis, metrics))
        #: Whether the database is known unwell; one per process (the retry worker, the probe
        #: and the stream sessions share it: runtime/build.py).
        self.breaker = breaker if breaker is not None else DatabaseBreaker(
            "event inserts: the database", log)
        # Set once by stopping(): the sources' deadline (monotonic).
        self._stop_by: float | None = None

    # -- the two entry points ------------------------------------------------

    def persist_event(self, ev: PlatformEvent) -> PersistResult:
        """Store `ev` inline, or park it; see the module docstring. Never raises."""
        skip = self._why_not_try()
        if skip is not None:
            log.debug("event %s (account %s, %s) parked without an insert: %s",
                      ev.id, ev.account_id, ev.type, skip)
            return self._park(ev, f"not tried: {skip}", None)
        failure = self._insert(ev, path="inline")
        if isinstance(failure, PersistResult):
            return failure
        exc, why = failure
        if why.kind is Kind.PERMANENT:
            self.metrics.events_persist_failures.labels("rejected").inc()
            log.warning("event %s (account %s, %s) rejected by the database: %s",
                        ev.id, ev.account_id, ev.type, _short(exc))
            return PersistResult("rejected", ev, _short(exc), why.sqlstate)
        log.debug("event %s (account %s, %s) not stored inline (%s); parking it",
                  ev.id, ev.account_id, ev.type, why.reason)
        return self._park(ev, _short(exc), why.sqlstate)

    def insert_event(self, ev: PlatformEvent) -> PersistResult:
        """Store `ev` inline or say why not; never parks (the caller retries)."""
        failure = self._insert(ev, path="emit")
        if isinstance(failure, PersistResult):
            return failure
        exc, why = failure
        if why.kind is Kind.PERMANENT:
            self.metrics.events_persist_failures.labels("rejected").inc()
            return PersistResult("rejected", ev, _short(exc), why.sqlstate)
        return PersistResult("unavailable", ev, _short(exc), why.sqlstate)

    # -- the breaker and the stop ------------------------------------------------

    def probe(self) -> bool:
        """One canary insert, rolled back: True (and the breaker closed) when the database
        answered it; False (the breaker open) when it failed as transient or environmental.
        For the insert probe (events/probe.py)."""
        canary = PlatformEvent.new(account_id=0, platform="lumio", type="lumio.canary", payload={})
        try:
            deadline = time.monotonic() + max(self._timeout, PROBE_MIN_SECS)
            with self._pool.connection(deadline=deadline) as conn:
                store.insert_canary(conn, canary)
        except Exception as exc:  # noqa: BLE001 - classify() judges it
            why = classify(exc)
            if why.retryable:
                self.breaker.failed(describe_db_error(exc, why))
                return False
            # Refused for good: the database answered, whatever it has against the canary.
            log.warning("the insert probe's canary was refused (%s); taking it as an answer",
                        why.reason)
        self.breaker.ok()
        return True

    def stopping(self, deadline: float) -> None:
        """The process stops; the sources must have handed everything over by `deadline`
        (monotonic). Inserts in flight are cut after `STOP_GRACE_SECS` (their events are
        parked), later ones are bounded to it or not tried (see `_why_not_try`)."""
        self._stop_by = deadline
        for attempt in self.breaker.in_flight():
            self.cut_calls_of(attempt.thread, STOP_GRACE_SECS)

    def cut_calls_of(self, thread_ident: int | None, within_secs: float) -> None:
        """Cut the database calls a thread is making here after at most `within_secs` more."""
        self._pool.expire_calls_of(thread_ident, within_secs)

    def in_progress(self, threads: set[int]) -> int:
        """Inserts in flight on these threads: events whose outcome is not settled yet."""
        return sum(1 for attempt in self.breaker.in_flight() if attempt.thread in threads)

    def _why_not_try(self) -> str | None:
        """Why an inline insert is not tried now (the event is parked at once), or None."""
        if self.breaker.open:
            return "the database is unavailable"
        stalled = self.breaker.stalled()
        if stalled is not None:
            return f"another insert has waited {time.monotonic() - stalled.started:.1f}s for the database"
        stop_by = self._stop_by
        if stop_by is not None and stop_by - time.monotonic() < STOP_GRACE_SECS + STOP_RESERVE_SECS:
            return "stopping, too little time left"
        return None

    def _cut_if_stopped_since(self, stop_known: bool) -> None:
        """`stopping()` cuts the calls it finds in flight; one whose deadline was set before the
        stop but was not yet registered with the pool then is cut here, now that it is."""
        if not stop_known and self._stop_by is not None:
            self.cut_calls_of(threading.get_ident(), STOP_GRACE_SECS)

    def _deadline(self, started: float) -> float:
        """The one deadline of an insert that begins at `started`: the insert timeout, and while
        stopping no more than `STOP_GRACE_SECS` nor past the time the rest needs."""
        deadline = started + self._timeout
        stop_by = self._stop_by
        if stop_by is not None:
            deadline = min(deadline, started + STOP_GRACE_SECS, stop_by - STOP_RESERVE_SECS)
        return deadline

    # -- internals -------------------------------------------------------------

    def _insert(self, ev: PlatformEvent, *, path: str,
                kind: str | None = None) -> PersistResult | tuple[Exception, Classified]:
        """One bounded attempt: a result when it is settled, else the failure."""
        started = time.monotonic()
        writer = self.records.get(kind) if kind is not None else None
        if kind is not None and writer is None:
            return ValueError(f"no writer for records of kind {kind!r}"), Classified(
                Kind.PERMANENT, None, f"unknown record kind {kind!r}")
        # Read before the deadline: a stop after this is caught by _cut_if_stopped_since.
        stop_known = self._stop_by is not None
        deadline = self._deadline(started)
        if deadline <= started:  # stopping, and no time left: the database was not asked
            late = DeadlineExceeded("stopping: no time left for an insert")
            return late, classify(late)
        try:
            with self.breaker.attempt():
                if writer is not None:
                    with self._pool.transaction(deadline=deadline) as cur:
                        self._cut_if_stopped_since(stop_known)
                        new = writer(cur, ev)
                else:
                    # One round trip, its commit included: the pool's transaction
                    # would add a BEGIN and a COMMIT, each a wait for the server
                    # (the live p99 during a replay is those waits).
                    with self._pool.connection(deadline=deadline) as conn:
                        self._cut_if_stopped_since(stop_known)
                        new = store.insert_event_committed(conn, ev)
        # Any failure at all, a bug's included, must end with the event parked
        # rather than dropped by the caller's loop; classify() judges it.
        except Exception as exc:  # noqa: BLE001
            if store.already_stored(exc):
                self.breaker.ok()
                return PersistResult("duplicate", ev)
            why = classify(exc)
            if why.kind is Kind.ENVIRONMENTAL:
                self.metrics.db_environmental_errors.inc()
            if why.retryable:
                # One line per outage, not per event: at high event rates a
                # line each would hit journald's rate limit.
                self.breaker.failed(describe_db_error(exc, why))
            elif why.sqlstate is not None:
                self.breaker.ok()  # the database answered: the event is the problem
            return exc, why
        finally:
            if path == "inline":
                self.metrics.events_insert_duration.observe(time.monotonic() - started)
        self.breaker.ok()
        if not new:
            return PersistResult("duplicate", ev)
        if writer is None:  # a record's writer counts its own kind
            self.metrics.events_persisted.labels(path).inc()
        return PersistResult("stored", ev)

    def _park(self, ev: PlatformEvent, error: str, sqlstate: str | None) -> PersistResult:
        try:
            entry = ev.to_entry()
        except (UnicodeError, ValueError, TypeError) as exc:
            # Only an event built around PlatformEvent.new() can get here (new()
            # cleans every value); it could never be stored: refused, counted.
            self.metrics.events_persist_failures.labels("rejected").inc()
            log.error("event %s cannot be encoded for parking: %s", ev.id, type(exc).__name__)
            return PersistResult("rejected", ev, f"cannot be encoded: {type(exc).__name__}", None)
        try:
            self.deadletters.park(ev.account_id, [entry])
        except REDIS_ERRORS as exc:
            log.warning("event %s: Redis refused the park (%s); spooling it", ev.id, exc)
        else:
            self.metrics.events_persist_failures.labels("parked").inc()
            return PersistResult("parked", ev, error, sqlstate)
        if self._spool is not None:
            try:
                self._spool.append(SPOOL_KIND, [entry])
            # SpoolError counted spool_lost itself; the event is ours to count.
            except (SpoolError, OSError) as exc:
                log.error("event %s (account %s, %s) LOST: database, Redis and the spool "
                          "all refused it (spool: %s)", ev.id, ev.account_id, ev.type, exc)
            else:
                self.metrics.events_persist_failures.labels("parked").inc()
                return PersistResult("spooled", ev, error, sqlstate)
        else:
            log.error("event %s (account %s, %s) LOST: database and Redis refused it and "
                      "there is no spool", ev.id, ev.account_id, ev.type)
        self.metrics.events_persist_failures.labels("lost").inc()
        return PersistResult("lost", ev, error, sqlstate)

    def store_replayed(self, ev: PlatformEvent, kind: str | None = None) -> PersistResult:
        """Insert an event (or a record of `kind`) that waited in a durable tier.

        "stored" counts `events_persisted{path="replay"}`, "duplicate" counts
        `recovered`; a failure is returned as "unavailable" (retryable) or
        "rejected" (counted), never parked.
        """
        failure = self._insert(ev, path="replay", kind=kind)
        if isinstance(failure, PersistResult):
            if failure.outcome == "duplicate":
                self.metrics.events_persist_failures.labels("recovered").inc()
            return failure
        exc, why = failure
        if why.kind is Kind.PERMANENT:
            self.metrics.events_persist_failures.labels("rejected").inc()
            return PersistResult("rejected", ev, _short(exc), why.sqlstate)
        return PersistResult("unavailable", ev, _short(exc), why.sqlstate)


class SpoolReplayError(Exception):
    """Neither Redis nor the database took a spooled batch; the spool keeps it."""


def event_spool_handler(ingest: EventIngest) -> Callable[[str, list[bytes]], None]:
    """The spool replayer's handler for "event" records.

    It parks the batch in Redis (one MULTI for all its accounts), where the
    retry worker stores it with the original ids; when Redis refuses, it
    inserts each event directly. It raises `SpoolReplayError` when neither
    worked, so the spool keeps the record for the next replay. Events the
    database rejects outright are counted and skipped, or they would block
    the spool forever; an entry that cannot be decoded is logged and counted
    `lost` for the same reason. Records of another kind raise ValueError: the
    composition root dispatches chat records elsewhere.
    """

    def handle(kind: str, entries: list[bytes]) -> None:
        if kind != SPOOL_KIND:
            raise ValueError(f"event spool handler given a {kind!r} record")
        events: list[tuple[PlatformEvent, bytes, str | None]] = []
        for raw in entries:
            try:
                events.append((PlatformEvent.from_entry(raw), raw, record_kind(raw)))
            except EntryError as exc:
                ingest.metrics.events_persist_failures.labels("lost").inc()
                log.error("spooled event entry cannot be decoded, LOST: %s (%s)", exc, _peek(raw))
        if not events:
            return
        by_account: dict[int, list[bytes]] = {}
        for ev, raw, _ in events:
            by_account.setdefault(ev.account_id, []).append(raw)
        try:
            ingest.deadletters.park_many(by_account)
            return
        except REDIS_ERRORS as exc:
            log.warning("spool replay: Redis refused %d event(s) (%s); inserting directly",
                        len(events), exc)
        for ev, _, record in events:
            result = ingest.store_replayed(ev, record)
            if result.outcome == "unavailable":
                raise SpoolReplayError(
                    f"spooled events: Redis and the database both refused them ({result.error})")
            if result.outcome == "rejected":
                log.error("spooled event %s (account %s) rejected by the database: %s",
                          ev.id, ev.account_id, result.error)

    return handle


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _peek(raw: bytes) -> str:
    """Which account an undecodable entry names, for the log (never the payload)."""
    try:
        obj = boundedjson.loads(raw, max_bytes=MAX_ENTRY_BYTES)
        return f"account {obj.get('account_id')!r}" if isinstance(obj, dict) else "not an object"
    except ValueError:
        return f"{len(raw)} bytes, not JSON"
