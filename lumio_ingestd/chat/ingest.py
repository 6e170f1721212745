"""Handing chat over to storage: `buffer_or_persist` and the sources' in-memory queue.

The tiers, in order, for every message:

1. **buffered**: RPUSH onto `lumio:chat:buffer:{ACCOUNT}` (one pipelined
   RPUSH per account per batch); the flusher stores it later. With
   `[redis] min_replicas_acked` N > 0 it counts buffered (and leaves the
   source's memory) only once WAIT says N replicas hold it; a push WAIT does
   not confirm in time is handled like a refused one (stores/replicas.py).
2. **direct**: if Redis refused (down, OOM, READONLY, MISCONF, timeout),
   insert it at once, idempotently and with poison isolation, bounded by
   `[events] insert_timeout_secs` in all (pool wait included): sources are
   serial, and a longer wait would stall their sockets. Rows the database
   refuses for good go to the Redis quarantine (if Redis refuses that too,
   they take the next tier like the rest).
3. **spooled**: if the database failed too, append to the local spool
   (fsync'd when `append` returns); `chat_spool_handler` replays it to Redis or
   the database once either is back.
4. **lost**: only if the spool refused as well; counted and logged at error
   level (counts and reasons only, never chat text).

Each message is counted once in `chat_messages_total{path}`. A pipeline that
failed half-way may have pushed part of a batch; that part is stored twice
(direct and via the buffer), which the idempotent insert turns into one row.

After a Redis or database failure the tier is skipped for `retry_after_secs`
(then tried again), so an outage costs a source one timeout per second, not
one per batch.

`ChatQueue` is the bounded in-memory queue a source keeps: messages are
handed over in batches of up to `max_batch`, or once the oldest has waited
`max_delay_secs`, and all at once by `drain()` when the source stops. What is
in the queue is the only chat not yet durable anywhere (a SIGKILL loses it),
which is why it is small and short-lived.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import redis

from lumio_ingestd.chat.batch import record_db_failure
from lumio_ingestd.chat.decode import decode_entry
from lumio_ingestd.chat.store import DB_ERRORS, store_isolating
from lumio_ingestd.config import Config
from lumio_ingestd.db.errors import classify, describe_db_error
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage, EntryError
from lumio_ingestd.outage import Outage, describe_redis_error
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.quarantine import quarantine_entry
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.replicas import ReplicaAcks
from lumio_ingestd.stores.spool import Spool, SpoolError

log = logging.getLogger("lumio_ingestd.chat.ingest")

_Pending = list[tuple[ChatMessage, bytes]]


class ReplayDeferred(Exception):
    """Spooled chat could not be placed yet (the spool keeps it). The text holds no row values."""


class ChatIngest:
    def __init__(self, client: redis.Redis, pool: Pool, spool: Spool | None, metrics: Metrics,
                 cfg: Config, *, direct_timeout_secs: float | None = None,
                 retry_after_secs: float = 1.0) -> None:
        self._client = client
        self._acks = ReplicaAcks(client, cfg.redis, metrics)
        self._pool = pool
        self._spool = spool
        self.metrics = metrics
        self.direct_timeout_secs = (direct_timeout_secs if direct_timeout_secs is not None
                                    else cfg.events.insert_timeout_secs)
        self._redis = Outage("Redis (chat ingest)", log, retry_after_secs)
        self._db = Outage("database (chat ingest)", log, retry_after_secs)
        self._lock = threading.Lock()  # the outage states are shared by the sources' threads

    def buffer_or_persist(self, msg: ChatMessage) -> str:
        """Store one message through the first tier that takes it; returns that tier."""
        counts = self.persist_batch([msg])
        return next(iter(counts))

    def persist_batch(self, msgs: Sequence[ChatMessage]) -> Counter[str]:
        """Store a batch through the tiers; returns how many messages each tier took."""
        counts: Counter[str] = Counter()
        if not msgs:
            return counts
        left: _Pending = [_with_entry(m) for m in msgs]
        sanitized = sum(1 for m, _ in left if m.sanitized)
        if sanitized:
            self.metrics.chat_sanitized.inc(sanitized)
        left = self._buffer(left, counts)
        if left:
            left = self._direct(left, counts)
        if left:
            self._to_spool(left, counts)
        for path, n in counts.items():
            self.metrics.chat_messages.labels(path).inc(n)
        return +counts

    def replay_spooled(self, entries: Sequence[bytes]) -> None:
        """Put spooled entries back: Redis first, the database second.

        Raises ReplayDeferred when neither took them all (the spool then
        keeps the record; rows already placed are placed again harmlessly).
        """
        pending: _Pending = []
        for raw in entries:
            try:
                msg = decode_entry(raw)
            except EntryError:
                # Without a readable account id there is no list to put it in.
                self.metrics.chat_messages.labels("lost").inc()
                log.error("chat: an unreadable entry in the spool was dropped (counted lost)")
                continue
            pending.append((msg, msg.to_entry()))
        try:
            left = self._push(pending)
        except REDIS_ERRORS as exc:
            with self._lock:
                self._redis.failed(describe_redis_error(exc))
            left = pending
        if not left:
            return
        try:
            _, culprits = store_isolating(self._pool, [m for m, _ in left],
                                          time.monotonic() + self.direct_timeout_secs)
        except DB_ERRORS as exc:
            verdict = classify(exc)
            with self._lock:
                record_db_failure(self.metrics, self._db, exc, verdict)
            # Raised without the driver's text: a COPY error quotes the row it was on.
            raise ReplayDeferred(f"Redis and the database refused: {describe_db_error(exc, verdict)}"
                                 ) from None
        with self._lock:
            self._db.ok()
        if culprits:
            entry_of = {id(m): e for m, e in left}
            try:
                self._quarantine([(m, entry_of[id(m)],
                                   quarantine_entry(entry_of[id(m)], v.reason, v.sqlstate))
                                  for m, v in culprits])
            except REDIS_ERRORS as exc:
                raise ReplayDeferred(f"refused messages cannot be quarantined: "
                                     f"{describe_redis_error(exc)}") from None

    # -- the tiers ---------------------------------------------------------------

    def _buffer(self, pending: _Pending, counts: Counter[str]) -> _Pending:
        # Read without the lock: every source thread passes here at each hand-over, and a
        # stale answer costs at most one try too many or too few. Taking the lock here (and
        # for `ok()` below, healthy or not) made 16 source threads queue on it (measured).
        if not self._redis.should_try():
            return pending
        try:
            left = self._push(pending)
        except REDIS_ERRORS as exc:
            with self._lock:
                self._redis.failed(describe_redis_error(exc))
            return pending
        counts["buffered"] += len(pending) - len(left)
        return left

    def _push(self, pending: _Pending) -> _Pending:
        """One pipelined RPUSH per account; returns what was not pushed.

        With `min_replicas_acked` on, one pipeline per Redis node (one on a
        single server) ends with a WAIT; a node's accounts whose WAIT did not
        confirm count as not pushed (they take the next tier; what did reach
        Redis is stored once anyway). Raises REDIS_ERRORS when the pipeline as
        a whole failed (WAIT off: the one pipeline; on: every node's).
        """
        if not pending:
            return []
        by_account: dict[int, _Pending] = {}
        for item in pending:
            by_account.setdefault(item[0].account_id, []).append(item)
        keys = {rediskeys.chat_buffer(account): account for account in by_account}
        left: _Pending = []
        refusal: BaseException | None = None
        groups = self._acks.groups(list(keys))
        for group in groups:
            def queue(pipe: Any, group: list[str] = group) -> None:
                for key in group:
                    pipe.rpush(key, *[entry for _, entry in by_account[keys[key]]])
            try:
                results = self._acks.run(group[0], queue, write="chat", raise_on_error=False)
            except REDIS_ERRORS as exc:
                if len(groups) == 1:
                    raise
                refusal = exc
                for key in group:
                    left.extend(by_account[keys[key]])
                continue
            for key, result in zip(group, results, strict=True):
                if isinstance(result, BaseException):
                    refusal = result
                    left.extend(by_account[keys[key]])
        if len(left) == len(pending) and refusal is not None and len(groups) > 1:
            raise refusal
        if refusal is not None or self._redis.down:
            with self._lock:
                if refusal is not None:
                    self._redis.failed(describe_redis_error(refusal))
                else:
                    self._redis.ok()
        return left

    def _direct(self, pending: _Pending, counts: Counter[str]) -> _Pending:
        with self._lock:
            if not self._db.should_try():
                return pending
        try:
            _, culprits = store_isolating(self._pool, [m for m, _ in pending],
                                          time.monotonic() + self.direct_timeout_secs)
        except DB_ERRORS as exc:
            with self._lock:
                record_db_failure(self.metrics, self._db, exc, classify(exc))
            return pending
        with self._lock:
            self._db.ok()
        if not culprits:
            counts["direct"] += len(pending)
            return []
        entry_of = {id(m): e for m, e in pending}
        bad = [(m, entry_of[id(m)], quarantine_entry(entry_of[id(m)], v.reason, v.sqlstate))
               for m, v in culprits]
        counts["direct"] += len(pending) - len(bad)
        try:
            self._quarantine(bad)
        except REDIS_ERRORS as exc:
            # Not storable and no quarantine: keep them in the spool until Redis is back.
            log.warning("chat: %d refused messages cannot be quarantined (%s); spooling them",
                        len(bad), describe_redis_error(exc))
            return [(m, entry) for m, entry, _ in bad]
        counts["direct"] += len(bad)
        return []

    def _quarantine(self, bad: Sequence[tuple[ChatMessage, bytes, bytes]]) -> None:
        by_key: dict[str, list[bytes]] = {}
        for msg, _, q_entry in bad:
            by_key.setdefault(rediskeys.chat_quarantine(msg.account_id), []).append(q_entry)
        # All or nothing for the caller: a group that fails raises, and the caller
        # spools every one of them again (a repeat in the quarantine is harmless).
        for group in self._acks.groups(list(by_key)):
            def queue(pipe: Any, group: list[str] = group) -> None:
                for key in group:
                    pipe.rpush(key, *by_key[key])
            self._acks.run(group[0], queue, write="chat_quarantine")
        self.metrics.chat_quarantined.inc(len(bad))
        log.warning("chat: %d messages the database refuses were quarantined", len(bad))

    def _to_spool(self, pending: _Pending, counts: Counter[str]) -> None:
        if self._spool is None:
            reason = "no spool"
        else:
            try:
                self._spool.append("chat", [entry for _, entry in pending])
            except SpoolError as exc:
                reason = exc.reason
            else:
                counts["spooled"] += len(pending)
                return
        counts["lost"] += len(pending)
        log.error("chat: %d messages LOST: Redis and the database refused them and the spool "
                  "could not take them (%s)", len(pending), reason)


def _with_entry(msg: ChatMessage) -> tuple[ChatMessage, bytes]:
    """The message and its entry; one built past the edge (`ChatMessage(...)`
    with a lone surrogate) is repaired here rather than failing the batch."""
    try:
        return msg, msg.to_entry()
    except UnicodeError:
        fixed = ChatMessage.create(
            platform=msg.platform, account_id=msg.account_id, message_id=msg.message_id,
            created_at=msg.created_at, user_id=msg.user_id, user_login=msg.user_login,
            display_name=msg.display_name, text=msg.text, extras=msg.extras)
        return fixed, fixed.to_entry()


def chat_spool_handler(ingest: ChatIngest) -> Callable[[str, list[bytes]], None]:
    """The spool replay handler for chat records (Redis first, then the database)."""

    def handle(kind: str, entries: list[bytes]) -> None:
        if kind != "chat":
            raise ValueError(f"chat_spool_handler got a {kind!r} record")
        ingest.replay_spooled(entries)

    return handle


class ChatQueue:
    """A source's bounded in-memory persistence queue.

    `add` hands the queue to `persist_batch` when it holds `max_batch`
    messages or its oldest has waited `max_delay_secs`; `poll` (called by the
    source after every read or read timeout) does the latter without a new
    message; `drain` hands over everything (the source calls it before it
    reports stopped). Flushes run on the caller's thread.

    One thread owns a queue: its source's, which is the only caller of
    `add`, `poll`, `drain` and `next_due` (from `read_once`, `idle` and
    `release`, all on that thread), so no lock is taken per message. The one
    reader from elsewhere is the depth gauge, through `held()` when metrics
    are scraped (a list length and an int: each read is atomic).
    """

    def __init__(self, ingest: ChatIngest, metrics: Metrics, *, max_batch: int = 200,
                 max_delay_secs: float = 0.1, clock: Callable[[], float] = time.monotonic,
                 step_aside: Callable[[], None] | None = None) -> None:
        self.max_batch = max(1, max_batch)
        #: Called before each message joins: waits while an event is on its way (eventgate.py).
        self._step_aside = step_aside
        self.max_delay_secs = max_delay_secs
        self._ingest = ingest
        self._clock = clock
        self._items: list[ChatMessage] = []
        self._oldest = 0.0
        # Taken out of `_items` for a hand-over that has not returned: still only in memory.
        self._in_flight = 0
        self.totals: Counter[str] = Counter()
        metrics.hold_chat(self)

    def __len__(self) -> int:
        return len(self._items)

    def held(self) -> int:
        """Messages in memory and not yet taken by a tier (`chat_persistence_queue_depth`)."""
        return len(self._items) + self._in_flight

    def next_due(self) -> float | None:
        """When the oldest message must be handed over (clock time), or None if empty."""
        return self._oldest + self.max_delay_secs if self._items else None

    def add(self, msg: ChatMessage, now: float | None = None) -> None:
        if self._step_aside is not None:
            self._step_aside()
        now = self._clock() if now is None else now
        items = self._items
        if not items:
            self._oldest = now
        items.append(msg)
        if len(items) >= self.max_batch or now - self._oldest >= self.max_delay_secs:
            self._hand_over()

    def poll(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        if self._items and now - self._oldest >= self.max_delay_secs:
            self._hand_over()

    def drain(self) -> Counter[str]:
        """Hand over everything held; returns the tiers that took it."""
        return self._hand_over()

    def _hand_over(self) -> Counter[str]:
        items, self._items = self._items, []
        self._in_flight = len(items)
        try:
            counts = self._ingest.persist_batch(items)
        except Exception:
            # persist_batch counts everything it cannot place; an error escaping it anyway (a
            # bug) must not make a batch vanish uncounted: it stays queued for the next hand-over
            # and for release() (a repeat of what a tier took already is idempotent downstream).
            self._items = items + self._items
            raise
        finally:
            self._in_flight = 0
        self.totals.update(counts)
        return counts
