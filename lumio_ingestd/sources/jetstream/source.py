"""The Bluesky Jetstream source: the records of the accounts' DIDs, with a forward-only cursor.

One thread, one `websocket-client` connection (it starts no threads of its
own) to `[jetstream] url`, asking for `wantedCollections` (the configured
NSIDs) and `wantedDids` (every configured account's `bluesky_did`). Frames are
decoded by `jetstream.protocol`; a refused frame is logged with its reason,
counted in `source_bad_frames{platform="bluesky",reason}` and skipped.

Batches. Decoded events wait in memory until `batch_max` of them arrived or
the oldest waited `batch_window_secs`; then one transaction writes the
commits and moves the cursor to the newest `time_us` of the batch
(`jetstream.store.apply`). Identity and account events, and commits outside
the filters, are not stored but move the cursor like the rest: every event
handled moves it once committed. A batch is also written when the connection
drops and when the source stops.

Cursor. On every connect and reconnect the saved cursor is read from the
database and the source asks for `saved - rewind_secs` (in microseconds,
clamped at 0): Jetstream cursors are time-based and several events can share
a `time_us`, so resuming exactly at the boundary could skip some; the store is
idempotent, so the replay is harmless. No saved cursor: the source starts
live and logs that; until its first commit, a reconnect resumes from the
time it went live (kept in memory only). A requested cursor older than
`retention_secs` (24 h: the smallest retention reported for the public
instances) is still asked for, since the server clamps it to its oldest event,
but is logged as a possible gap and counted in `jetstream_cursor_gaps`. Age
is the only signal: with `wantedDids`, a long silence after the cursor is
normal, so "the first event is far beyond the cursor" proves nothing.

Failure. When a batch cannot be written (the database is down), the batch is
dropped from memory, the cursor stays where it was, and the connection is
closed; reconnecting needs the saved cursor, so the source backs off until
the database answers again and then replays from `saved - rewind`, which
covers the dropped batch (all of it is newer than the saved cursor). A batch
the database refuses for good is retried one commit at a time; only the
refused commits are skipped (logged, `jetstream_records{result="refused"}`).

Liveness. Jetstream streams continuously, but a filtered stream can be quiet
for hours, so the source pings when nothing arrived for `ping_interval_secs`;
a socket silent (no frame, no pong) for `read_timeout_secs` is dead and is
reconnected. `wake()` closes the socket from any thread, so a stop is prompt.

Live alert: a create of app.bsky.feed.post that the store actually wrote (not
a replay of a stored one) is handed to `on_post(account_id, payload)` after
the commit, once per account with that DID.

Durable when a batch's transaction commits: its records and the cursor up
to its newest event. What was received but not committed is not durable here;
the server keeps it and the rewound cursor asks for it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import websocket

from lumio_ingestd.config import AccountConfig, JetstreamConfig
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import GapKey, Kind
from lumio_ingestd.sources.base import Source, SourceClosed
from lumio_ingestd.sources.interfaces import FrameSink, JetstreamStore
from lumio_ingestd.sources.jetstream.protocol import (
    MAX_DIDS,
    MAX_URL_CHARS,
    Account,
    ApplyResult,
    BadFrame,
    Commit,
    Event,
    Heartbeat,
    Identity,
    collection_wanted,
    decode,
    options_update,
    resume_cursor,
    subscribe_url,
)

log = logging.getLogger("lumio_ingestd.sources.jetstream")

POST_COLLECTION = "app.bsky.feed.post"
MAX_TIME_PLACEHOLDER = 10**16  # a cursor of the longest length, for sizing the URL
ALERT_TYPE = "bluesky.post"

OnPost = Callable[[int, dict[str, Any]], None]


class JetstreamSource(Source):
    platform = "bluesky"
    gap_source = "jetstream"
    gap_mode = "healed"  # the cursor rewinds over the gap on every reconnect
    up_on_connect = True

    def __init__(self, cfg: JetstreamConfig, accounts: Sequence[AccountConfig], db: JetstreamStore,
                 metrics: Metrics, *,
                 on_post: OnPost | None = None,
                 cursor_name: str = "default",
                 name: str = "jetstream",
                 read_timeout_secs: float = 60.0,
                 ping_interval_secs: float = 20.0,
                 connect_timeout_secs: float = 10.0,
                 batch_max: int = 500,
                 batch_window_secs: float = 0.25,
                 write_timeout_secs: float = 10.0,
                 stop_write_timeout_secs: float = 3.0,
                 retention_secs: float = 24 * 3600.0,
                 clock: Callable[[], float] = time.time,
                 frames: FrameSink | None = None) -> None:
        super().__init__(name, metrics, frames=frames)
        self.url = cfg.url
        self.collections = cfg.collections
        self.rewind_secs = cfg.rewind_secs
        self.db = db
        self.on_post = on_post
        self.cursor_name = cursor_name
        self.read_timeout_secs = read_timeout_secs
        # A ping must have time to come back before the read timeout fires.
        self.ping_interval_secs = min(ping_interval_secs, read_timeout_secs / 3)
        self.connect_timeout_secs = connect_timeout_secs
        self.batch_max = max(1, batch_max)
        self.batch_window_secs = batch_window_secs
        self.write_timeout_secs = write_timeout_secs
        # The shutdown gives sources 5 s in all; what misses this is replayed at the next start.
        self.stop_write_timeout_secs = stop_write_timeout_secs
        self.retention_secs = retention_secs
        self._clock = clock
        # The socket's read timeout is the batch window, so a quiet socket
        # still lets a waiting batch go out on time (bounded both ways).
        self._poll_secs = min(max(batch_window_secs, 0.05), 1.0)

        self._accounts_by_did: dict[str, list[int]] = {}
        for account in accounts:
            if account.bluesky_did:
                self._accounts_by_did.setdefault(account.bluesky_did, []).append(account.account_id)
        if not self._accounts_by_did:
            raise ValueError("JetstreamSource needs at least one account with a bluesky_did "
                             "(without wantedDids Jetstream sends the whole network)")
        self.dids = tuple(sorted(self._accounts_by_did))
        if len(self.dids) > MAX_DIDS:
            raise ValueError(f"{len(self.dids)} Bluesky DIDs on one Jetstream connection; Jetstream "
                             f"takes at most {MAX_DIDS}: run more shards")
        # Many DIDs make a URL too long for the server's request line: then the
        # filters go in an options_update sent right after connecting.
        self.hello = len(subscribe_url(self.url, collections=self.collections, dids=self.dids,
                                       cursor=MAX_TIME_PLACEHOLDER)) > MAX_URL_CHARS

        self._ws: websocket.WebSocket | None = None
        self._ws_lock = threading.Lock()
        self._to_close: list[websocket.WebSocket] = []  # shut down by wake(), closed by our thread
        self._last_rx = 0.0
        self._last_ping = 0.0
        # Uncommitted: the commits to write and the newest time_us of every
        # event handled since the last commit (the cursor the batch moves to).
        self._pending_commits: list[Commit] = []
        self._pending_events = 0
        self._pending_cursor: int | None = None
        self._pending_since = 0.0
        #: The newest committed cursor this process knows of.
        self.saved_cursor: int | None = None
        #: When this process went live without a cursor (unix µs), until its first commit.
        self._live_since_us: int | None = None
        #: The cursor asked for on each connection (None = live), for logs and tests.
        self.requested_cursors: list[int | None] = []

    def gap_keys(self) -> list[GapKey]:
        # The ledger names the path by its protocol: Jetstream (the events are Bluesky's).
        return [GapKey(a, "jetstream", self.gap_source, self.gap_mode)
                for a in sorted({a for ids in self._accounts_by_did.values() for a in ids})]

    # -- connecting ------------------------------------------------------------

    def connect(self) -> None:
        saved = self._load_cursor()
        basis = saved if saved is not None else self._live_since_us
        cursor = resume_cursor(basis, self.rewind_secs)
        now_us = int(self._clock() * 1_000_000)
        if cursor is None:
            log.info("%s: no saved cursor: starting live (earlier events are not replayed)", self.name)
        else:
            age = (now_us - cursor) / 1_000_000
            if age > self.retention_secs:
                self.metrics.jetstream_cursor_gaps.inc()
                log.warning("%s: resuming from a cursor %.1f h old, beyond the %.1f h the server is "
                            "assumed to keep: it starts at its oldest event and what lies between "
                            "may be missing", self.name, age / 3600, self.retention_secs / 3600)
            log.info("%s: resuming from %s cursor %d minus %.1fs: asking for cursor=%d", self.name,
                     "saved" if saved is not None else "in-memory (live since)", basis,
                     self.rewind_secs, cursor)
        url = subscribe_url(self.url, collections=self.collections, dids=self.dids, cursor=cursor,
                            require_hello=self.hello)
        ws = websocket.create_connection(url, timeout=self.connect_timeout_secs,
                                         skip_utf8_validation=True, enable_multithread=True)
        with self._ws_lock:
            self._ws = ws
        try:
            if self.hello:
                ws.send(options_update(self.collections, self.dids))
            ws.settimeout(self._poll_secs)
            if self.stopping:  # a stop raced the connect: wake() saw no socket to close
                raise SourceClosed("stopping")
        except Exception:  # clean up, then let it propagate
            self.close()
            raise
        self.requested_cursors.append(cursor)
        if cursor is None and self.saved_cursor is None and self._live_since_us is None:
            self._live_since_us = now_us
        self._last_rx = self._last_ping = time.monotonic()

    def _load_cursor(self) -> int | None:
        try:
            stored = self.db.load_cursor(self.cursor_name, timeout=self.write_timeout_secs)
        except Exception as exc:
            # Without the saved cursor a connect would start live and skip
            # what happened meanwhile: refuse to connect, the base backs off.
            if self.db.classify(exc).kind is Kind.ENVIRONMENTAL:
                self.metrics.db_environmental_errors.inc()
            raise
        known = [c for c in (stored, self.saved_cursor) if c is not None]
        self.saved_cursor = max(known) if known else None
        return self.saved_cursor

    def close(self) -> None:
        """Thread-safe. From another thread only shut the socket down (a blocked
        recv returns at once); the source thread closes the descriptor, so a
        recv in flight never meets a descriptor number reused by another socket."""
        thread = self._thread
        own = thread is None or not thread.is_alive() or threading.current_thread() is thread
        with self._ws_lock:
            ws, self._ws = self._ws, None
            if ws is not None:
                self._to_close.append(ws)
            victims = self._to_close if own else [ws] if ws is not None else []
            if own:
                self._to_close = []
        for victim in victims:
            victim.abort()  # type: ignore[no-untyped-call]
            if own:
                victim.shutdown()  # type: ignore[no-untyped-call]

    # -- reading -----------------------------------------------------------------

    def read_once(self) -> None:
        try:
            self._read_frame()
            self._keepalive()
            if self._batch_due():
                self._flush()
        except (SourceClosed, OSError, websocket.WebSocketException) as exc:
            why = str(exc) if isinstance(exc, SourceClosed) else f"{type(exc).__name__}: {exc}"
            # What arrived before the drop is as good as any: commit it, so the
            # reconnect asks for as little as possible again.
            self._flush_on_the_way_out(self.stop_write_timeout_secs if self.stopping else None)
            raise SourceClosed(why) from exc

    def _read_frame(self) -> None:
        ws = self._ws
        if ws is None:
            raise SourceClosed("closed")
        try:
            opcode, frame = ws.recv_data_frame(True)
        except websocket.WebSocketTimeoutException:
            return
        self._last_rx = time.monotonic()
        if opcode == websocket.ABNF.OPCODE_TEXT:
            self._handle(frame.data, binary=False)
        elif opcode == websocket.ABNF.OPCODE_BINARY:
            self._handle(frame.data, binary=True)
        elif opcode == websocket.ABNF.OPCODE_CLOSE:
            raise SourceClosed(f"server closed the connection ({_close_code(frame.data)})")
        # ping (answered by the library) and pong: liveness only

    def _keepalive(self) -> None:
        ws = self._ws
        now = time.monotonic()
        silent = now - self._last_rx
        if silent > self.read_timeout_secs:
            raise SourceClosed(f"nothing received for {silent:.1f}s (read timeout "
                               f"{self.read_timeout_secs:.1f}s): connection presumed dead")
        if ws is not None and silent >= self.ping_interval_secs \
                and now - self._last_ping >= self.ping_interval_secs:
            self._last_ping = now
            ws.ping()

    def _handle(self, data: bytes, *, binary: bool) -> None:
        try:
            frame = decode(data, binary=binary)
        except BadFrame as bad:
            self.metrics.source_bad_frames.labels(self.platform, bad.reason).inc()
            self.quarantine_frame(bad.reason, data, bad.detail)
            log.warning("%s: frame refused (%s): %s [did=%s time_us=%s]", self.name, bad.reason,
                        bad.detail, bad.did, bad.time_us)
            log.debug("%s: refused frame: %r", self.name, data[:500])
            return
        if isinstance(frame, Heartbeat):
            return
        self._accept(frame)

    def _accept(self, ev: Event) -> None:
        operation = ev.operation if isinstance(ev, Commit) else "none"
        self.metrics.jetstream_events.labels(ev.kind, operation).inc()
        wanted = ev.did in self._accounts_by_did
        if isinstance(ev, Commit):
            # The server filters too; this guards against an instance that
            # ignores a filter (they differ) flooding the table.
            if wanted and collection_wanted(ev.collection, self.collections):
                self._pending_commits.append(ev)
            else:
                self.metrics.jetstream_records.labels("unwanted").inc()
        elif wanted and isinstance(ev, Account):
            log.info("%s: account event for %s: active=%s status=%s", self.name, ev.did, ev.active,
                     ev.status)
        elif wanted and isinstance(ev, Identity):
            log.info("%s: identity event for %s: handle=%s", self.name, ev.did, ev.handle)
        if self._pending_events == 0:
            self._pending_since = time.monotonic()
        self._pending_events += 1
        if self._pending_cursor is None or ev.time_us > self._pending_cursor:
            self._pending_cursor = ev.time_us

    # -- writing -------------------------------------------------------------------

    def _batch_due(self) -> bool:
        return self._pending_events > 0 and (
            self._pending_events >= self.batch_max
            or time.monotonic() - self._pending_since >= self.batch_window_secs)

    def _flush(self, timeout: float | None = None) -> None:
        """Write the pending batch and move the cursor; on failure drop it and raise SourceClosed."""
        if self._pending_events == 0:
            return
        commits, cursor = self._pending_commits, self._pending_cursor
        self._pending_commits, self._pending_events, self._pending_cursor = [], 0, None
        try:
            result = self._write(commits, cursor, isolate=False, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - classified; anything else is a write that did not happen
            why = self.db.classify(exc)
            if why.retryable:
                self._failed(why.kind, why.reason, len(commits))
                raise SourceClosed(f"database write failed ({why.reason})") from exc
            log.warning("%s: batch of %d refused (%s): retrying one commit at a time",
                        self.name, len(commits), why.reason)
            try:
                result = self._write(commits, cursor, isolate=True, timeout=timeout)
            except Exception as exc2:  # noqa: BLE001 - same as above
                why2 = self.db.classify(exc2)
                self._failed(why2.kind, why2.reason, len(commits))
                raise SourceClosed(f"database write failed ({why2.reason})") from exc2
        self._committed(result)

    def _write(self, commits: list[Commit], cursor: int | None, *, isolate: bool,
               timeout: float | None) -> ApplyResult:
        limit = self.write_timeout_secs if timeout is None else timeout
        return self.db.apply(commits, cursor_name=self.cursor_name, cursor_us=cursor,
                             isolate=isolate, timeout=limit)

    def _failed(self, kind: Kind, reason: str, n: int) -> None:
        self.metrics.jetstream_batches.labels("failed").inc()
        if kind is Kind.ENVIRONMENTAL:
            self.metrics.db_environmental_errors.inc()
        log.warning("%s: batch of %d commits not written (%s); the cursor stays at %s and the "
                    "reconnect replays them", self.name, n, reason, self.saved_cursor)

    def _committed(self, result: ApplyResult) -> None:
        self.metrics.jetstream_batches.labels("committed").inc()
        self.metrics.jetstream_records.labels("written").inc(len(result.written))
        self.metrics.jetstream_records.labels("stale").inc(result.stale)
        for commit, reason in result.refused:
            self.metrics.jetstream_records.labels("refused").inc()
            log.error("%s: %s of %s refused by the database (%s); skipped", self.name,
                      commit.operation, commit.uri, reason)
        if result.cursor is not None:
            self.saved_cursor = result.cursor
            self._live_since_us = None
            self.metrics.jetstream_cursor_lag.set(max(0.0, self._clock() - result.cursor / 1_000_000))
        if self.on_post is not None:
            for commit in result.written:
                if commit.operation == "create" and commit.collection == POST_COLLECTION:
                    self._alert(commit)

    def _alert(self, commit: Commit) -> None:
        assert self.on_post is not None
        payload = {
            "type": ALERT_TYPE, "platform": self.platform, "did": commit.did, "uri": commit.uri,
            "collection": commit.collection, "rkey": commit.rkey, "rev": commit.rev,
            "cid": commit.cid, "time_us": commit.time_us, "record": commit.record,
        }
        for account_id in self._accounts_by_did.get(commit.did, ()):
            try:
                self.on_post(account_id, payload)
            except Exception:  # the record is stored; a failed alert must not undo or stop that
                log.exception("%s: live alert for %s failed", self.name, commit.uri)

    def _flush_on_the_way_out(self, timeout: float | None = None) -> None:
        try:
            self._flush(timeout)
        except SourceClosed as exc:
            log.info("%s: last batch not written (%s): it is replayed from the saved cursor",
                     self.name, exc)

    def release(self) -> None:
        self._flush_on_the_way_out(self.stop_write_timeout_secs)

    @property
    def pending(self) -> int:
        """Events received and not yet committed."""
        return self._pending_events


def _close_code(data: bytes) -> str:
    if len(data) >= 2:
        return f"code {int.from_bytes(data[:2], 'big')}"
    return "no code"
