"""`StreamElementsSource`: one account's Astro WebSocket, one thread.

The thread opens the gateway (`[streamelements] astro_url`), reads the
`welcome`, and subscribes to each configured topic for the account's room
with the token from `streamelements_token_file` (read at every connect, and
again whenever the file changes; never logged). Every subscribe carries a
nonce and its `response` is checked: the room it names is the canonical one.
Then it reads: each `message` is mapped (protocol.map_message) and handed to
the `EventSink` (persist_event, live alert) one at a time.

- **Pings.** Astro pings every 30 s and closes a client that has not ponged
  for 70 s; websocket-client answers inside `recv`, which this thread calls
  at least every `read_budget_secs`. Nothing at all (not even a ping) for
  `silence_secs` means the connection is dead: reconnect.
- **Graceful reconnect.** On `reconnect` a new socket is opened with
  `?reconnect_token=`; the server restores the subscriptions there, so none
  is sent again (only those whose answer was still outstanding). The old
  socket is read until the new one's `welcome`, then drained and closed, so
  nothing it still held is lost. A refused token (the upgrade fails, or the
  socket closes before its welcome) falls back to a fresh socket and every
  subscribe again; when that fails too, the source backs off and reconnects.
- **Unplanned drops** reconnect with jittered exponential backoff (the Source
  base) and subscribe again. An upgrade answered 429 waits its `Retry-After`;
  502 (a draining server) is a normal backoff.
- **Subscribe errors** are per topic and never close the socket:
  `err_unauthorized` (and `err_bad_request`, `invalid_message_type`) is a
  configuration problem: logged once per topic until it changes, counted, and
  retried every `config_retry_secs` (or at once when the token file changes);
  `err_deadline_exceeded`, `err_internal_error` and a missing answer retry
  with backoff; `rate_limit_exceeded` holds every subscribe back for
  `rate_limit_secs`, doubling while it repeats.
- **Duplicates.** A frame id seen already on a topic is skipped (the overlap of
  a hand-off may repeat it); an event whose (type, external_id) this source
  took already is skipped (the same tip on both topics); the database key
  (account, external_id) makes anything that slips past harmless.

Durable when the source has stopped: nothing is held in memory; every event
it accepted went through `persist_event` before the next frame was read.
"""

from __future__ import annotations

import logging
import os
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import websocket

from lumio_ingestd.config import AccountConfig, StreamElementsConfig
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.recent import RecentIds
from lumio_ingestd.sources.base import MAX_FRAMES_PER_TURN, BadFrame, PeerClosed, Source, SourceClosed
from lumio_ingestd.sources.interfaces import FrameSink
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.streamelements.protocol import (
    CONFIG_ERRORS,
    KNOWN_ERRORS,
    PLATFORM,
    RATE_LIMITED,
    RETRY_ERRORS,
    STORED_TOPICS,
    Frame,
    Token,
    map_message,
    parse_frame,
    parse_token,
    subscribe_request,
)
from lumio_ingestd.sources.ws import Binary, WsClosed, WsConnection

log = logging.getLogger("lumio_ingestd.sources.streamelements.source")




class UpgradeRefused(Exception):
    """The gateway answered the WebSocket upgrade with an HTTP error (429, 502, ...)."""

    def __init__(self, status: int, retry_after: float | None) -> None:
        super().__init__(f"upgrade refused with HTTP {status}"
                         + (f" (Retry-After {retry_after:g}s)" if retry_after is not None else ""))
        self.status = status
        self.retry_after = retry_after


class TokenFile:
    """The account's token file: read when asked, re-read only when it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token: Token | None = None

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def changed(self) -> bool:
        try:
            return self._stat() != self._stamp
        except OSError:
            return False  # gone for now: keep using what was read (the next connect says why)

    def load(self) -> Token:
        """The token; raises ValueError (what and where, never the content) or OSError."""
        stamp = self._stat()
        if self._token is None or stamp != self._stamp:
            token = parse_token(self.path.read_text(encoding="utf-8"), str(self.path))
            self._token, self._stamp = token, stamp
        assert self._token is not None
        return self._token


@dataclass
class Topic:
    name: str
    state: str = "want"  # want -> pending -> active; back to want on an error or a new socket
    nonce: str | None = None
    sent_at: float = 0.0
    due: float = 0.0  # monotonic: when a wanted topic may be sent
    attempts: int = 0  # errors in a row, for the retry backoff
    room: str | None = None  # the canonical room from the last successful response
    failing: str | None = None  # the error logged for this topic (logged once until it changes)


def with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    query += list(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


class StreamElementsSource(Source):
    platform = PLATFORM
    max_turn_secs = 60.0
    gap_source = "astro"
    gap_mode = "heal"  # activities and tips are read back from the REST API (history.py)

    def __init__(self, account: AccountConfig, se: StreamElementsConfig, *, sink: EventSink,
                 metrics: Metrics, connect_timeout_secs: float = 10.0, welcome_timeout_secs: float = 10.0,
                 response_timeout_secs: float = 10.0, silence_secs: float = 75.0,
                 config_retry_secs: float = 300.0, retry_min_secs: float = 1.0,
                 retry_max_secs: float = 60.0, rate_limit_secs: float = 10.0,
                 drain_quiet_secs: float = 0.25, drain_max_secs: float = 2.0,
                 read_budget_secs: float = 0.5, recent_ids: int = 10_000,
                 frames: FrameSink | None = None) -> None:
        if not account.streamelements_channel_id or account.streamelements_token_file is None:
            raise ValueError(f"account {account.account_id} has no streamelements_channel_id "
                             "and streamelements_token_file")
        super().__init__(f"source-streamelements-{account.account_id}", metrics, frames=frames)
        self.account_id = account.account_id
        self.room = account.streamelements_channel_id
        self.url = se.astro_url
        self.keep_pii = se.keep_donor_pii
        self.tokens = TokenFile(account.streamelements_token_file)
        self.topics = {name: Topic(name) for name in dict.fromkeys(se.topics)}
        self._sink = sink
        self._connect_timeout = connect_timeout_secs
        self._welcome_timeout = welcome_timeout_secs
        self._response_timeout = response_timeout_secs
        self._silence = silence_secs
        self._config_retry = config_retry_secs
        self._retry_min = retry_min_secs
        self._retry_max = retry_max_secs
        self._rate_limit = rate_limit_secs
        self._rate_limits = 0
        self._hold_until = 0.0  # no subscribe goes out before this (rate limited)
        self._drain_quiet = drain_quiet_secs
        self._drain_max = drain_max_secs
        self._read_budget = read_budget_secs
        self._frames = RecentIds(recent_ids)
        self._taken = RecentIds(recent_ids)
        self._conn: WsConnection | None = None
        self._opening: WsConnection | None = None
        self._token: Token | None = None
        self._rng_retry = random.Random()
        self.client_id: str | None = None
        self.handoffs = 0
        self.welcomed_at = 0.0
        self._unsupported_logged: set[str] = set()
        for name in self.topics:
            if name not in STORED_TOPICS:
                log.warning("%s: topic %s is subscribed but its messages are not stored (only %s are)",
                            self.name, name, ", ".join(sorted(STORED_TOPICS)))

    # -- Source ------------------------------------------------------------------------------

    def connect(self) -> None:
        try:
            self._token = self.tokens.load()
        except (OSError, ValueError) as exc:
            log.error("%s: cannot read the token: %s", self.name,
                      exc if isinstance(exc, ValueError) else f"{self.tokens.path}: {exc.strerror}")
            raise
        conn = self._open(self.url)
        self._conn = conn
        for topic in self.topics.values():
            # A new socket has no subscriptions; one failing for its configuration waits for
            # its slow retry (a reconnect must not turn into a retry loop).
            topic.state, topic.nonce = "want", None
            if topic.failing is None:
                topic.due = 0.0
        self._subscribe_due(time.monotonic())

    def read_once(self) -> None:
        conn = self._conn
        if conn is None:
            raise SourceClosed("not connected")
        end = time.monotonic() + self._read_budget
        try:
            for _ in range(MAX_FRAMES_PER_TURN):
                left = min(end, conn.last_seen + self._silence) - time.monotonic()
                data = conn.recv(max(left, 0.001))
                if data is None and conn.woken:
                    return  # a graceful stop: nothing more to read without waiting
                if data is not None:
                    self._dispatch(data, conn)
                    if self._conn is not conn:
                        return  # a hand-off replaced the socket
                now = time.monotonic()
                if now - conn.last_seen >= self._silence:
                    self.metrics.source_closes.labels(PLATFORM, "silence").inc()
                    raise SourceClosed(f"nothing received for {now - conn.last_seen:.1f}s (not even "
                                       "a ping): the connection is dead")
                if now >= end:
                    return
        except WsClosed as exc:
            self._count_close(exc.code)
            raise PeerClosed(exc.code, exc.reason, peer="StreamElements") from None

    def idle(self) -> None:
        if self._conn is None or not self.connected:
            return
        now = time.monotonic()
        if self.tokens.changed():
            self._token_changed(now)
        self._subscribe_due(now)

    def close(self) -> None:
        for conn in (self._conn, self._opening):
            if conn is not None:
                conn.abort()
        if not self.stopping:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def interrupt(self) -> None:
        for conn in (self._conn, self._opening):
            if conn is not None:
                conn.wake()

    def drain(self) -> None:
        conn = self._conn
        if conn is not None:
            self.drain_connection(conn, lambda data: self._dispatch(data, conn))

    def release(self) -> None:
        for conn in (self._conn, self._opening):
            if conn is not None:
                conn.close()
        self._conn = self._opening = None


    # -- connecting ------------------------------------------------------------------------------

    def _open(self, url: str) -> WsConnection:
        """A new socket, welcomed. Raises UpgradeRefused, SourceClosed, OSError."""
        conn = WsConnection(url, connect_timeout=self._connect_timeout)
        self._opening = conn
        try:
            try:
                conn.open()
            except websocket.WebSocketBadStatusException as exc:
                raise self._refused(exc) from None
            deadline = time.monotonic() + self._welcome_timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SourceClosed(f"no welcome within {self._welcome_timeout:g}s")
                try:
                    data = conn.recv(left)
                except WsClosed as exc:
                    self._count_close(exc.code)
                    raise PeerClosed(exc.code, exc.reason, peer="StreamElements") from None
                if data is None:
                    if conn.woken:
                        raise SourceClosed("stopping")
                    continue
                try:
                    frame = parse_frame(data)
                except BadFrame as exc:
                    self._bad(exc, data)
                    continue
                if frame.type == "welcome":
                    client_id = frame.data.get("client_id")
                    self.client_id = client_id if isinstance(client_id, str) else None
                    self.welcomed_at = time.monotonic()
                    return conn
                self._handle(frame, conn, data)  # nothing else is expected first; handled all the same
        except Exception:  # clean up, then let it propagate
            conn.close()
            raise
        finally:
            self._opening = None

    def _refused(self, exc: websocket.WebSocketBadStatusException) -> UpgradeRefused:
        headers = {str(k).lower(): str(v) for k, v in (exc.resp_headers or {}).items()}
        retry_after: float | None = None
        try:
            retry_after = max(0.0, float(headers["retry-after"])) if "retry-after" in headers else None
        except ValueError:
            retry_after = None  # an HTTP date: use the normal backoff
        status = int(exc.status_code)
        label = str(status) if status in (429, 502, 503) else "other"
        self.metrics.streamelements_upgrade_refused.labels(label).inc()
        if status == 429:
            # Honour the server's wait, but never hammer it sooner than our own backoff.
            self.force_backoff(max(retry_after if retry_after is not None else self._rate_limit,
                                   self.reconnect_min_secs))
        return UpgradeRefused(status, retry_after)

    def _count_close(self, code: int | None) -> None:
        label = "none" if code is None else (str(code) if 1000 <= code <= 1015 or 4000 <= code <= 4010
                                             else "other")
        self.metrics.source_closes.labels(PLATFORM, label).inc()

    # -- subscriptions ---------------------------------------------------------------------------

    def _subscribe_due(self, now: float) -> None:
        conn, token = self._conn, self._token
        if conn is None or token is None:
            return
        for topic in self.topics.values():
            if topic.state == "pending" and now - topic.sent_at >= self._response_timeout:
                self.metrics.source_subscriptions.labels(PLATFORM, "timeout").inc()
                log.warning("%s: no answer to the %s subscribe within %gs; retrying", self.name,
                            topic.name, self._response_timeout)
                self._retry_later(topic, now)
        if now < self._hold_until:
            return
        for topic in self.topics.values():
            if topic.state != "want" or topic.due > now:
                continue
            topic.nonce = uuid.uuid4().hex
            topic.sent_at = now
            topic.state = "pending"
            try:
                conn.send_text(subscribe_request(topic.name, self.room, token.token, token.token_type,
                                                 topic.nonce))
            except WsClosed as exc:
                topic.state, topic.nonce = "want", None
                log.info("%s: subscribe to %s not sent (%s)", self.name, topic.name, exc)
                conn.abort()  # the reader notices the dead socket and reconnects
                return

    def _retry_later(self, topic: Topic, now: float) -> None:
        topic.attempts += 1
        ceiling = min(self._retry_max, self._retry_min * 2.0 ** (topic.attempts - 1))
        topic.state, topic.nonce = "want", None
        topic.due = now + self._rng_retry.uniform(self._retry_min, max(self._retry_min, ceiling))

    def _response(self, frame: Frame) -> None:
        topic = next((t for t in self.topics.values()
                      if t.nonce is not None and t.nonce == frame.nonce), None)
        if topic is None:
            self.metrics.source_frames.labels(PLATFORM, "unmatched_response").inc()
            log.info("%s: a response to no outstanding request (nonce %r) ignored", self.name,
                     (frame.nonce or "")[:64])
            return
        now = time.monotonic()
        if frame.error is None:
            room = frame.data.get("room")
            topic.room = room if isinstance(room, str) and room else self.room
            if topic.failing is not None:
                log.info("%s: %s subscribed after %s", self.name, topic.name, topic.failing)
            elif topic.room != self.room:
                log.info("%s: %s subscribed; the gateway names the room %r (configured %r)",
                         self.name, topic.name, topic.room, self.room)
            topic.state, topic.nonce, topic.attempts, topic.failing = "active", None, 0, None
            self._rate_limits = 0
            self.metrics.source_subscriptions.labels(PLATFORM, "ok").inc()
            self.mark_healthy()  # a working session: the next drop starts the backoff over
            return
        error = frame.error
        label = error if error in KNOWN_ERRORS else "other"
        self.metrics.streamelements_subscribe_errors.labels(label).inc()
        self.metrics.source_subscriptions.labels(PLATFORM, "failed").inc()
        message = frame.data.get("message")
        detail = f"{error[:64]}: {message[:200]}" if isinstance(message, str) else error[:64]
        if error in CONFIG_ERRORS:
            topic.state, topic.nonce = "want", None
            topic.due = now + self._config_retry
            if topic.failing != error:
                log.error("%s: account %d: subscribing to %s for room %s failed (%s); check the token "
                          "and its scope; the other topics keep running; retrying every %gs",
                          self.name, self.account_id, topic.name, self.room, detail, self._config_retry)
            topic.failing = error
        elif error == RATE_LIMITED:
            self._rate_limits += 1
            hold = min(self._retry_max * 5, self._rate_limit * 2.0 ** (self._rate_limits - 1))
            self._hold_until = max(self._hold_until, now + hold)
            topic.state, topic.nonce, topic.due = "want", None, self._hold_until
            log.warning("%s: rate limited while subscribing to %s; holding subscribes for %gs",
                        self.name, topic.name, hold)
        else:
            if error not in RETRY_ERRORS:
                log.warning("%s: subscribing to %s failed with an unknown error (%s); retrying",
                            self.name, topic.name, detail)
            else:
                log.info("%s: subscribing to %s failed (%s); retrying with backoff", self.name,
                         topic.name, detail)
            self._retry_later(topic, now)

    def _token_changed(self, now: float) -> None:
        try:
            token = self.tokens.load()
        except (OSError, ValueError) as exc:
            log.error("%s: the token file changed but cannot be used (%s); keeping the old token",
                      self.name, exc if isinstance(exc, ValueError) else exc.strerror)
            return
        if token == self._token:
            return
        self._token = token
        log.info("%s: the token file changed; subscribing again", self.name)
        for topic in self.topics.values():
            # An active subscription keeps its server-side token; failed ones try the new one now.
            if topic.state == "want":
                topic.due, topic.attempts, topic.failing = now, 0, None

    # -- frames ------------------------------------------------------------------------------------

    def _dispatch(self, data: bytes, conn: WsConnection) -> None:
        try:
            if isinstance(data, Binary):
                raise BadFrame("binary", f"a binary frame of {len(data)} bytes (Astro sends text)")
            frame = parse_frame(data)
        except BadFrame as exc:
            self._bad(exc, data)
            return
        self._handle(frame, conn, data)

    def _handle(self, frame: Frame, conn: WsConnection, raw: bytes) -> None:
        if frame.type == "message":
            self._message(frame, raw)
        elif frame.type == "response":
            self.metrics.source_frames.labels(PLATFORM, "control").inc()
            self._response(frame)
        elif frame.type == "reconnect":
            self.metrics.source_frames.labels(PLATFORM, "control").inc()
            self._reconnect(frame, conn)
        elif frame.type == "welcome":
            self.metrics.source_frames.labels(PLATFORM, "control").inc()
            log.debug("%s: an unexpected welcome on an open connection; ignored", self.name)
        else:
            self._bad(BadFrame("unsupported", f"a frame of type {frame.type[:64]!r}"))

    def _message(self, frame: Frame, raw: bytes) -> None:
        key = f"{frame.topic}\x00{frame.id}" if frame.id else None
        if key is not None and key in self._frames:
            self.metrics.source_duplicates.labels(PLATFORM).inc()
            return
        try:
            mapped = map_message(self.account_id, frame, keep_pii=self.keep_pii)
            topic = self.topics.get(frame.topic or "")
            if frame.room is not None and frame.room not in (self.room, topic.room if topic else None):
                raise BadFrame("room", f"a {str(frame.topic)[:64]} message for room "
                                       f"{frame.room[:64]!r}, not this account's")
        except BadFrame as exc:
            self._bad(exc, raw)
            return
        ev = mapped.event
        if mapped.pii_removed:
            self.metrics.streamelements_pii_removed.inc(mapped.pii_removed)
        taken_key = f"{ev.type}\x00{ev.external_id}"
        if taken_key in self._taken:
            self.metrics.source_duplicates.labels(PLATFORM).inc()
        else:
            self.metrics.source_frames.labels(PLATFORM, "event").inc()
            result = self._sink.persist(ev)
            if result.outcome in ("stored", "duplicate", "parked", "spooled"):
                self._taken.add(taken_key)
        if key is not None:
            self._frames.add(key)

    def _bad(self, exc: BadFrame, raw: bytes | None = None) -> None:
        """`raw`: the refused frame's bytes (kept in the frame quarantine, unless merely unsupported)."""
        self.metrics.source_frames.labels(PLATFORM, "bad").inc()
        self.metrics.source_bad_frames.labels(PLATFORM, exc.reason).inc()
        if exc.reason != "unsupported":
            if raw is not None:
                self.quarantine_frame(exc.reason, raw, str(exc))
            log.warning("%s: refused a frame (%s): %s", self.name, exc.reason, exc)
            return
        # A topic subscribed but not stored sends all the time: said once, then counted only.
        what = str(exc)[:120]
        if what not in self._unsupported_logged and len(self._unsupported_logged) < 64:
            self._unsupported_logged.add(what)
            log.info("%s: skipped %s (counted in source_bad_frames_total{reason=\"unsupported\"}; "
                     "said once)", self.name, what)

    # -- graceful reconnect -----------------------------------------------------------------------

    def _reconnect(self, frame: Frame, conn: WsConnection) -> None:
        if conn is not self._conn or conn.woken:
            return  # only the live socket's own request counts, and none after a stop
        token = frame.data.get("reconnect_token")
        old = conn
        if isinstance(token, str) and token:
            log.info("%s: reconnect requested; opening the new socket with the reconnect token", self.name)
            try:
                new = self._open(with_query(self.url, reconnect_token=token))
            except Exception as exc:  # noqa: BLE001 - any failure: the fallback below
                self.metrics.source_reconnect_handoffs.labels(PLATFORM, "refused").inc()
                log.warning("%s: the reconnect token was refused (%s: %s); a fresh socket instead",
                            self.name, type(exc).__name__, exc)
            else:
                self._conn = new
                self._drain_and_close(old)
                self.handoffs += 1
                self.metrics.source_reconnect_handoffs.labels(PLATFORM, "ok").inc()
                # The server restored the subscriptions; only unanswered ones go again.
                for topic in self.topics.values():
                    if topic.state == "pending":
                        topic.state, topic.nonce, topic.due = "want", None, 0.0
                self._subscribe_due(time.monotonic())
                return
        else:
            self._bad(BadFrame("shape", "a reconnect frame without data.reconnect_token"))
        try:
            new = self._open(self.url)
        except Exception as exc:  # noqa: BLE001 - any failure: back off and start over
            self.metrics.source_reconnect_handoffs.labels(PLATFORM, "failed").inc()
            self._conn = None
            self._drain_and_close(old)
            raise SourceClosed(f"reconnect fallback failed ({type(exc).__name__}: {exc})") from None
        self._conn = new
        self._drain_and_close(old)
        self.metrics.source_reconnect_handoffs.labels(PLATFORM, "fresh").inc()
        for topic in self.topics.values():
            topic.state, topic.nonce = "want", None
            if topic.failing is None:
                topic.due = 0.0
        self._subscribe_due(time.monotonic())

    def _drain_and_close(self, old: WsConnection) -> None:
        """Read what the old socket still holds (sent before the switch), then close it."""
        if old.woken:  # a graceful stop came meanwhile: read up to the answer to our close
            for message in old.drain(self._drain_max):
                self._dispatch(message, old)
            old.close()
            return
        started = quiet_since = time.monotonic()
        while True:
            now = time.monotonic()
            if now - quiet_since >= self._drain_quiet or now - started >= self._drain_max:
                break
            try:
                data = old.recv(min(self._drain_quiet, self._drain_max - (now - started)))
            except WsClosed:
                break
            if data is not None:
                quiet_since = time.monotonic()
                self._dispatch(data, old)
        old.close()
