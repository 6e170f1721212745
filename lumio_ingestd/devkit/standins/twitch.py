"""A stand-in Twitch on loopback: an EventSub WebSocket server, Helix and OAuth over real HTTP.

Used by the tests, the benchmarks and `lumio-ingestd demo` (it needs the
`websockets` package: the `demo` and `test` extras).

It mirrors what docs/platforms.rst ("Twitch") and the twitch-cli mock server
document, over real sockets:

- WebSocket `ws://127.0.0.1:P/ws`: a `session_welcome` on connect, with the
  `keepalive_timeout_seconds` the URL asks for (clamped to `min_keepalive`..600;
  Twitch's minimum is 10, tests lower it to keep runs short);
  `session_keepalive` whenever nothing else was sent for that long (unless
  switched off: a silent, half-dead connection); WebSocket pings every
  `ping_interval_secs` and close 4002 when a pong is missing; close 4003 when
  no subscription was created within `subscribe_window_secs` of the welcome;
  close 4001 when the client sends a data frame (recorded in `inbound`);
  `session_reconnect` with a URL carrying `reconnect_id`, where the new
  connection inherits the old session's subscriptions, the old session gets
  notifications until the new welcome is sent, and is closed with 4004 when
  the client has not closed it `reconnect_grace_secs` later; revocations;
  any close code on request.
- Helix `POST {helix_url}/eventsub/subscriptions`: checks `Client-Id`, the
  bearer token, the type/version, the condition keys Twitch's reference names,
  and that the session exists and is open (closed sessions answer 400 like
  Twitch: "websocket transport session does not exist or has already
  disconnected"); 202 with the subscription, 409 for a repeat on the same
  session; `helix_delay_secs` and `helix_status` inject slowness and errors.
- Helix `GET {helix_url}/eventsub/subscriptions` with at most one filter
  (`status`, `type`, `user_id`: any condition value, `subscription_id`) and
  `after=CURSOR`: `{"data": [{id, status, type, version, condition,
  created_at, transport{method, session_id, connected_at, disconnected_at},
  cost}], "total", "total_cost", "max_total_cost", "pagination": {"cursor"}}`,
  `helix_page_size` a page (100); the subscriptions of a session that ended
  are listed `websocket_disconnected` with `disconnected_at`. `DELETE
  {helix_url}/eventsub/subscriptions?id=ID`: 204, 404 for an unknown id.
  `eventsub_faults` makes the next answers of a method an error status;
  `eventsub_requests` records every request to the endpoint.
- Orphans (`orphan_secs`, None by default): as Twitch does, a session whose
  socket died without a clean close (`cut()`: the TCP connection dropped,
  no close frame either way; `black_hole()`: nothing gets through any more,
  and the client's own close never arrives) keeps its subscriptions enabled
  for `orphan_secs`. Meanwhile a POST of the same type, version and
  condition by any session is refused with 409, the listing shows the
  orphan `enabled`, and `notify()` sends the type's notifications to the
  dead session: nobody receives them (their ids go to `undelivered`).
  Deleting the orphan's subscription frees it at once. A session closed
  with a close frame (either way) gives its subscriptions up at once. With
  `orphan_secs` None a subscription ends with its session however the
  socket ended, and only a repeat on the same session is a 409.
- Helix `GET {helix_url}/channels/followers?broadcaster_id=ID&first=N&after=C`
  (the user token and `Client-Id`): the channel's followers newest first,
  `{"data": [{user_id, user_login, user_name, followed_at}], "total": N,
  "pagination": {"cursor": C}}`. `follow()` adds a follower and sends its
  `channel.follow` notification when a session is subscribed, so the list and
  the socket tell the same history; `followers_faults` makes the next answers
  500, 429 (with `Ratelimit-Reset`) or 401; `followers_requests` records them.
- OAuth `GET {oauth_url}/validate` (`Authorization: OAuth <token>`) and
  `POST {oauth_url}/token` (grant_type=refresh_token with the client id and
  secret): 200 with a fresh pair, 400 for a wrong refresh token;
  grant_type=client_credentials: 200 with a new app token (`app_tokens`).
- Helix `GET {helix_url}/streams?user_id=..&user_id=..` (up to 100 ids, an
  app or user token and `Client-Id`): the live streams among them, as
  `{"data": [{id, user_id, user_login, user_name, game_id, game_name, type,
  title, viewer_count, started_at, ...}], "pagination": {}}`, with the
  token-bucket headers `Ratelimit-Limit`, `Ratelimit-Remaining` and
  `Ratelimit-Reset` (epoch seconds), and 429 once the bucket is empty.
  `set_live()` / `set_offline()` drive it; `streams_hang` makes it accept
  and never answer, `streams_status` forces an error, `streams_extra` adds
  items (malformed ones) to every answer, `streams_requests` records every
  request.

Callers drive it with `notify()`, `send_raw()`, `send_bulk()` (load), `reconnect()`, `revoke()`,
`close_session()`, `cut()`, `black_hole()`, `set_keepalive()` and `expire_access_token()`, and read
what happened from `sessions`, `subscriptions`, `inbound` and the counters.
Several broadcasters may connect at once (one session each); `notify(...,
broadcaster=ID)` sends to the session subscribed for that broadcaster. One
client id and one token pair serve every broadcaster.

A driving call whose precondition does not hold (no such session, a closed
session) raises `StandinError`, an AssertionError, so a test reads it as a
failed expectation. The `websockets` sync server starts threads per
connection; that is fine for a stand-in peer (the daemon's own client must
not). Nothing durable here.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.sync.server import ServerConnection

from lumio_ingestd.devkit.standins.base import JsonHandler, StandinHttpServer, StandinServers
from lumio_ingestd.devkit.standins.twitch_events import now_text

# type+version -> condition keys that must all be present (any one of the tuples).
CONDITIONS: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {
    ("channel.chat.message", "1"): (("broadcaster_user_id", "user_id"),),
    ("channel.chat.notification", "1"): (("broadcaster_user_id", "user_id"),),
    ("channel.subscribe", "1"): (("broadcaster_user_id",),),
    ("channel.subscription.gift", "1"): (("broadcaster_user_id",),),
    ("channel.subscription.message", "1"): (("broadcaster_user_id",),),
    ("channel.cheer", "1"): (("broadcaster_user_id",),),
    ("channel.raid", "1"): (("to_broadcaster_user_id",), ("from_broadcaster_user_id",)),
    ("channel.follow", "2"): (("broadcaster_user_id", "moderator_user_id"),),
    ("channel.channel_points_custom_reward_redemption.add", "1"): (("broadcaster_user_id",),),
    ("stream.online", "1"): (("broadcaster_user_id",),),
    ("stream.offline", "1"): (("broadcaster_user_id",),),
}


class StandinError(AssertionError):
    """The stand-in was asked for something its state does not allow (no such session, closed)."""


def _broadcaster_of(subscription: Mapping[str, Any]) -> str | None:
    """The broadcaster a subscription is about (`to_broadcaster_user_id` for raids to them)."""
    condition = subscription.get("condition") or {}
    value = condition.get("broadcaster_user_id") or condition.get("to_broadcaster_user_id")
    return value if isinstance(value, str) else None


@dataclass
class StandinSession:
    id: str
    conn: ServerConnection
    keepalive_secs: int
    reconnect_of: StandinSession | None
    opened_at: float = field(default_factory=time.monotonic)
    welcomed_at: float | None = None
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    keepalive: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    close_code: int | None = None  # the code the stand-in closed it with (None: the client closed)
    closed_at: float | None = None
    reconnect_sent_at: float | None = None
    handed_over: bool = False  # the new session's welcome went out: no more notifications here
    connected_at: str = field(default_factory=now_text)
    disconnected_at: str | None = None  # RFC 3339, once the socket ended
    #: Monotonic time the socket died without a clean close (with `orphan_secs` set): its
    #: subscriptions stay enabled `orphan_secs` longer.
    orphaned_at: float | None = None
    black_holed: bool = False  # nothing gets through either way (`black_hole()`)
    last_sent: float = field(default_factory=time.monotonic)
    sent: list[str] = field(default_factory=list)  # message ids of notifications sent here
    pongs: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def open(self) -> bool:
        return not self.closed.is_set()


class _HttpServer(StandinHttpServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up on a request (a hung /streams, on purpose) is no error here.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class TwitchStandin(StandinServers):
    def __init__(self, *, client_id: str = "standin-client-id", client_secret: str = "standin-client-secret",
                 user_id: str = "12826", access_token: str = "access-0",
                 refresh_token: str = "refresh-0", subscribe_window_secs: float = 10.0,
                 min_keepalive: int = 10, ping_interval_secs: float | None = None,
                 pong_timeout_secs: float = 5.0, reconnect_grace_secs: float = 30.0,
                 reconnect_welcome_delay_secs: float = 0.0, orphan_secs: float | None = None) -> None:
        super().__init__("twitch", lock=threading.Lock(), http_handler=_http_handler(self),
                         http_server=_HttpServer, loops=[("timers", self._timers)], wait_poll_secs=0.1)
        self.client_id = client_id
        self.client_secret = client_secret
        self.user_id = user_id
        self.access_token = access_token
        self.refresh_token = refresh_token
        self.subscribe_window_secs = subscribe_window_secs
        self.min_keepalive = min_keepalive
        self.ping_interval_secs = ping_interval_secs
        self.pong_timeout_secs = pong_timeout_secs
        self.reconnect_grace_secs = reconnect_grace_secs
        self.reconnect_welcome_delay_secs = reconnect_welcome_delay_secs
        self.orphan_secs = orphan_secs
        self.helix_page_size = 100
        #: Method -> statuses the next requests to /eventsub/subscriptions answer instead.
        self.eventsub_faults: dict[str, list[int]] = {}
        self.eventsub_requests: list[tuple[str, int]] = []  # (method, status)
        self.undelivered: list[str] = []  # notifications Twitch sent to a dead session
        #: Keep every notification's message id in its session's `sent` (tests read it; a
        #: long-running demo turns it off, or the list grows without end).
        self.record_sent = True
        self.helix_delay_secs = 0.0
        self.helix_status: dict[str, int] = {}  # subscription type -> forced error status
        self.sessions: list[StandinSession] = []
        # Helix /streams: user id -> the stream object; the app tokens given out.
        self.live: dict[str, dict[str, Any]] = {}
        self.app_tokens: list[str] = []
        self.app_token_lifetime_secs = 5_000_000
        self.app_token_grants = 0
        self.streams_requests: list[dict[str, Any]] = []  # {"status", "user_ids", "token"}
        self.streams_status: int | None = None  # forced error status of GET /streams
        self.streams_hang = False  # accept GET /streams and never answer (until close)
        self.streams_extra: list[Any] = []  # items added to every answer (malformed ones, say)
        self.ratelimit_points = 800  # the bucket: points per minute
        self._bucket = 800
        self._bucket_reset = 0.0
        self.subscriptions: list[dict[str, Any]] = []  # every subscription created (with "elapsed")
        self.helix_requests: list[tuple[int, str]] = []  # (status, type)
        self.followers: dict[str, list[dict[str, str]]] = {}  # broadcaster -> followers, oldest first
        self.followers_faults: list[int] = []  # statuses the next follower requests answer
        self.followers_requests: list[tuple[float, int]] = []  # (time, status)
        self.inbound: list[tuple[str, object]] = []  # (session id, data frame) the client sent
        self.connections = 0  # WebSocket handshakes completed (a session exists once welcomed)
        self.validations = 0
        self.refreshes = 0
        self._counter = itertools.count(1)
        self._tokens = itertools.count(1)

    # -- URLs (the base owns the servers' lifecycle) -----------------------------------------

    @property
    def ws_url(self) -> str:
        return self._ws_url("/ws")

    @property
    def helix_url(self) -> str:
        return self._http_url("/helix")

    @property
    def oauth_url(self) -> str:
        return self._http_url("/oauth2")

    # -- waiting ---------------------------------------------------------------------------

    def wait_session(self, n: int, *, subscribed: bool = True, timeout: float = 10.0) -> StandinSession:
        """The n-th session (1-based) once it exists (and has subscriptions, if asked)."""
        ok = self.wait_for(lambda: len(self.sessions) >= n and (
            not subscribed or bool(self.sessions[n - 1].subscriptions)), timeout)
        seen = [(s.id, len(s.subscriptions), s.close_code) for s in self.sessions]
        if not ok:
            raise StandinError(f"session {n} did not appear{' with subscriptions' if subscribed else ''} "
                               f"within {timeout}s (sessions: {seen})")
        return self.sessions[n - 1]

    # -- the WebSocket side -----------------------------------------------------------------

    def _handle_ws(self, conn: ServerConnection) -> None:
        request = conn.request
        assert request is not None
        with self._lock:
            self.connections += 1
        self._notify()
        query = parse_qs(urlsplit(request.path).query)
        old: StandinSession | None = None
        if "reconnect_id" in query:
            with self._lock:
                old = next((s for s in self.sessions if s.id == query["reconnect_id"][0]), None)
            if old is None or not old.open or old.reconnect_sent_at is None:
                conn.close(4007, "invalid reconnect url")
                return
            keepalive = old.keepalive_secs
        else:
            try:
                asked = int(query.get("keepalive_timeout_seconds", ["10"])[0])
            except ValueError:
                asked = 10
            keepalive = max(self.min_keepalive, min(600, asked))
        session = StandinSession(f"standin-session-{next(self._counter)}", conn, keepalive, old)
        session.keepalive.set()
        if old is not None:
            session.subscriptions = dict(old.subscriptions)  # moved, not re-created
            if self.reconnect_welcome_delay_secs:
                # The overlap a test wants to exercise: the old socket stays live meanwhile.
                self._stop.wait(self.reconnect_welcome_delay_secs)
        with self._lock:
            self.sessions.append(session)
        self._send(session, {
            "metadata": self._metadata("session_welcome"),
            "payload": {"session": {"id": session.id, "status": "connected",
                                    "connected_at": session.connected_at,
                                    "keepalive_timeout_seconds": keepalive,
                                    "reconnect_url": None}}})
        session.welcomed_at = time.monotonic()
        if old is not None:
            old.handed_over = True
        self._notify()
        try:
            while not session.closed.is_set():
                try:
                    data = conn.recv(timeout=0.1)
                except TimeoutError:
                    continue
                if session.black_holed:
                    continue  # it never reaches Twitch
                self.inbound.append((session.id, data))
                self.close_session(session, 4001, "client sent inbound traffic")
        except ConnectionClosed:
            pass
        finally:
            self._ended(session)

    def _ended(self, session: StandinSession) -> None:
        """The session's socket is gone. Unless the stand-in closed it (`close_session`), it is an
        orphan when no close frame of the client's reached Twitch (with `orphan_secs` set)."""
        with session.lock:
            if not session.closed.is_set():
                session.closed_at = time.monotonic()
                clean = session.conn.protocol.close_rcvd is not None and not session.black_holed
                if not clean and self.orphan_secs is not None:
                    session.orphaned_at = session.closed_at
                session.disconnected_at = now_text()
                session.closed.set()
        self._notify()

    def _metadata(self, message_type: str, *, message_id: str | None = None,
                  sub_type: str | None = None, version: str = "1",
                  timestamp: str | None = None) -> dict[str, Any]:
        md = {"message_id": message_id or str(uuid.uuid4()), "message_type": message_type,
              "message_timestamp": timestamp or now_text()}
        if sub_type is not None:
            md["subscription_type"] = sub_type
            md["subscription_version"] = version
        return md

    def _send(self, session: StandinSession, frame: Mapping[str, Any] | str | bytes,
              *, text: bool = True) -> bool:
        data = frame if isinstance(frame, (str, bytes)) else json.dumps(frame)
        with session.lock:
            if session.closed.is_set():
                return False
            if session.black_holed:
                return True  # sent, as far as Twitch knows; it never arrives
            try:
                session.conn.send(data, text=text)
            except ConnectionClosed:
                return False
            session.last_sent = time.monotonic()
        return True

    def _timers(self) -> None:
        """Keepalives, pings, the subscription window and the reconnect grace, for every session."""
        pings: dict[str, tuple[threading.Event, float]] = {}
        while not self._stop.wait(0.05):
            now = time.monotonic()
            with self._lock:
                sessions = [s for s in self.sessions if s.open]
            for s in sessions:
                if s.welcomed_at is None or s.black_holed:
                    continue  # a black hole: Twitch has not noticed, and nothing would arrive
                if not s.subscriptions and now - s.welcomed_at > self.subscribe_window_secs:
                    self.close_session(s, 4003, "connection unused")
                    continue
                if s.reconnect_sent_at is not None and now - s.reconnect_sent_at > self.reconnect_grace_secs:
                    self.close_session(s, 4004, "reconnect grace time expired")
                    continue
                if s.keepalive.is_set() and now - s.last_sent >= s.keepalive_secs:
                    self._send(s, {"metadata": self._metadata("session_keepalive"), "payload": {}})
                if self.ping_interval_secs is not None:
                    pending = pings.get(s.id)
                    if pending is not None and pending[0].is_set():
                        s.pongs += 1
                        pings.pop(s.id)
                    elif pending is not None and now - pending[1] > self.pong_timeout_secs:
                        pings.pop(s.id)
                        self.close_session(s, 4002, "client failed ping-pong")
                        continue
                    if s.id not in pings and now - s.opened_at >= self.ping_interval_secs * (s.pongs + 1):
                        try:
                            with s.lock:
                                pings[s.id] = (s.conn.ping(), now)
                        except ConnectionClosed:
                            pass

    # -- driving it -------------------------------------------------------------------------

    def active_session(self, sub_type: str, broadcaster: str | None = None) -> StandinSession | None:
        """Where Twitch would send a notification of this type (for this broadcaster) now."""
        with self._lock:
            for s in reversed(self.sessions):
                if s.open and not s.handed_over and sub_type in s.subscriptions and (
                        broadcaster is None or _broadcaster_of(s.subscriptions[sub_type]) == broadcaster):
                    return s
        return None

    def holder(self, sub_type: str, broadcaster: str | None = None) -> StandinSession | None:
        """The session holding an enabled subscription of this type (for this broadcaster):
        `active_session`, or with `orphan_secs` set an orphan whose socket is gone."""
        if self.orphan_secs is None:
            return self.active_session(sub_type, broadcaster)
        now = time.monotonic()
        with self._lock:
            for s in reversed(self.sessions):
                if self._holds(s, now) and sub_type in s.subscriptions and (
                        broadcaster is None or _broadcaster_of(s.subscriptions[sub_type]) == broadcaster):
                    return s
        return None

    def _holds(self, session: StandinSession, now: float) -> bool:
        """Whether Twitch takes the session's subscriptions as enabled at `now`."""
        if session.handed_over:
            return False  # they moved to the session it handed over to
        if session.open:
            return True
        return (session.orphaned_at is not None and self.orphan_secs is not None
                and now - session.orphaned_at < self.orphan_secs)

    def notify(self, sub_type: str, event: Mapping[str, Any], *, session: StandinSession | None = None,
               broadcaster: str | None = None, message_id: str | None = None,
               timestamp: str | None = None, version: str = "1") -> str:
        """Send one notification; returns its message id. Raises StandinError when it did not go out.

        The session is `session`, else the one Twitch would use for this type
        (and for `broadcaster`, when given): with `orphan_secs` set that may be
        an orphan or a black-holed session, and then the notification goes
        nowhere (its id is added to `undelivered`)."""
        target = session or self.holder(sub_type, broadcaster)
        if target is None:
            raise StandinError(f"no open session subscribed to {sub_type}"
                               + (f" for broadcaster {broadcaster}" if broadcaster else ""))
        frame = self.notification(target, sub_type, event, message_id=message_id, timestamp=timestamp,
                                  version=version)
        if target.black_holed or (target.orphaned_at is not None and not target.open):
            lost = str(frame["metadata"]["message_id"])
            with self._lock:
                self.undelivered.append(lost)
            return lost
        if not self._send(target, frame):
            raise StandinError(f"session {target.id} is closed")
        message_id = str(frame["metadata"]["message_id"])
        if self.record_sent:
            target.sent.append(message_id)
        return message_id

    def notification(self, session: StandinSession, sub_type: str, event: Mapping[str, Any], *,
                     message_id: str | None = None, timestamp: str | None = None,
                     version: str = "1") -> dict[str, Any]:
        """The notification frame Twitch would send on `session` now (built, not sent)."""
        sub = session.subscriptions.get(sub_type) or {
            "id": str(uuid.uuid4()), "status": "enabled", "type": sub_type, "version": version,
            "cost": 0, "condition": {"broadcaster_user_id": self.user_id},
            "transport": {"method": "websocket", "session_id": session.id}, "created_at": now_text()}
        md = self._metadata("notification", message_id=message_id, sub_type=sub_type,
                            version=sub.get("version", version), timestamp=timestamp)
        return {"metadata": md, "payload": {"subscription": sub, "event": dict(event)}}

    def follow(self, user_id: str, login: str, *, broadcaster: str | None = None,
               broadcaster_login: str = "standin", followed_at: str | None = None,
               notify: bool = True) -> bool:
        """A new follower of `broadcaster` (default `user_id`): kept in the list, and announced
        on a subscribed session if there is one (then True)."""
        channel = broadcaster or self.user_id
        event = {"user_id": user_id, "user_login": login, "user_name": login.title(),
                 "broadcaster_user_id": channel, "broadcaster_user_login": broadcaster_login,
                 "broadcaster_user_name": broadcaster_login.title(),
                 "followed_at": followed_at or now_text()}
        with self._lock:
            self.followers.setdefault(channel, []).append(
                {k: event[k] for k in ("user_id", "user_login", "user_name", "followed_at")})
        if notify:
            try:
                self.notify("channel.follow", event, broadcaster=channel, version="2")
                return True
            except StandinError:
                pass  # nobody subscribed now: only the list knows (a gap)
        return False

    def _followers(self, headers: Mapping[str, str], query: str
                   ) -> tuple[int, dict[str, Any], dict[str, str]]:
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        token = (headers.get("authorization") or "").removeprefix("Bearer ")
        with self._lock:
            fault = self.followers_faults.pop(0) if self.followers_faults else None
            status, obj, extra = self._followers_answer(headers, token, params, fault)
            self.followers_requests.append((time.monotonic(), status))
        self._notify()
        return status, obj, extra

    def _followers_answer(self, headers: Mapping[str, str], token: str, params: Mapping[str, str],
                          fault: int | None) -> tuple[int, dict[str, Any], dict[str, str]]:
        if fault == 429:
            return 429, {"error": "Too Many Requests", "status": 429, "message": "Too Many Requests"}, {
                "Ratelimit-Reset": str(int(time.time()) + 1)}
        if fault is not None:
            return fault, {"error": "Forced", "status": fault, "message": f"forced {fault}"}, {}
        if headers.get("client-id") != self.client_id or token != self.access_token:
            return 401, {"error": "Unauthorized", "status": 401, "message": "Invalid OAuth token"}, {}
        channel = params.get("broadcaster_id") or ""
        if not channel:
            return 400, {"error": "Bad Request", "status": 400, "message": "broadcaster_id"}, {}
        try:
            first = max(1, min(100, int(params.get("first", "20"))))
            start = int(params.get("after", "0") or "0")
        except ValueError:
            return 400, {"error": "Bad Request", "status": 400, "message": "bad first or after"}, {}
        newest = list(reversed(self.followers.get(channel, [])))
        page = newest[start:start + first]
        nxt = start + len(page)
        return 200, {"data": [dict(f) for f in page], "total": len(newest),
                     "pagination": {"cursor": str(nxt)} if nxt < len(newest) else {}}, {}

    def send_raw(self, session: StandinSession, data: str | bytes, *, text: bool = True) -> bool:
        return self._send(session, data, text=text)

    @staticmethod
    def encode_bulk(frames: Sequence[str]) -> list[bytes]:
        """Text frames as the wire bytes `send_bulk` writes (unmasked server frames).

        Done before a load test, so that the send itself costs the server
        nothing but `sendall`.
        """
        return [Frame(Opcode.TEXT, frame.encode()).serialize(mask=False) for frame in frames]

    def send_bulk(self, session: StandinSession, frames: Sequence[bytes], *,
                  chunk_bytes: int = 1 << 20) -> int:
        """Load generation: frames made by `encode_bulk`, written to the socket in large chunks.

        The per-message path (`notify`) costs far more than a client needs to
        read a frame, so a benchmark of the client would measure this server.
        Here the frames arrive encoded and are written with `sendall`, under
        the session's send lock; the WebSocket library's state is untouched,
        since the server's own outgoing frames do not change it. Returns how
        many were written.
        """
        sent = 0
        with session.lock:
            if session.closed.is_set() or session.black_holed:
                return 0
            buffer: list[bytes] = []
            size = 0
            try:
                for data in frames:
                    buffer.append(data)
                    size += len(data)
                    if size >= chunk_bytes:
                        session.conn.socket.sendall(b"".join(buffer))
                        sent += len(buffer)
                        buffer, size = [], 0
                if buffer:
                    session.conn.socket.sendall(b"".join(buffer))
                    sent += len(buffer)
            except OSError:
                return sent
            session.last_sent = time.monotonic()
        return sent

    def set_keepalive(self, session: StandinSession, enabled: bool) -> None:
        if enabled:
            session.keepalive.set()
        else:
            session.keepalive.clear()

    def reconnect_url(self, session: StandinSession) -> str:
        """The URL a session_reconnect for `session` carries (its grace time starts now)."""
        session.reconnect_sent_at = time.monotonic()
        return f"{self.ws_url}?reconnect_id={session.id}"

    def reconnect(self, session: StandinSession, url: str | None = None) -> str:
        """Send session_reconnect; returns the reconnect URL given."""
        url = url or self.reconnect_url(session)
        session.reconnect_sent_at = time.monotonic()
        self._send(session, {"metadata": self._metadata("session_reconnect"), "payload": {"session": {
            "id": session.id, "status": "reconnecting", "keepalive_timeout_seconds": None,
            "reconnect_url": url, "connected_at": now_text()}}})
        return url

    def revoke(self, session: StandinSession, sub_type: str, status: str = "authorization_revoked") -> None:
        sub = dict(session.subscriptions.pop(sub_type))
        sub["status"] = status
        self._send(session, {"metadata": self._metadata("revocation", sub_type=sub_type,
                                                         version=sub["version"]),
                             "payload": {"subscription": sub}})

    def close_session(self, session: StandinSession, code: int, reason: str = "") -> None:
        with session.lock:
            if session.closed.is_set():
                return
            session.close_code = code
            session.closed_at = time.monotonic()
            session.disconnected_at = now_text()
            session.closed.set()
        try:
            session.conn.close(code, reason)
        except ConnectionClosed:
            pass
        self._notify()

    def cut(self, session: StandinSession) -> None:
        """The TCP connection dies without a close frame either way (a dropped route, a reset):
        the client reads the end of the stream; Twitch never saw a close."""
        try:
            session.conn.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # gone already
        self.wait_for(lambda: session.closed.is_set(), 5)

    def black_hole(self, session: StandinSession) -> None:
        """From now on nothing gets through either way, and the TCP connection stays up: the
        client hears nothing (its keepalive timer ends it), and Twitch neither sends it
        anything nor sees its close frame."""
        with session.lock:
            session.black_holed = True

    def expire_access_token(self) -> None:
        """The current access token stops working (validate and Helix answer 401)."""
        with self._lock:
            self.access_token = f"expired-{next(self._tokens)}-unusable"

    def set_live(self, user_id: str, *, viewers: int, title: str = "", category: str = "",
                 stream_id: str | None = None, started_at: str | None = None,
                 login: str | None = None) -> str:
        """`user_id` is live (or its numbers change); returns the stream id."""
        with self._lock:
            current = self.live.get(user_id)
            sid = stream_id or (current["id"] if current else str(next(self._counter) + 40_000_000))
            started = started_at or (current["started_at"] if current and current["id"] == sid
                                     else now_text())
            login = login or f"user{user_id}"
            self.live[user_id] = {
                "id": sid, "user_id": user_id, "user_login": login, "user_name": login.title(),
                "game_id": str(abs(hash(category)) % 100000) if category else "",
                "game_name": category, "type": "live", "title": title, "viewer_count": viewers,
                "started_at": started, "language": "en", "tags": [], "is_mature": False,
                "thumbnail_url": f"https://static.example/previews/{login}-{{width}}x{{height}}.jpg"}
            return sid

    def set_offline(self, user_id: str) -> None:
        with self._lock:
            self.live.pop(user_id, None)

    def expire_app_tokens(self) -> None:
        """Every app token given out so far stops working (Helix answers 401)."""
        with self._lock:
            self.app_tokens.clear()

    # -- the HTTP side -----------------------------------------------------------------------

    def _streams(self, headers: Mapping[str, str], query: str
                 ) -> tuple[int, dict[str, Any], dict[str, str]]:
        params = parse_qs(query)
        user_ids = params.get("user_id", [])
        token = (headers.get("authorization") or "").removeprefix("Bearer ")
        record: dict[str, Any] = {"user_ids": list(user_ids), "token": token, "status": 0}
        with self._lock:
            self.streams_requests.append(record)
        self._notify()
        if self.streams_hang:
            self._stop.wait(120)  # set by close()
        now = time.time()
        with self._lock:
            if now >= self._bucket_reset:
                self._bucket, self._bucket_reset = self.ratelimit_points, float(int(now) + 60)
            status, obj = self._streams_answer(headers, token, user_ids)
            if status != 429:
                self._bucket = max(0, self._bucket - 1)
            limits = {"Ratelimit-Limit": str(self.ratelimit_points),
                      "Ratelimit-Remaining": str(self._bucket),
                      "Ratelimit-Reset": str(int(self._bucket_reset))}
            record["status"] = status
        self._notify()
        return status, obj, limits

    def _streams_answer(self, headers: Mapping[str, str], token: str,
                        user_ids: list[str]) -> tuple[int, dict[str, Any]]:
        if headers.get("client-id") != self.client_id:
            return 401, {"error": "Unauthorized", "status": 401, "message": "Client-Id header required"}
        if token not in self.app_tokens and token != self.access_token:
            return 401, {"error": "Unauthorized", "status": 401, "message": "Invalid OAuth token"}
        if self._bucket <= 0:
            return 429, {"error": "Too Many Requests", "status": 429, "message": "Too Many Requests"}
        if self.streams_status is not None:
            return self.streams_status, {"error": "Forced", "status": self.streams_status,
                                         "message": f"forced {self.streams_status}"}
        if len(user_ids) > 100:
            return 400, {"error": "Bad Request", "status": 400,
                         "message": "The number of user_id query parameters exceeds the maximum of 100"}
        data: list[Any] = [dict(self.live[u]) for u in dict.fromkeys(user_ids) if u in self.live]
        return 200, {"data": data + list(self.streams_extra), "pagination": {}}


    def _record(self, method: str, status: int) -> None:
        with self._lock:
            self.eventsub_requests.append((method, status))
        self._notify()

    def _helix_subscribe(self, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        refused = self._eventsub_auth("POST", headers)
        if refused is not None:
            return refused
        try:
            req = json.loads(body)
            sub_type, version = req["type"], req["version"]
            condition, transport = req["condition"], req["transport"]
        except (ValueError, KeyError, TypeError):
            return 400, {"error": "Bad Request", "status": 400, "message": "bad request body"}
        if sub_type in self.helix_status:
            status = self.helix_status[sub_type]
            return status, {"error": "Forced", "status": status, "message": f"forced {status}"}
        wanted = CONDITIONS.get((sub_type, version))
        if wanted is None:
            return 400, {"error": "Bad Request", "status": 400,
                         "message": "invalid subscription type and version"}
        if not any(all(isinstance(condition.get(k), str) and condition[k] for k in keys)
                   for keys in wanted):
            return 400, {"error": "Bad Request", "status": 400, "message": "invalid condition"}
        if transport.get("method") != "websocket":
            return 400, {"error": "Bad Request", "status": 400, "message": "invalid transport method"}
        with self._lock:
            session = next((s for s in self.sessions if s.id == transport.get("session_id")), None)
        if session is None or not session.open:
            return 400, {"error": "Bad Request", "status": 400, "message":
                         "websocket transport session does not exist or has already disconnected"}
        created = {"id": str(uuid.uuid4()), "status": "enabled", "type": sub_type, "version": version,
                   "condition": condition, "created_at": now_text(), "cost": 0,
                   "transport": {"method": "websocket", "session_id": session.id,
                                 "connected_at": session.connected_at}}
        with self._lock:  # checked and taken at once: two sessions asking together get one 409
            if self._conflict(session, sub_type, version, condition):
                return 409, {"error": "Conflict", "status": 409, "message": "subscription already exists"}
            session.subscriptions[sub_type] = created
            elapsed = time.monotonic() - (session.welcomed_at or session.opened_at)
            self.subscriptions.append({**created, "elapsed": elapsed})
        self._notify()
        return 202, {"data": [created], "total": len(session.subscriptions), "total_cost": 0,
                     "max_total_cost": 10}

    def _conflict(self, session: StandinSession, sub_type: str, version: str,
                  condition: Mapping[str, Any]) -> bool:
        """409: a repeat on the same session; with `orphan_secs` set, any enabled subscription
        of that type, version and condition, whichever session holds it. The caller holds the lock."""
        if sub_type in session.subscriptions:
            return True
        if self.orphan_secs is None:
            return False
        now = time.monotonic()
        return any(self._holds(s, now) and sub.get("version") == version
                   and sub.get("condition") == condition
                   for s in self.sessions for t, sub in s.subscriptions.items() if t == sub_type)

    def listed_subscriptions(self) -> list[dict[str, Any]]:
        """Every subscription as the listing shows it, the oldest first: each once (a hand-off
        moves it to the new session), `enabled` while its session holds it, else
        `websocket_disconnected` with the time its session ended."""
        now = time.monotonic()
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        with self._lock:
            for s in self.sessions:
                if s.handed_over:
                    continue
                enabled = self._holds(s, now)
                for sub in s.subscriptions.values():
                    if sub["id"] in seen:
                        continue
                    seen.add(sub["id"])
                    item = {**sub, "transport": dict(sub["transport"])}
                    if not enabled:
                        item["status"] = "websocket_disconnected"
                        item["transport"]["disconnected_at"] = s.disconnected_at
                    out.append(item)
        return out

    def _eventsub_auth(self, method: str, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]] | None:
        """A forced fault or an authentication failure of /eventsub/subscriptions, else None."""
        if self.helix_delay_secs:
            self._stop.wait(self.helix_delay_secs)  # a slow Helix, on purpose
        with self._lock:
            faults = self.eventsub_faults.get(method)
            fault = faults.pop(0) if faults else None
        if fault is not None:
            return fault, {"error": "Forced", "status": fault, "message": f"forced {fault}"}
        if headers.get("client-id") != self.client_id:
            return 401, {"error": "Unauthorized", "status": 401, "message": "Client-Id header required"}
        if headers.get("authorization") != f"Bearer {self.access_token}":
            return 401, {"error": "Unauthorized", "status": 401, "message": "Invalid OAuth token"}
        return None

    def _helix_list(self, headers: Mapping[str, str], query: str) -> tuple[int, dict[str, Any]]:
        refused = self._eventsub_auth("GET", headers)
        if refused is not None:
            return refused
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        filters = [k for k in ("status", "type", "user_id", "subscription_id") if k in params]
        if len(filters) > 1:
            return 400, {"error": "Bad Request", "status": 400,
                         "message": "only one of status, type, user_id and subscription_id may be given"}
        try:
            start = int(base64.urlsafe_b64decode(params["after"]).decode()) if "after" in params else 0
        except (ValueError, binascii.Error):
            return 400, {"error": "Bad Request", "status": 400, "message": "invalid cursor"}
        every = self.listed_subscriptions()
        items = every
        if filters:
            name, value = filters[0], params[filters[0]]
            items = [i for i in every if (
                i["status"] == value if name == "status" else i["type"] == value if name == "type"
                else i["id"] == value if name == "subscription_id"
                else value in (i.get("condition") or {}).values())]
        page = items[start:start + self.helix_page_size]
        end = start + len(page)
        cursor = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
        return 200, {"data": page, "total": len(every),
                     "total_cost": sum(i.get("cost", 0) for i in every if i["status"] == "enabled"),
                     "max_total_cost": 10, "pagination": {"cursor": cursor} if cursor else {}}

    def _helix_delete(self, headers: Mapping[str, str], query: str) -> tuple[int, dict[str, Any] | None]:
        refused = self._eventsub_auth("DELETE", headers)
        if refused is not None:
            return refused
        sub_id = parse_qs(query).get("id", [""])[-1]
        if not sub_id:
            return 400, {"error": "Bad Request", "status": 400,
                         "message": "Missing required parameter \"id\""}
        found = False
        with self._lock:
            for s in self.sessions:  # a hand-off's old session holds the same object: both let go
                for sub_type, sub in list(s.subscriptions.items()):
                    if sub["id"] == sub_id:
                        del s.subscriptions[sub_type]
                        found = True
        self._notify()
        if not found:
            return 404, {"error": "Not Found", "status": 404, "message": "subscription not found"}
        return 204, None

    def _validate(self, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.validations += 1
        if headers.get("authorization") != f"OAuth {self.access_token}":
            return 401, {"status": 401, "message": "invalid access token"}
        return 200, {"client_id": self.client_id, "login": "twitch", "user_id": self.user_id,
                     "scopes": ["user:read:chat", "bits:read"], "expires_in": 14000}

    def _token(self, body: bytes) -> tuple[int, dict[str, Any]]:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") == "client_credentials":
            return self._app_token(form)
        with self._lock:
            self.refreshes += 1
            if (form.get("grant_type") != "refresh_token" or form.get("client_id") != self.client_id
                    or form.get("client_secret") != self.client_secret):
                return 400, {"status": 400, "message": "invalid client"}
            if form.get("refresh_token") != self.refresh_token:
                return 400, {"status": 400, "message": "Invalid refresh token"}
            n = next(self._tokens)
            self.access_token, self.refresh_token = f"access-{n}", f"refresh-{n}"
            return 200, {"access_token": self.access_token, "refresh_token": self.refresh_token,
                         "expires_in": 14000, "scope": ["user:read:chat"], "token_type": "bearer"}


    def _app_token(self, form: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.app_token_grants += 1
            if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
                return 400, {"status": 400, "message": "invalid client secret"}
            token = f"app-{next(self._tokens)}"
            self.app_tokens.append(token)
            return 200, {"access_token": token, "expires_in": self.app_token_lifetime_secs,
                         "token_type": "bearer"}


def _http_handler(standin: TwitchStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            parts = urlsplit(self.path)
            if parts.path == "/oauth2/validate":
                self._answer(*standin._validate(self._headers()))
            elif parts.path == "/helix/streams":
                self._answer(*standin._streams(self._headers(), parts.query))
            elif parts.path == "/helix/channels/followers":
                self._answer(*standin._followers(self._headers(), parts.query))
            elif parts.path == "/helix/eventsub/subscriptions":
                status, obj = standin._helix_list(self._headers(), parts.query)
                standin._record("GET", status)
                self._answer(status, obj)
            else:
                self._answer(404, {"message": "not found"})

        def do_DELETE(self) -> None:  # noqa: N802
            parts = urlsplit(self.path)
            if parts.path == "/helix/eventsub/subscriptions":
                status, obj = standin._helix_delete(self._headers(), parts.query)
                standin._record("DELETE", status)
                self._answer(status, obj)
            else:
                self._answer(404, {"message": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            path = urlsplit(self.path).path
            if path == "/helix/eventsub/subscriptions":
                status, obj = standin._helix_subscribe(self._headers(), body)
                try:
                    sub_type = json.loads(body).get("type", "?")
                except ValueError:
                    sub_type = "?"
                with standin._lock:
                    standin.helix_requests.append((status, sub_type))
                standin._record("POST", status)
                self._answer(status, obj)
            elif path == "/oauth2/token":
                self._answer(*standin._token(body))
            else:
                self._answer(404, {"message": "not found"})

    return Handler
