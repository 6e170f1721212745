"""A stand-in 7TV on loopback: the EventAPI v3 over a real WebSocket, and the REST API over HTTP.

Used by the tests, the benchmarks and `lumio-ingestd demo` (it needs the
`websockets` package: the `demo` and `test` extras). What it does follows
docs/platforms.rst, "The EventAPI protocol":

- EventAPI `ws://127.0.0.1:P/v3`: op 1 Hello on connect (`heartbeat_interval`,
  `session_id`, `subscription_limit`: None sends -1); op 2 Heartbeat every
  interval while the connection's heartbeats are on; op 35 Subscribe
  (answered with op 5 Ack; a repeat closes with 4009; beyond the limit an
  op 6 Error, the subscription refused: the real server's answer there is
  UNCONFIRMED; every subscribe while `refuse_subscribes` is set; each waits while
  `subscribes_open` is clear), op 36
  Unsubscribe (unknown: 4010), op 34 Resume (answered like the current
  server: `success: false`, nothing restored), any other
  opcode or malformed frame: 4001/4002. Dispatches go to the connections
  subscribed to their (type, object id).
- REST `http://127.0.0.1:P/v3`: `GET /users/twitch/{id}`, `GET /users/{id}`,
  `GET /emote-sets/{id}` (404 when unknown; `rest_status` forces an error,
  `rest_delay_secs` slows every answer down, `trickle_paths` sends the answers to
  those paths a byte at a time). Emotes have the real v3 shape (owner, eight
  host files: about 1.6 KB each), so a full set is as large as the real one.

The data is changed the way a streamer changes it on the website
(`add_emote`, `remove_emote`, `rename_emote`, `switch_set`): the change is
made, then dispatched to the subscribers, unless `dispatch=False` or no
connection is subscribed (the socket is down): the REST API shows it anyway.
Connections are driven with `stop_heartbeats`, `send_raw`, `send_reconnect`
(op 4), `end_of_stream` (op 7 then the close) and `close` (any code);
`dispatch_frames` keeps every dispatch sent, for a test to send one again.

The `websockets` sync server starts threads per connection; that is fine for
a stand-in peer. Nothing durable here.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote, urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection

from lumio_ingestd.devkit.standins.base import JsonHandler, StandinServers

ACTOR = {"id": "01STANDINACTOR000000000000", "username": "standin", "display_name": "Standin"}


@dataclass
class StandinConnection:
    number: int
    session_id: str
    conn: ServerConnection
    subs: set[tuple[str, str]] = field(default_factory=set)
    heartbeats: bool = True
    last_heartbeat: float = field(default_factory=time.monotonic)
    heartbeat_count: int = 0
    closed: threading.Event = field(default_factory=threading.Event)
    close_code: int | None = None
    inbound: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0  # subscriptions refused for the limit
    max_subs: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def open(self) -> bool:
        return not self.closed.is_set()


@dataclass
class StandinUser:
    user_id: str
    twitch_id: str | None
    username: str
    set_id: str | None


class SevenTvStandin(StandinServers):
    def __init__(self, *, heartbeat_interval_ms: int = 1000, subscription_limit: int | None = 500,
                 heartbeat_on_connect: bool = True) -> None:
        super().__init__("seventv", http_handler=_http_handler(self),
                         loops=[("heartbeats", self._heartbeats)])
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.subscription_limit = subscription_limit
        self.heartbeat_on_connect = heartbeat_on_connect
        self.users: dict[str, StandinUser] = {}
        self.sets: dict[str, dict[str, dict[str, Any]]] = {}
        self.connections: list[StandinConnection] = []
        self.rest_requests: list[str] = []
        #: Forces this status on every REST request (None: answer normally).
        self.rest_status: int | None = None
        #: Every REST answer waits this long first (a slow API).
        self.rest_delay_secs = 0.0
        #: REST paths (as requested, e.g. "/v3/users/twitch/123") answered a byte at a time,
        #: one every `trickle_byte_secs`, status line and headers included.
        self.trickle_paths: set[str] = set()
        self.trickle_byte_secs = 1.0
        #: Keep every connection's inbound frames and the dispatch frames sent (a long-running
        #: demo turns it off).
        self.record_inbound = True
        #: The dispatch frames sent, oldest first (a test sends one again, byte for byte).
        self.dispatch_frames: list[str] = []
        self.dispatched = 0
        #: Answer every op 35 Subscribe with an op 6 Error and keep nothing (a welcomed session
        #: that never becomes a working one).
        self.refuse_subscribes = False
        #: Clear: every op 35 Subscribe waits, unread, until it is set again (a busy server: the
        #: subscription is not in place and no Ack comes yet).
        self.subscribes_open = threading.Event()
        self.subscribes_open.set()
        self._numbers = itertools.count(1)
        self._ids = itertools.count(1)
        self._clock_ms = 0

    # -- URLs (the base owns the servers' lifecycle) -----------------------------------------

    @property
    def eventapi_url(self) -> str:
        return self._ws_url("/v3")

    @property
    def api_url(self) -> str:
        return self._http_url("/v3")

    # -- connections --------------------------------------------------------------------------

    def open_connections(self) -> list[StandinConnection]:
        with self._lock:
            return [c for c in self.connections if c.open]

    def subscribers(self, sub_type: str, object_id: str) -> list[StandinConnection]:
        with self._lock:
            return [c for c in self.connections if c.open and (sub_type, object_id) in c.subs]

    def subscribed(self, sub_type: str, object_id: str) -> bool:
        return bool(self.subscribers(sub_type, object_id))

    # -- data -------------------------------------------------------------------------------

    def add_set(self, set_id: str, emotes: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self.sets[set_id] = {}
            for emote_id, name in (emotes or {}).items():
                self.sets[set_id][emote_id] = self._active(emote_id, name, ACTOR["id"])

    def add_user(self, user_id: str, *, twitch_id: str | None = None, set_id: str | None = None,
                 username: str | None = None) -> None:
        with self._lock:
            self.users[user_id] = StandinUser(user_id, twitch_id, username or f"user{user_id[-4:]}",
                                              set_id)
            if set_id is not None and set_id not in self.sets:
                self.sets[set_id] = {}

    def _now_ms(self) -> int:
        # Strictly increasing, so two changes in one millisecond keep their order.
        self._clock_ms = max(self._clock_ms + 1, int(time.time() * 1000))
        return self._clock_ms

    def _active(self, emote_id: str, name: str, actor_id: str | None) -> dict[str, Any]:
        """An ActiveEmote as the real v3 API gives it: with the emote's owner and its eight host
        files (AVIF and WEBP at four sizes), about 1.6 KB of JSON."""
        files = [{"name": f"{n}x.{fmt.lower()}", "static_name": f"{n}x", "width": 32 * n, "height": 32 * n,
                  "frame_count": 1, "size": 1000 * n + len(fmt), "format": fmt}
                 for n in (1, 2, 3, 4) for fmt in ("AVIF", "WEBP")]
        owner = {"id": "01STANDINOWNER000000000000", "username": "emoteowner", "display_name": "EmoteOwner",
                 "avatar_url": "//cdn.standin/pp/01STANDINOWNER000000000000/4aa1786cec024098be20d7b0683bae72",
                 "style": {"color": 16755200, "paint": None}, "roles": ["6076a86b09a4c63a38ebe801"],
                 "connections": None}
        return {"id": emote_id, "name": name, "flags": 0, "timestamp": self._now_ms(),
                "actor_id": actor_id,
                "data": {"id": emote_id, "name": name, "flags": 0, "tags": ["standin", "emote"],
                         "lifecycle": 3, "listed": True, "animated": False, "owner": owner,
                         "host": {"url": f"//cdn.standin/emote/{emote_id}", "files": files}}}

    def add_emote(self, set_id: str, emote_id: str, name: str, *, dispatch: bool = True,
                  actor: Mapping[str, Any] | None = ACTOR) -> dict[str, Any]:
        with self._lock:
            item = self._active(emote_id, name, actor["id"] if actor else None)
            emotes = self.sets[set_id]
            index = len(emotes)
            emotes[emote_id] = item
        if dispatch:
            self._dispatch_set(set_id, actor, pushed=[{"key": "emotes", "index": index, "type": "object",
                                                       "value": item}])
        return item

    def remove_emote(self, set_id: str, emote_id: str, *, dispatch: bool = True,
                     actor: Mapping[str, Any] | None = ACTOR) -> None:
        with self._lock:
            emotes = self.sets[set_id]
            index = list(emotes).index(emote_id)
            old = emotes.pop(emote_id)
        if dispatch:
            self._dispatch_set(set_id, actor, pulled=[{
                "key": "emotes", "index": index, "type": "object", "value": None,
                "old_value": {k: old[k] for k in ("id", "name", "flags", "timestamp", "actor_id")}}])

    def rename_emote(self, set_id: str, emote_id: str, name: str, *, dispatch: bool = True,
                     actor: Mapping[str, Any] | None = ACTOR) -> None:
        with self._lock:
            emotes = self.sets[set_id]
            index = list(emotes).index(emote_id)
            old = dict(emotes[emote_id])
            new = dict(old, name=name)
            emotes[emote_id] = new
        if dispatch:
            keys = ("id", "name", "flags", "timestamp", "actor_id")
            self._dispatch_set(set_id, actor, updated=[{
                "key": "emotes", "index": index, "type": "object",
                "old_value": {k: old[k] for k in keys}, "value": {k: new[k] for k in keys}}])

    def switch_set(self, user_id: str, set_id: str, *, dispatch: bool = True,
                   actor: Mapping[str, Any] | None = ACTOR) -> None:
        with self._lock:
            user = self.users[user_id]
            old, user.set_id = user.set_id, set_id
            self.sets.setdefault(set_id, {})
        if dispatch:
            body = {"id": user_id, "kind": 1, "actor": dict(actor) if actor else None, "updated": [{
                "key": "connections", "index": 0, "nested": True, "type": "", "value": [{
                    "key": "emote_set", "index": None, "type": "object",
                    "old_value": {"id": old, "name": f"set {old}"} if old else None,
                    "value": {"id": set_id, "name": f"set {set_id}"}}]}]}
            self.dispatch("user.update", user_id, body)

    def _dispatch_set(self, set_id: str, actor: Mapping[str, Any] | None, **changes: Any) -> None:
        body: dict[str, Any] = {"id": set_id, "kind": 3, "actor": dict(actor) if actor else None}
        body.update(changes)
        self.dispatch("emote_set.update", set_id, body)

    def dispatch(self, sub_type: str, object_id: str, body: Mapping[str, Any]) -> int:
        """Send a dispatch to every connection subscribed to (type, object id); how many got it."""
        frame = json.dumps({"op": 0, "t": self._now_ms(), "d": {"type": sub_type, "body": body}})
        if self.record_inbound:
            with self._lock:
                self.dispatch_frames.append(frame)
        sent = 0
        for c in self.subscribers(sub_type, object_id):
            if self._send(c, frame):
                sent += 1
        with self._lock:
            self.dispatched += sent
        return sent

    # -- driving connections -------------------------------------------------------------------

    def stop_heartbeats(self, c: StandinConnection) -> None:
        c.heartbeats = False

    def send_raw(self, c: StandinConnection, data: str | bytes, *, text: bool = True) -> bool:
        return self._send(c, data, text=text)

    def send_reconnect(self, c: StandinConnection) -> bool:
        return self._send(c, json.dumps({"op": 4, "t": self._now_ms(), "d": {"reason": "standin"}}))

    def end_of_stream(self, c: StandinConnection, code: int, message: str = "") -> None:
        self._send(c, json.dumps({"op": 7, "t": self._now_ms(), "d": {"code": code, "message": message}}))
        self.close_connection(c, code, message)

    def close_connection(self, c: StandinConnection, code: int, reason: str = "") -> None:
        with c.lock:
            if c.closed.is_set():
                return
            c.close_code = code
            c.closed.set()
        try:
            c.conn.close(code, reason)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._notify()

    # -- the WebSocket side ----------------------------------------------------------------------

    def _send(self, c: StandinConnection, data: str | bytes, *, text: bool = True) -> bool:
        with c.lock:
            if c.closed.is_set():
                return False
            try:
                c.conn.send(data, text=text)
            except (ConnectionClosed, OSError):
                return False
        return True

    def _heartbeats(self) -> None:
        while not self._stop.wait(0.02):
            now = time.monotonic()
            for c in self.open_connections():
                if c.heartbeats and now - c.last_heartbeat >= self.heartbeat_interval_ms / 1000:
                    c.last_heartbeat = now
                    c.heartbeat_count += 1
                    self._send(c, json.dumps({"op": 2, "t": self._now_ms(),
                                              "d": {"count": c.heartbeat_count}}))

    def _handle_ws(self, conn: ServerConnection) -> None:
        number = next(self._numbers)
        c = StandinConnection(number, f"standin-session-{number}", conn,
                              heartbeats=self.heartbeat_on_connect)
        with self._lock:
            self.connections.append(c)
        limit = self.subscription_limit
        self._send(c, json.dumps({"op": 1, "t": self._now_ms(), "d": {
            "heartbeat_interval": self.heartbeat_interval_ms, "session_id": c.session_id,
            "subscription_limit": -1 if limit is None else limit,
            "instance": {"name": "standin", "population": len(self.open_connections())}}}))
        self._notify()
        try:
            while not c.closed.is_set():
                try:
                    data = conn.recv(timeout=0.1)
                except TimeoutError:
                    continue
                self._inbound(c, data)
        except ConnectionClosed:
            pass
        finally:
            if not c.closed.is_set():
                c.closed.set()
            self._notify()

    def _inbound(self, c: StandinConnection, data: str | bytes) -> None:
        try:
            msg = json.loads(data)
            op, d = msg["op"], msg.get("d") or {}
        except (ValueError, KeyError, TypeError):
            self.close_connection(c, 4002, "invalid payload")
            return
        if self.record_inbound:
            c.inbound.append(msg)
        if op in (35, 36):
            cond = d.get("condition") if isinstance(d, dict) else None
            key = (d.get("type"), cond.get("object_id") if isinstance(cond, dict) else None)
            if not isinstance(key[0], str) or not isinstance(key[1], str):
                self.close_connection(c, 4002, "invalid subscription")
                return
            sub = (key[0], key[1])
            if op == 35:
                while not self.subscribes_open.wait(0.05):
                    if c.closed.is_set() or self._stop.is_set():
                        return
                if sub in c.subs:
                    self.close_connection(c, 4009, "already subscribed")
                    return
                if self.refuse_subscribes or (self.subscription_limit is not None
                                              and len(c.subs) >= self.subscription_limit):
                    c.refused += 1
                    message = "refused by the stand-in" if self.refuse_subscribes else \
                        "subscription limit reached"
                    self._send(c, json.dumps({"op": 6, "t": self._now_ms(), "d": {"message": message}}))
                    self._notify()
                    return
                with self._lock:
                    c.subs.add(sub)
                    c.max_subs = max(c.max_subs, len(c.subs))
                ack = {"command": "SUBSCRIBE", "data": {"id": next(self._ids), "type": sub[0],
                                                        "condition": {"object_id": sub[1]}}}
            else:
                if sub not in c.subs:
                    self.close_connection(c, 4010, "not subscribed")
                    return
                with self._lock:
                    c.subs.discard(sub)
                ack = {"command": "UNSUBSCRIBE", "data": {"type": sub[0], "condition": {"object_id": sub[1]}}}
            self._send(c, json.dumps({"op": 5, "t": self._now_ms(), "d": ack}))
            self._notify()
        elif op == 34:
            self._send(c, json.dumps({"op": 5, "t": self._now_ms(), "d": {"command": "RESUME", "data": {
                "success": False, "dispatches_replayed": 0, "subscriptions_restored": 0}}}))
        else:
            self.close_connection(c, 4001, f"unknown operation {op}")

    # -- REST ------------------------------------------------------------------------------------------

    def _rest(self, path: str) -> tuple[int, Any]:
        if self.rest_delay_secs:
            self._stop.wait(self.rest_delay_secs)
        with self._lock:
            self.rest_requests.append(path)
            if self.rest_status is not None:
                return self.rest_status, {"error": "forced by the stand-in", "status": self.rest_status}
            parts = [unquote(p) for p in path.strip("/").split("/")]
            if parts[:1] != ["v3"]:
                return 404, {"error": "not found"}
            parts = parts[1:]
            if len(parts) == 3 and parts[:2] == ["users", "twitch"]:
                user = next((u for u in self.users.values() if u.twitch_id == parts[2]), None)
                if user is None:
                    return 404, {"error": "Unknown User", "error_code": 70440}
                return 200, {"id": user.twitch_id, "platform": "TWITCH", "username": user.username,
                             "emote_set_id": user.set_id, "emote_set": self._set_body(user.set_id),
                             "user": self._user_body(user)}
            if len(parts) == 2 and parts[0] == "users":
                found = self.users.get(parts[1])
                if found is None:
                    return 404, {"error": "Unknown User"}
                return 200, self._user_body(found)
            if len(parts) == 2 and parts[0] == "emote-sets":
                body = self._set_body(parts[1])
                return (200, body) if body is not None else (404, {"error": "Unknown Emote Set"})
            return 404, {"error": "not found"}

    def _user_body(self, user: StandinUser) -> dict[str, Any]:
        return {"id": user.user_id, "username": user.username, "display_name": user.username,
                "connections": [{"id": user.twitch_id or "0", "platform": "TWITCH",
                                 "username": user.username, "emote_set_id": user.set_id}]}

    def _set_body(self, set_id: str | None) -> dict[str, Any] | None:
        if set_id is None or set_id not in self.sets:
            return None
        emotes = list(self.sets[set_id].values())
        return {"id": set_id, "name": f"set {set_id}", "flags": 0, "tags": [], "immutable": False,
                "privileged": False, "emotes": emotes or None, "emote_count": len(emotes),
                "capacity": 1000}


def _http_handler(standin: SevenTvStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            path = urlsplit(self.path).path
            if path in standin.trickle_paths:
                self._trickle(*standin._rest(path))
            else:
                self._answer(*standin._rest(path))

        def _trickle(self, status: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            head = (f"HTTP/1.0 {status} OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            self.close_connection = True
            for i, byte in enumerate(head + body):
                if i and standin._stop.wait(standin.trickle_byte_secs):
                    return
                try:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                except OSError:
                    return

    return Handler
