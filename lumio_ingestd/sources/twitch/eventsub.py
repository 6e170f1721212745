"""The EventSub WebSocket protocol for one account: welcome, keepalive, hand-off, dedup.

`EventSubClient` owns the account's socket (two sockets during a planned
hand-off) and runs on the source's thread. It reads frames, classifies them
(mapping.interpret) and hands notifications, revocations and refused frames
to a `FrameHandler` (the source). It never sends a data frame.

- **Welcome.** `connect()` opens the base URL with
  `?keepalive_timeout_seconds=N` and reads until `session_welcome`; the
  caller then creates the subscriptions with that session id.
- **Keepalive.** Every data frame (notification, keepalive, anything) resets
  the timer; silence longer than the welcome's `keepalive_timeout_seconds`
  plus a margin (20 %, at least 2 s) raises `KeepaliveTimeout`: the
  connection is dead, the source reconnects to the base URL and subscribes
  again (Twitch replays nothing of the gap).
- **Hand-off.** On `session_reconnect` a second socket is opened to
  `reconnect_url` exactly as given, while the old one is still read: both are
  read in turn until the new one's `session_welcome`. Then the old socket is
  drained (read until it has been quiet for a moment) and closed. Nothing is
  resubscribed: the session's subscriptions moved with it. If the new socket
  fails or sends no welcome in time, the old one is kept; Twitch then closes
  it (4004) and the source starts over from the base URL.
- **Live sessions.** The ids of the sessions whose subscriptions the open
  socket carries (the welcomed one, plus each it was handed over to) are kept
  in `chain` and in the process's `LiveSessions` (livesessions.py), and
  dropped when the sockets close: a subscription bound to one of them is
  never taken for an orphan.
- **Duplicates.** Notifications and revocations whose `message_id` was handled
  already (Twitch delivers at least once, and the overlap of a hand-off may
  repeat) are skipped; the recent ids are a bounded cache, and the database
  keys make a repeat that slips past it harmless.

Nothing durable here; the handler stores what it is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.recent import RecentIds
from lumio_ingestd.sources.base import MAX_FRAMES_PER_TURN, BadFrame, PeerClosed, SourceClosed
from lumio_ingestd.sources.twitch.livesessions import LiveSessions
from lumio_ingestd.sources.twitch.mapping import PLATFORM, Envelope, Notification, interpret
from lumio_ingestd.sources.ws import Binary, WsClosed, WsConnection

log = logging.getLogger("lumio_ingestd.sources.twitch.eventsub")




class KeepaliveTimeout(SourceClosed):
    """Nothing arrived for longer than the keepalive timeout plus the margin."""


class FrameHandler(Protocol):
    def on_notification(self, env: Envelope, items: tuple[Notification, ...]) -> None: ...

    def on_revocation(self, env: Envelope) -> None: ...

    def on_bad_frame(self, exc: BadFrame, raw: bytes = b"") -> None: ...

    def on_unsupported(self, env: Envelope) -> None: ...


def connect_url(base_url: str, keepalive_secs: int) -> str:
    """The base URL with keepalive_timeout_seconds set (other query parameters kept)."""
    parts = urlsplit(base_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k != "keepalive_timeout_seconds"]
    query.append(("keepalive_timeout_seconds", str(keepalive_secs)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _session(env: Envelope) -> Mapping[str, Any]:
    session = env.payload.get("session")
    if not isinstance(session, dict):
        raise BadFrame("shape", f"{env.message_type} without payload.session")
    return session


class EventSubClient:
    def __init__(self, base_url: str, keepalive_secs: int, account_id: int, handler: FrameHandler,
                 metrics: Metrics, *, connect_timeout_secs: float = 10.0,
                 welcome_timeout_secs: float = 10.0, margin_secs: float | None = None,
                 handoff_timeout_secs: float = 10.0, drain_quiet_secs: float = 0.25,
                 drain_max_secs: float = 2.0, recent_ids: int = 10_000, name: str = "twitch",
                 live: LiveSessions | None = None) -> None:
        self.base_url = base_url
        self.requested_keepalive = keepalive_secs
        self.account_id = account_id
        self.handler = handler
        self.metrics = metrics
        self.name = name
        self._connect_timeout = connect_timeout_secs
        self._welcome_timeout = welcome_timeout_secs
        self._margin = margin_secs
        self._handoff_timeout = handoff_timeout_secs
        self._drain_quiet = drain_quiet_secs
        self._drain_max = drain_max_secs
        self.recent = RecentIds(recent_ids)
        # Metric children resolved once: `.labels()` per frame is a lock and a dict lookup.
        self._frames = {kind: metrics.source_frames.labels(PLATFORM, kind)
                        for kind in ("chat", "event", "control", "unsupported", "bad")}
        self._duplicates = metrics.source_duplicates.labels(PLATFORM)
        # Chat frames are counted per read turn (one thread owns this count).
        self._chat_frames = 0
        self._current: WsConnection | None = None
        self._pending: WsConnection | None = None
        self._opening: WsConnection | None = None
        self._handoff_started = 0.0
        self.session_id: str | None = None
        #: The sessions whose subscriptions the open socket carries: the one welcomed at
        #: `connect()`, then each a hand-off moved them to (the newest last).
        self.chain: list[str] = []
        self.live = live if live is not None else LiveSessions()
        self.keepalive_secs = keepalive_secs
        self.welcomed_at = 0.0  # monotonic time of the current session's welcome
        self.handoffs = 0
        self._draining = False

    # -- connecting ------------------------------------------------------------

    def connect(self) -> str:
        """Open a new session at the base URL; returns its id once welcomed. Raises on failure."""
        self.reset()
        conn = WsConnection(connect_url(self.base_url, self.requested_keepalive),
                            connect_timeout=self._connect_timeout)
        self._opening = conn
        try:
            conn.open()
            deadline = time.monotonic() + self._welcome_timeout
            while self._opening is conn:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SourceClosed(f"no session_welcome within {self._welcome_timeout:g}s")
                try:
                    data = conn.recv(left)
                except WsClosed as exc:
                    raise PeerClosed(exc.code, exc.reason, peer="Twitch") from None
                if data is not None:
                    self._dispatch(data, conn)
                elif conn.woken:
                    raise SourceClosed("stopping")
        except Exception:  # clean up, then let it propagate
            self._opening = None
            conn.close()
            raise
        assert self.session_id is not None
        return self.session_id

    def reset(self) -> None:
        """Close every socket and forget the session (the owner's thread)."""
        for conn in (self._current, self._pending, self._opening):
            if conn is not None:
                conn.close()
        self._current = self._pending = self._opening = None
        self.session_id = None
        self.chain = []
        self.live.clear(self.name)

    def abort(self) -> None:
        """From any thread: shut the sockets down so the reader wakes up and ends."""
        self.live.clear(self.name)
        for conn in (self._current, self._pending, self._opening):
            if conn is not None:
                conn.abort()

    def wake(self) -> None:
        """From any thread, for a graceful stop: the reader returns once nothing is left to read
        without waiting; the sockets stay whole for `drain()`."""
        for conn in (self._current, self._pending, self._opening):
            if conn is not None:
                conn.wake()

    def drain(self, max_secs: float) -> int:
        """The owner's thread, after a graceful stop: dispatch what the sockets still hold (all
        Twitch sent before it saw our close frame, within `max_secs`); how many messages.
        No hand-off begins or completes meanwhile; `reset()` closes the sockets after."""
        self._draining = True
        deadline = time.monotonic() + max_secs
        n = 0
        try:
            for conn in (self._current, self._pending):
                if conn is None:
                    continue
                for data in conn.drain(max(0.0, deadline - time.monotonic())):
                    n += 1
                    try:
                        self._dispatch(data, conn)
                    except SourceClosed as exc:  # every subscription revoked: nothing to do now
                        log.info("%s: while draining: %s", self.name, exc)
        finally:
            self._draining = False
            if self._chat_frames:
                self._frames["chat"].inc(self._chat_frames)
                self._chat_frames = 0
        return n

    @property
    def in_handoff(self) -> bool:
        return self._pending is not None

    def dead_after(self) -> float:
        margin = self._margin if self._margin is not None else max(2.0, 0.2 * self.keepalive_secs)
        return self.keepalive_secs + margin

    # -- reading ---------------------------------------------------------------------

    def read(self, budget_secs: float) -> None:
        """Read and dispatch what arrives within `budget_secs`; raises SourceClosed when the
        connection ends (closed, or silent for too long)."""
        try:
            self._read(budget_secs)
        finally:
            if self._chat_frames:
                self._frames["chat"].inc(self._chat_frames)
                self._chat_frames = 0

    def _read(self, budget_secs: float) -> None:
        end = time.monotonic() + budget_secs
        if self._pending is not None:
            self._read_handoff(end)
            return
        conn = self._current
        if conn is None:
            raise SourceClosed("not connected")
        for _ in range(MAX_FRAMES_PER_TURN):
            wait = min(end, conn.last_frame + self.dead_after()) - time.monotonic()
            try:
                # Read before judging silence: frames may wait in the socket buffer
                # (after the subscribe calls, or a slow turn), and they count.
                data = conn.recv(max(wait, 0.001))
            except WsClosed as exc:
                raise PeerClosed(exc.code, exc.reason, peer="Twitch") from None
            if data is None and conn.woken:
                return  # a graceful stop: nothing more to read without waiting
            if data is not None:
                self._dispatch(data, conn)
                if self._pending is not None or self._current is not conn:
                    return  # a hand-off began: the next turn reads both sockets
                if time.monotonic() >= end:
                    # Handling can be slow (each event insert may take its full
                    # bound while the database hangs): end the turn, so the
                    # worker reports progress and the watchdog keeps petting.
                    return
                continue
            now = time.monotonic()
            if now - conn.last_frame >= self.dead_after():
                raise KeepaliveTimeout(
                    f"nothing received for {now - conn.last_frame:.1f}s (keepalive "
                    f"{self.keepalive_secs}s + margin): the connection is dead")
            if now >= end:
                return

    def _read_handoff(self, end: float) -> None:
        while self._pending is not None and time.monotonic() < end:
            old, new = self._current, self._pending
            if new.woken:
                return  # a graceful stop: drain() reads both sockets
            if old is not None:
                try:
                    data = old.recv(0.02)
                except WsClosed as exc:
                    log.info("%s: the old connection closed during the hand-off (%s)", self.name, exc)
                    old.close()
                    self._current = None
                else:
                    if data is not None:
                        self._dispatch(data, old)
            if self._pending is not new:
                continue
            try:
                data = new.recv(0.02 if self._current is not None else 0.2)
            except WsClosed as exc:
                new.close()
                self._pending = None
                self._handoff_failed(f"the new connection closed before its welcome ({exc})")
                return
            if data is not None:
                self._dispatch(data, new)  # its welcome completes the hand-off
            if self._pending is new and time.monotonic() - self._handoff_started > self._handoff_timeout:
                new.close()
                self._pending = None
                self._handoff_failed(f"no session_welcome on the new connection within "
                                     f"{self._handoff_timeout:g}s")

    def _handoff_failed(self, why: str) -> None:
        self.metrics.source_reconnect_handoffs.labels(PLATFORM, "failed").inc()
        if self._current is None:
            raise SourceClosed(f"hand-off failed: {why}; starting over")
        log.warning("%s: hand-off failed: %s; staying on the old connection until Twitch closes it",
                    self.name, why)

    # -- frames ------------------------------------------------------------------------

    def _dispatch(self, data: bytes, conn: WsConnection) -> None:
        try:
            if isinstance(data, Binary):
                raise BadFrame("binary", f"a binary frame of {len(data)} bytes (EventSub sends text)")
            it = interpret(self.account_id, data)
        except BadFrame as exc:
            self._frames["bad"].inc()
            self.handler.on_bad_frame(exc, data)
            return
        env = it.envelope
        if it.kind == "control":
            self._frames["control"].inc()
            try:
                self._control(env, conn)
            except BadFrame as exc:
                self.handler.on_bad_frame(exc, data)
            return
        if it.kind == "unsupported":
            self._frames["unsupported"].inc()
            self.handler.on_unsupported(env)
            return
        if env.message_id in self.recent:
            self._duplicates.inc()
            return
        if it.kind == "chat":
            self._chat_frames += 1
        else:
            self._frames[it.kind].inc()
        self.handler.on_notification(env, it.items)
        self.recent.add(env.message_id)

    def _control(self, env: Envelope, conn: WsConnection) -> None:
        kind = env.message_type
        if kind == "session_keepalive":
            return
        if kind == "revocation":
            if env.message_id in self.recent:
                self._duplicates.inc()
                return
            self.handler.on_revocation(env)
            self.recent.add(env.message_id)
            return
        session = _session(env)
        if self._draining:
            return  # a stop: no hand-off begins or completes now
        if kind == "session_welcome":
            self._welcome(env, session, conn)
        elif kind == "session_reconnect":
            self._reconnect(session, conn)

    def _welcome(self, env: Envelope, session: Mapping[str, Any], conn: WsConnection) -> None:
        session_id = session.get("id")
        if not isinstance(session_id, str) or not session_id:
            raise BadFrame("shape", "session_welcome without payload.session.id")
        keepalive = session.get("keepalive_timeout_seconds")
        if conn is self._opening:
            self._opening = None
            self._current = conn
            self.chain = [session_id]
        elif conn is self._pending:
            old = self._current
            self._current, self._pending = conn, None
            if old is not None:
                self._drain_and_close(old)
            self.handoffs += 1
            self.metrics.source_reconnect_handoffs.labels(PLATFORM, "ok").inc()
            log.info("%s: hand-off to session %s complete (old session %s closed)", self.name,
                     session_id, self.session_id)
        else:
            log.debug("%s: unexpected session_welcome on the current connection; ignored", self.name)
            return
        self.session_id = session_id
        if conn is self._current and session_id not in self.chain:
            self.chain.append(session_id)  # a hand-off: the subscriptions moved here
        self.live.set(self.name, self.chain)
        if isinstance(keepalive, int) and keepalive > 0:
            self.keepalive_secs = keepalive
        self.welcomed_at = time.monotonic()

    def _reconnect(self, session: Mapping[str, Any], conn: WsConnection) -> None:
        url = session.get("reconnect_url")
        if conn is not self._current or self._pending is not None:
            return  # only the live session's own request counts, and one hand-off at a time
        if not isinstance(url, str) or not url:
            raise BadFrame("shape", "session_reconnect without payload.session.reconnect_url")
        log.info("%s: session_reconnect received; opening the new connection", self.name)
        new = WsConnection(url, connect_timeout=self._connect_timeout)  # the URL exactly as given
        self._handoff_started = time.monotonic()
        try:
            new.open()
        except Exception as exc:  # noqa: BLE001 - any failure: keep the old socket, Twitch decides
            new.close()
            self._handoff_failed(f"cannot connect to the reconnect URL ({type(exc).__name__}: {exc})")
            return
        self._pending = new

    def _drain_and_close(self, old: WsConnection) -> None:
        """Read what the old socket still holds (sent before the new welcome), then close it."""
        if old.woken:  # a graceful stop came meanwhile: read up to Twitch's answer to our close
            for message in old.drain(self._drain_max):
                self._dispatch(message, old)
            old.close()
            return
        started = time.monotonic()
        quiet_since = started
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
