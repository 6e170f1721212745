"""Persisting one platform event: inline insert, else park, else spool.

`EventIngest.persist_event(ev)` is what ingest paths call (platform sockets,
webhooks). The event already has its id and created_at (`PlatformEvent.new`
fixes them once, before any attempt). One inline insert is tried, bounded to
`[events] insert_timeout_secs` in total: the pool wait, every statement and
the commit count against one deadline, and a black-holed database is cut at
it. Then:

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
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import redis

from lumio_ingestd import boundedjson
from lumio_ingestd.config import Config
from lumio_ingestd.db.errors import classify, describe_db_error
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events import store
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.events.records import RecordWriters, record_kind
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import MAX_ENTRY_BYTES, Classified, EntryError, Kind, PersistResult, PlatformEvent
from lumio_ingestd.outage import Outage
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.replicas import replica_acks
from lumio_ingestd.stores.spool import SpoolError

log = logging.getLogger("lumio_ingestd.events.persist")


SPOOL_KIND = "event"


class EventSpool(Protocol):
    """The part of `lumio_ingestd.stores.spool.Spool` this module uses."""

    def append(self, kind: str, entries: Sequence[bytes]) -> None: ...




class EventIngest:
    def __init__(self, redis_client: redis.Redis, pool: Pool, spool: EventSpool | None,
                 metrics: Metrics, cfg: Config, *, records: RecordWriters | None = None) -> None:
        self._pool = pool
        #: Writers of parked records (events/records.py), for the spool replay without Redis.
        self.records = records if records is not None else RecordWriters()
        self._spool = spool
        self.metrics = metrics
        self._timeout = cfg.events.insert_timeout_secs
        self.deadletters = DeadLetters(redis_client,
                                       acks=replica_acks(redis_client, cfg.redis, metrics))
        self._db_outage = Outage("event inserts: the database", log)

    # -- the two entry points ------------------------------------------------

    def persist_event(self, ev: PlatformEvent) -> PersistResult:
        """Store `ev` inline, or park it; see the module docstring. Never raises."""
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

    # -- internals -------------------------------------------------------------

    def _insert(self, ev: PlatformEvent, *, path: str,
                kind: str | None = None) -> PersistResult | tuple[Exception, Classified]:
        """One bounded attempt: a result when it is settled, else the failure."""
        started = time.monotonic()
        writer = self.records.get(kind) if kind is not None else None
        if kind is not None and writer is None:
            return ValueError(f"no writer for records of kind {kind!r}"), Classified(
                Kind.PERMANENT, None, f"unknown record kind {kind!r}")
        try:
            if writer is not None:
                with self._pool.transaction(deadline=started + self._timeout) as cur:
                    new = writer(cur, ev)
            else:
                # One round trip, its commit included: the pool's transaction
                # would add a BEGIN and a COMMIT, each a wait for the server
                # (the live p99 during a replay is those waits).
                with self._pool.connection(deadline=started + self._timeout) as conn:
                    new = store.insert_event_committed(conn, ev)
        # Any failure at all, a bug's included, must end with the event parked
        # rather than dropped by the caller's loop; classify() judges it.
        except Exception as exc:  # noqa: BLE001
            if store.already_stored(exc):
                return PersistResult("duplicate", ev)
            why = classify(exc)
            if why.kind is Kind.ENVIRONMENTAL:
                self.metrics.db_environmental_errors.inc()
            if why.retryable:
                # One line per outage, not per event: at high event rates a
                # line each would hit journald's rate limit.
                self._db_outage.failed(describe_db_error(exc, why))
            return exc, why
        finally:
            if path == "inline":
                self.metrics.events_insert_duration.observe(time.monotonic() - started)
        self._db_outage.ok()
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
