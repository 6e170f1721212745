"""`stream_sessions`: when an account was live, opened by `stream.online`, closed by `stream.offline`.

Shared by every platform (the sockets, webhooks and the stream-status poller):
a `StreamChange` names its platform.

Both writes are idempotent, so a redelivered or replayed notification
changes nothing:

- online: the row keyed by (account, platform, stream id) is inserted unless
  it exists (the unique index `stream_sessions_external_idx`); a session of
  the same account still open from an earlier stream (its offline never
  came: a gap) is closed at the new stream's start;
- offline (it carries no stream id): every open session of the account that
  started at or before the offline time is closed at that time.

One fact, one `events` row, whichever path saw it (docs/platforms.rst,
"Stream sessions: one fact, one row"): a `stream.online` is keyed by the stream id on the socket, the
webhook and the poller alike. A `stream.offline` from Twitch names no stream,
so its key is made here, `offline_external_id(stream id)`, from the stream
it ends: the latest session of the account and platform that started at or
before the offline time (`stream_before`: this process's own last online
first, else a bounded look-up in `stream_sessions`). The stream-status
poller keys its own offline the same way, so a socket offline and a polled
offline of one stream are one row in either order. When no stream is known
(the database is unreachable and this process saw no online), the delivery
id stays the key.

`open_streams()` lists the open sessions of some accounts (the poller closes
the ones it finds offline).

A write that fails (the database is down) is kept in a small in-memory list
and retried, in order, by `retry_pending()` (the source's idle timer, and
every later change); the events themselves are durable on their own path
(stored, parked or spooled). With the event path's `breaker` (db/breaker.py),
neither a write nor the `stream_before` look-up is tried while it says the
database is unwell (the change waits in the list): they run on the thread
that reads a socket, which must not wait for a timeout per change; their
outcomes are reported to it. Durable when `apply` returns True: committed.
What is still pending when the process stops is logged and dropped: the
stored `stream.online`/`stream.offline` events are the record it can be
rebuilt from.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime

from lumio_ingestd.db.breaker import DatabaseBreaker
from lumio_ingestd.db.errors import classify, describe_db_error
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import OpenSession, StreamChange

log = logging.getLogger("lumio_ingestd.sessions")



_CLOSE_EARLIER = """
UPDATE stream_sessions SET ended_at = %(at)s
WHERE account_id = %(account)s AND platform = %(platform)s AND ended_at IS NULL
  AND started_at < %(at)s AND external_id IS DISTINCT FROM %(stream)s
"""
_OPEN = """
INSERT INTO stream_sessions (account_id, platform, external_id, started_at)
VALUES (%(account)s, %(platform)s, %(stream)s, %(at)s)
ON CONFLICT (account_id, platform, external_id) WHERE external_id IS NOT NULL DO NOTHING
"""
_CLOSE = """
UPDATE stream_sessions SET ended_at = %(at)s
WHERE account_id = %(account)s AND platform = %(platform)s AND ended_at IS NULL
  AND started_at <= %(at)s
"""




_STREAM_BEFORE = """
SELECT external_id FROM stream_sessions
WHERE account_id = %(account)s AND platform = %(platform)s AND external_id IS NOT NULL
  AND started_at <= %(at)s
ORDER BY started_at DESC LIMIT 1
"""
_OPEN_STREAMS = """
SELECT account_id, external_id, started_at FROM stream_sessions
WHERE platform = %(platform)s AND account_id = ANY(%(accounts)s) AND ended_at IS NULL
ORDER BY started_at
"""




class StreamSessions:
    def __init__(self, pool: Pool, metrics: Metrics, *, timeout_secs: float = 3.0,
                 retry_every_secs: float = 5.0, max_pending: int = 1000,
                 clock: Callable[[], float] = time.monotonic,
                 breaker: DatabaseBreaker | None = None) -> None:
        self._pool = pool
        self._breaker = breaker
        self._metrics = metrics
        self._timeout = timeout_secs
        self._retry_every = retry_every_secs
        self._clock = clock
        self._pending: deque[tuple[int, StreamChange]] = deque(maxlen=max_pending)
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._next_retry = 0.0
        # (account, platform) -> (stream id, start) of the last online applied here.
        self._last_online: dict[tuple[int, str], tuple[str, datetime]] = {}

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def apply(self, account_id: int, change: StreamChange) -> bool:
        """Write the change (after any earlier ones still pending); True when committed."""
        with self._lock:
            self._pending.append((account_id, change))
            if change.kind == "online" and change.stream_id:
                key = (account_id, change.platform)
                last = self._last_online.get(key)
                if last is None or last[1] <= change.at:
                    self._last_online[key] = (change.stream_id, change.at)
        return self._flush()

    def stream_before(self, account_id: int, platform: str, at: datetime) -> str | None:
        """The id of the latest stream that started at or before `at`, if one is known.

        This process's own last online first; else one bounded look-up in
        `stream_sessions`. None when neither knows (or the database fails).
        """
        with self._lock:
            last = self._last_online.get((account_id, platform))
        if last is not None and last[1] <= at:
            return last[0]
        if not self._allowed():
            log.warning("stream session look-up for account %s skipped (the database is "
                        "unavailable); the offline keeps its delivery id", account_id)
            return None
        try:
            with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
                cur.execute(_STREAM_BEFORE, {"account": account_id, "platform": platform, "at": at})
                row = cur.fetchone()
        except Exception as exc:  # noqa: BLE001 - the caller falls back to the delivery id
            self._failed(exc)
            log.warning("stream session look-up for account %s failed (%s); the offline keeps "
                        "its delivery id", account_id, classify(exc).reason)
            return None
        self._answered()
        return str(row[0]) if row is not None and row[0] is not None else None

    def open_streams(self, platform: str, accounts: list[int]) -> dict[int, OpenSession]:
        """Account -> its open session (the latest, if several) on `platform`; raises on failure."""
        if not accounts:
            return {}
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            cur.execute(_OPEN_STREAMS, {"platform": platform, "accounts": accounts})
            rows = cur.fetchall()
        return {int(a): OpenSession(str(s) if s is not None else None, started)
                for a, s, started in rows}

    def retry_pending(self) -> None:
        """Retry pending writes, at most every `retry_every_secs`."""
        if not self.pending() or self._clock() < self._next_retry:
            return
        self._flush()

    def _flush(self) -> bool:
        # One writer at a time keeps the changes in order; the others only
        # queue theirs and return, instead of waiting behind a hanging database.
        # The writer looks again after letting go, for what was queued meanwhile.
        while True:
            ok = self._drain()
            if not ok or not self.pending():
                return ok

    def _allowed(self) -> bool:
        return self._breaker is None or self._breaker.allows()

    def _failed(self, exc: BaseException) -> None:
        verdict = classify(exc)
        if self._breaker is not None and verdict.retryable:
            self._breaker.failed(describe_db_error(exc, verdict))

    def _answered(self) -> None:
        if self._breaker is not None:
            self._breaker.ok()

    def _drain(self) -> bool:
        if not self._allowed():
            self._next_retry = self._clock() + self._retry_every
            return False
        if not self._writing.acquire(blocking=False):
            return False
        try:
            while True:
                with self._lock:
                    if not self._pending:
                        return True
                    account_id, change = self._pending[0]
                try:
                    self._write(account_id, change)
                except Exception as exc:  # noqa: BLE001 - classified and kept for a retry
                    verdict = classify(exc)
                    self._failed(exc)
                    self._next_retry = self._clock() + self._retry_every
                    self._metrics.stream_session_writes.labels("failed").inc()
                    if not verdict.retryable:
                        with self._lock:
                            self._pending.popleft()
                        log.error("stream session %s for account %s refused by the database "
                                  "(%s); dropped", change.kind, account_id, verdict.reason)
                        continue
                    log.warning("stream session %s for account %s not written (%s); %d pending, "
                                "retried", change.kind, account_id, verdict.reason, self.pending())
                    return False
                self._answered()
                with self._lock:
                    self._pending.popleft()
                self._metrics.stream_session_writes.labels("ok").inc()
        finally:
            self._writing.release()

    def _write(self, account_id: int, change: StreamChange) -> None:
        params = {"account": account_id, "platform": change.platform, "stream": change.stream_id,
                  "at": change.at}
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            if change.kind == "online":
                cur.execute(_CLOSE_EARLIER, params)
                cur.execute(_OPEN, params)
            else:
                cur.execute(_CLOSE, params)

    def drop_pending(self) -> None:
        with self._lock:
            if self._pending:
                log.warning("%d stream session change(s) not written at stop; the stored "
                            "stream.online/offline events keep the record", len(self._pending))
            self._pending.clear()
