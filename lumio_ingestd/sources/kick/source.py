"""`KickSource`: one account's Pusher socket (Kick's chat WebSocket), one thread.

Pusher protocol 7 (docs/platforms.rst, "The Pusher socket"): the server opens with
`pusher:connection_established` (its `activity_timeout`); the source then
subscribes to `chatrooms.<kick_chatroom_id>.v2` and, when configured,
`channel.<kick_channel_id>`, at once and again after every reconnect (Kick
replays nothing: what is sent while the socket is down is not ours, the
webhooks are the second path for it). One socket per account: the Source
base's reconnect, backoff and stop rules then hold per account, and one
channel's trouble (a 4xxx close, a slow reader) does not cut the others.

A `pusher:subscription_error` is answered by asking again on the same
socket after a jittered backoff (`subscribe_retry_min_secs`, doubling up to
`subscribe_retry_max_secs`), counted in `source_subscriptions{result="failed"}`
and `{result="retried"}` and shown in the source's status (`unsubscribed`);
after `subscribe_max_refusals` refusals of one channel the connection is
replaced (`source_closes{code="subscribe_refused"}`), so a socket that stays
up with keepalives flowing never goes on without its chatroom.

Keepalive: any frame proves the connection alive. After `min(server
activity_timeout, activity_max_secs)` of silence the source sends
`pusher:ping`; no `pusher:pong` (or any other frame) within
`pong_timeout_secs` is a dead connection, closed and replaced. A server
`pusher:ping` is answered with `pusher:pong`.

Close codes (a close frame, or a `pusher:error` with a code):

    4000-4099  the server refuses this client (app key, quota, protocol):
               a configuration problem, logged as an error, reconnect after
               `config_backoff_secs`
    4100-4199  over capacity: reconnect with the usual backoff (>= 1 s)
    4200-4299  reconnect at once (generic, pong missed, closed for inactivity)
    anything else: the usual backoff

A chat or event frame on a channel this source did not subscribe to, or
whose `data.chatroom_id` names another chatroom, is refused
(`source_bad_frames{reason="foreign_channel"}`, a warning a minute), never
stored under the account.

Chat goes to the source's `ChatQueue` (handed to Redis in small batches);
events go through the shared `EventSink` (persist_event, live alert,
stream_sessions) one at a time. Durable when the source has stopped:
`release()` handed the chat queue to Redis (or the database, or the spool);
every event was persisted (stored, parked or spooled) before the next frame
was read.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lumio_ingestd import boundedjson
from lumio_ingestd.config import AccountConfig, KickConfig
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.base import PeerClosed, Source, SourceClosed
from lumio_ingestd.sources.interfaces import ChatQueueLike, FrameSink
from lumio_ingestd.sources.kick.mapping import BUCKET_SECS, PLATFORM, BadFrame, foreign_channel, interpret
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.ws import Binary, WsClosed, WsConnection

log = logging.getLogger("lumio_ingestd.sources.kick.source")

ACTIVITY_MAX_SECS = 120.0
PONG_TIMEOUT_SECS = 30.0
CONFIG_BACKOFF_SECS = 300.0
#: A refused subscribe is sent again after a jittered backoff from the min, doubling up to the max.
SUBSCRIBE_RETRY_MIN_SECS = 1.0
SUBSCRIBE_RETRY_MAX_SECS = 30.0
#: Refusals of one channel on one connection before the connection is replaced.
SUBSCRIBE_MAX_REFUSALS = 5




def close_class(code: int | None) -> str:
    """How a Pusher close or error code is handled: "config", "backoff", "retry" or "other"."""
    if code is None:
        return "other"
    if 4000 <= code <= 4099:
        return "config"
    if 4100 <= code <= 4199:
        return "backoff"
    if 4200 <= code <= 4299:
        return "retry"
    return "other"


def channels_for(account: AccountConfig) -> list[str]:
    if account.kick_chatroom_id is None:
        raise ValueError(f"account {account.account_id} has no kick_chatroom_id")
    out = [f"chatrooms.{account.kick_chatroom_id}.v2"]
    if account.kick_channel_id:
        out.append(f"channel.{account.kick_channel_id}")
    return out


class KickSource(Source):
    platform = PLATFORM
    gap_source = "pusher"  # chat and events, neither with a history to read back

    def __init__(self, account: AccountConfig, kick: KickConfig, *, chat_queue: ChatQueueLike,
                 sink: EventSink, metrics: Metrics, activity_max_secs: float = ACTIVITY_MAX_SECS,
                 pong_timeout_secs: float = PONG_TIMEOUT_SECS, connect_timeout_secs: float = 10.0,
                 config_backoff_secs: float = CONFIG_BACKOFF_SECS, read_budget_secs: float = 0.5,
                 bucket_secs: int = BUCKET_SECS,
                 subscribe_retry_min_secs: float = SUBSCRIBE_RETRY_MIN_SECS,
                 subscribe_retry_max_secs: float = SUBSCRIBE_RETRY_MAX_SECS,
                 subscribe_max_refusals: int = SUBSCRIBE_MAX_REFUSALS,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 frames: FrameSink | None = None) -> None:
        super().__init__(f"source-kick-{account.account_id}", metrics, frames=frames)
        self.account_id = account.account_id
        self.channels = channels_for(account)
        self.chatroom_id = str(account.kick_chatroom_id)
        self._url = kick.pusher_url
        self._queue = chat_queue
        self._sink = sink
        self._activity_max = activity_max_secs
        self._pong_timeout = pong_timeout_secs
        self._connect_timeout = connect_timeout_secs
        self._config_backoff = config_backoff_secs
        self._read_budget = read_budget_secs
        self._bucket = bucket_secs
        self._clock = clock
        self._ws: WsConnection | None = None
        self.activity_timeout = activity_max_secs  # the one in force on this connection
        self.socket_id: str | None = None
        self.subscribed: set[str] = set()  # channels the server confirmed on this connection
        self._retry_min = subscribe_retry_min_secs
        self._retry_max = subscribe_retry_max_secs
        self._max_refusals = max(1, subscribe_max_refusals)
        #: This connection: refusals per channel, and when each refused channel is asked again.
        self.refusals: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._last_activity = 0.0
        self._ping_sent_at: float | None = None
        self.pings_sent = 0
        self.pongs_sent = 0

    # -- Source --------------------------------------------------------------------------

    def connect(self) -> None:
        self._housekeeping()
        ws = WsConnection(self._url, connect_timeout=self._connect_timeout)
        self._ws = ws
        try:
            ws.open()
            self._await_established(ws)
            self.subscribed.clear()
            self.refusals.clear()
            self._retry_at.clear()
            self.source_state.subscribed(None)
            for channel in self.channels:
                self._send_subscribe(ws, channel)
        except Exception:
            self._ws = None
            ws.abort()
            raise
        self._last_activity = time.monotonic()
        self._ping_sent_at = None
        log.info("%s: socket %s, subscribing to %s (activity timeout %.0fs)", self.name, self.socket_id,
                 ", ".join(self.channels), self.activity_timeout)

    def _await_established(self, ws: WsConnection) -> None:
        deadline = time.monotonic() + self._connect_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SourceClosed("no pusher:connection_established in time")
            try:
                raw = ws.recv(left)
            except WsClosed as exc:
                self._closed_with(exc.code, exc.reason)
                raise PeerClosed(exc.code, str(exc), message=str(exc)) from None
            if raw is None:
                if ws.woken:
                    raise SourceClosed("stopping")
                continue
            try:
                data = boundedjson.loads(raw)
            except ValueError as exc:
                self.metrics.source_bad_frames.labels(PLATFORM, "json").inc()
                self.quarantine_frame("json", raw, f"before pusher:connection_established: {exc}")
                continue
            event = data.get("event") if isinstance(data, dict) else None
            inner: Any = data.get("data") if isinstance(data, dict) else None
            if isinstance(inner, str):
                try:
                    inner = boundedjson.loads(inner)
                except ValueError:
                    inner = {}
            inner = inner if isinstance(inner, dict) else {}
            if event == "pusher:connection_established":
                timeout = inner.get("activity_timeout")
                server = float(timeout) if isinstance(timeout, int | float) and timeout > 0 else \
                    self._activity_max
                self.activity_timeout = min(server, self._activity_max)
                self.socket_id = str(inner.get("socket_id") or "") or None
                return
            if event == "pusher:error":
                code = inner.get("code")
                code = code if isinstance(code, int) else None
                self._closed_with(code, str(inner.get("message") or ""))
                why = f"pusher:error {code}: {str(inner.get('message'))[:200]}"
                raise PeerClosed(code, why, message=why)

    def read_once(self) -> None:
        ws = self._ws
        if ws is None:
            raise SourceClosed("not connected")
        try:
            raw = ws.recv(self._read_budget)
        except WsClosed as exc:
            self._closed_with(exc.code, exc.reason)
            self._queue.drain()  # the backoff may be long: nothing read waits in memory through it
            raise PeerClosed(exc.code, str(exc), message=str(exc)) from None
        now = time.monotonic()
        if raw is not None:
            self._last_activity = now
            self._ping_sent_at = None  # any frame proves the connection alive
            self._handle(ws, raw)
        self._keepalive(ws, now)
        self._retry_subscribes(ws, now)

    @staticmethod
    def _send_subscribe(ws: WsConnection, channel: str) -> None:
        ws.send_text(json.dumps({"event": "pusher:subscribe", "data": {"auth": "", "channel": channel}}))

    def _retry_subscribes(self, ws: WsConnection, now: float) -> None:
        for channel, at in list(self._retry_at.items()):
            if now < at:
                continue
            del self._retry_at[channel]
            try:
                self._send_subscribe(ws, channel)
            except WsClosed as exc:
                raise SourceClosed(str(exc)) from None
            self.metrics.source_subscriptions.labels(PLATFORM, "retried").inc()
            log.info("%s: subscribing to %s again (refused %d time(s) on this connection)", self.name,
                     channel, self.refusals.get(channel, 0))

    def _subscribe_refused(self, channel: str | None, data: Any) -> None:
        self.metrics.source_subscriptions.labels(PLATFORM, "failed").inc()
        detail = (json.dumps(data, ensure_ascii=False) if isinstance(data, dict) else str(data))[:200]
        if channel not in self.channels:
            log.warning("%s: subscription error for a channel never asked for (%r): %s", self.name,
                        str(channel)[:80], detail)
            return
        n = self.refusals[channel] = self.refusals.get(channel, 0) + 1
        self.source_state.subscribe_refused(channel, detail)
        if n >= self._max_refusals:
            log.error("%s: subscription to %s refused %d times on this connection (%s); "
                      "reconnecting", self.name, channel, n, detail)
            self.metrics.source_closes.labels(PLATFORM, "subscribe_refused").inc()
            self._queue.drain()  # the backoff may be long: nothing read waits in memory through it
            raise SourceClosed(f"subscription to {channel} refused {n} times: {detail}")
        ceiling = min(self._retry_max, self._retry_min * 2.0 ** (n - 1))
        delay = self._rng.uniform(self._retry_min, max(self._retry_min, ceiling))
        self._retry_at[channel] = time.monotonic() + delay
        log.error("%s: subscription to %s refused (%s); asking again in %.1fs (%d of %d before a "
                  "reconnect)", self.name, channel, detail, delay, n, self._max_refusals)

    def _keepalive(self, ws: WsConnection, now: float) -> None:
        if self._ping_sent_at is not None:
            if now - self._ping_sent_at >= self._pong_timeout:
                self.metrics.source_closes.labels(PLATFORM, "keepalive").inc()
                self._queue.drain()
                raise SourceClosed(f"no pusher:pong within {self._pong_timeout:.0f}s")
            return
        if now - self._last_activity >= self.activity_timeout:
            try:
                ws.send_text('{"event":"pusher:ping","data":{}}')
            except WsClosed as exc:
                raise SourceClosed(str(exc)) from None
            self._ping_sent_at = now
            self.pings_sent += 1

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.abort()

    def interrupt(self) -> None:
        ws = self._ws
        if ws is not None:
            ws.wake()

    def drain(self) -> None:
        ws = self._ws
        if ws is not None:
            self.drain_connection(ws, functools.partial(self._handle, ws))

    def idle(self) -> None:
        self._housekeeping()

    def _housekeeping(self) -> None:
        self._queue.poll()
        if self._sink.sessions is not None:
            self._sink.sessions.retry_pending()

    def release(self) -> None:
        counts = self._queue.drain()
        if self._sink.sessions is not None:
            self._sink.sessions.drop_pending()
        log.info("%s: released (%s)", self.name, counts)


    # -- frames ---------------------------------------------------------------------------

    def _handle(self, ws: WsConnection, raw: bytes) -> None:
        if isinstance(raw, Binary):
            self._bad("binary", "a binary frame (Pusher sends text)", raw)
            return
        try:
            result = interpret(self.account_id, raw, self._clock(), bucket_secs=self._bucket)
        except BadFrame as exc:
            self._bad(exc.reason, str(exc), raw)
            return
        if result.kind in ("chat", "event"):
            why = foreign_channel(result.frame, self.channels, self.chatroom_id)
            if why is not None:
                # Another chatroom's chat or events must never be stored as this account's.
                self.refuse_foreign("foreign_channel", f"{result.frame.name[:64]}", why, logger=log)
                return
        self.metrics.source_frames.labels(PLATFORM, result.kind).inc()
        if result.kind == "control":
            self._control(ws, result.frame.event, result.frame.channel, result.frame.data)
        elif result.kind == "unsupported":
            self.metrics.source_bad_frames.labels(PLATFORM, "unsupported").inc()
            log.debug("%s: unsupported event %r on %s skipped", self.name, result.frame.event[:80],
                      result.frame.channel)
        for item in result.items:
            if item.chat is not None:
                self._queue.add(item.chat)
            elif item.event is not None:
                self._sink.persist(item.event, item.stream)

    def _control(self, ws: WsConnection, event: str, channel: str | None, data: Any) -> None:
        if event == "pusher:ping":
            try:
                ws.send_text('{"event":"pusher:pong","data":{}}')
            except WsClosed as exc:
                raise SourceClosed(str(exc)) from None
            self.pongs_sent += 1
        elif event == "pusher_internal:subscription_succeeded" and channel:
            self.subscribed.add(channel)
            self._retry_at.pop(channel, None)
            self.source_state.subscribed(channel)
            self.metrics.source_subscriptions.labels(PLATFORM, "ok").inc()
            if self.subscribed.issuperset(self.channels):
                self.mark_healthy()  # a working session: the next drop starts the backoff over
        elif event == "pusher:subscription_error":
            self._subscribe_refused(channel, data)
        elif event == "pusher:error":
            inner = data if isinstance(data, dict) else {}
            code = inner.get("code") if isinstance(inner.get("code"), int) else None
            message = str(inner.get("message") or "")[:200]
            if code is None:
                log.warning("%s: pusher:error without a code: %s", self.name, message)
                return
            self._closed_with(code, message)
            self._queue.drain()
            why = f"pusher:error {code}: {message}"
            raise PeerClosed(code, why, message=why)

    def _bad(self, reason: str, why: str, raw: bytes) -> None:
        self.metrics.source_frames.labels(PLATFORM, "bad").inc()
        self.metrics.source_bad_frames.labels(PLATFORM, reason).inc()
        self.quarantine_frame(reason, raw, why)
        log.warning("%s: refused a frame (%s): %s", self.name, reason, why[:300])

    def _closed_with(self, code: int | None, reason: str) -> None:
        kind = close_class(code)
        # The class, not the code, labels the metric: a bounded set of values.
        label = kind if kind != "other" else (
            "none" if code is None else str(code) if code in (1000, 1001, 1006, 1011) else "other")
        self.metrics.source_closes.labels(PLATFORM, label).inc()
        if kind == "config":
            log.error("%s: Kick's Pusher server refused this client with %s (%s): check [kick] "
                      "pusher_url (app key, protocol version); retrying in %.0fs", self.name, code,
                      reason[:200], self._config_backoff)
            self.force_backoff(self._config_backoff)
        elif kind == "retry":
            log.info("%s: closed with %s (%s); reconnecting at once", self.name, code, reason[:200])
            self.force_backoff(0.0)
        elif kind == "backoff":
            log.warning("%s: closed with %s (%s); backing off", self.name, code, reason[:200])
            self.force_backoff(max(1.0, self.jittered_backoff()))
