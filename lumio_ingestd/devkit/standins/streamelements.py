"""A stand-in StreamElements Astro gateway: a real WebSocket server on loopback.

Used by the tests and `lumio-ingestd demo` (it needs the `websockets`
package: the `demo` and `test` extras). It speaks Astro as docs/platforms.rst, "The Astro protocol",
describes it:

- `welcome` on every new socket (with a `client_id`);
- `subscribe` requests answered with a `response` carrying the request's
  nonce and the canonical room (`canonical_rooms` maps what a client sends to
  what the server answers), or with an error: a wrong token or token type is
  `err_unauthorized`, and `fail_subscribe(topic, error, times)` makes any
  error happen on purpose;
- `publish(topic, room, data)` sends a `message` to every socket subscribed to
  that topic for that (canonical) room;
- pings every `ping_interval_secs`; a socket that leaves a ping unanswered for
  `pong_timeout_secs` is closed (`no_pong` is recorded), like the real 70 s;
- `send_reconnect()` sends `reconnect` with a token. Messages published
  after it are held for that token and go out on the socket that presents it
  (`?reconnect_token=`), whose subscriptions are restored server-side; an
  unknown or refused token (`send_reconnect(honour=False)`) is closed at once.
  The old socket is closed after `reconnect_grace_secs` if the client keeps it;
- `refuse_upgrades(status, retry_after)` answers the next upgrades with an
  HTTP error (502, or 429 with `Retry-After`); `drop()` closes every socket;
- the REST history, on an HTTP port of its own (`api_url`): `GET
  /activities/{channel}` and `GET /tips/{channel}` (`after`, `before`,
  `limit`, and `offset` for tips; Bearer token checked) answer from the same
  history the socket sends: every tip and activity published is kept, whether
  a socket took it or not (`keep_history` adds one the socket never sends).
  `fail_history(kind, times)` makes the next requests answer 500, 429 (with
  `Retry-After`), 401, garbage, or hang; `history_requests` records them.

The `websockets` sync server starts a thread per connection; that is fine
for a stand-in peer. Nothing durable here: everything lives in memory.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.sync.server import ServerConnection

from lumio_ingestd.devkit.standins.base import JsonHandler, StandinServers

_POLL = 0.02


@dataclass
class AstroConn:
    """What the stand-in knows about one socket (tests read these)."""

    index: int
    query: str
    reconnect_token: str | None
    opened_at: float
    welcomed_at: float | None = None
    subscribes: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic -> canonical room
    pings: int = 0
    pongs: int = 0
    open: bool = True
    close_code: int | None = None
    no_pong: bool = False
    reconnecting: bool = False
    sent_ids: list[str] = field(default_factory=list)
    outbox: list[str] = field(default_factory=list)
    close_request: tuple[int, str, bool] | None = None  # code, reason, abrupt


@dataclass
class _Handoff:
    subscriptions: dict[str, str]
    held: list[str]
    honour: bool
    old: AstroConn


class AstroStandin(StandinServers):
    def __init__(self, *, token: str = "se-jwt-token", token_type: str = "jwt",
                 canonical_rooms: Mapping[str, str] | None = None, ping_interval_secs: float = 30.0,
                 pong_timeout_secs: float = 70.0, reconnect_grace_secs: float = 30.0) -> None:
        standin = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                standin._history_get(self)

        super().__init__("astro", process_request=self._process_request, http_handler=Handler)
        self.token = token
        self.token_type = token_type
        self.canonical_rooms = dict(canonical_rooms or {})
        self.ping_interval = ping_interval_secs
        self.pong_timeout = pong_timeout_secs
        self.reconnect_grace = reconnect_grace_secs
        self.connections: list[AstroConn] = []
        self.record_sent = True  # False: no per-socket list of sent ids (a demo may run for hours)
        self.upgrades: list[tuple[float, int]] = []  # (time, HTTP status) of every upgrade request
        self._refusals: list[tuple[int, float | None]] = []
        self._failures: dict[str, list[str]] = {}  # topic -> errors to answer, in order
        self._always_fail: dict[str, str] = {}
        self._handoffs: dict[str, _Handoff] = {}
        self._counter = 0
        #: (topic, canonical room, created ms, document) of every tip and activity, in order.
        self.history: list[tuple[str, str, int, dict[str, Any]]] = []
        self.history_requests: list[tuple[float, str, int]] = []  # (time, path, status)
        self._history_faults: list[str] = []
        self.hang_secs = 30.0

    @property
    def url(self) -> str:
        return self._ws_url("/")

    @property
    def api_url(self) -> str:
        return self._http_url("")

    # -- the REST history ----------------------------------------------------------------

    def keep_history(self, topic: str, room: str, data: Mapping[str, Any]) -> None:
        """Add a document to the history only (one the socket never sent)."""
        with self._cond:
            self._keep(topic, self.canonical_rooms.get(room, room), data)

    def _keep(self, topic: str, canonical: str, data: Mapping[str, Any]) -> None:
        if topic not in ("channel.tips", "channel.activities"):
            return
        created = data.get("createdAt")
        try:
            ms = int(datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            ms = int(time.time() * 1000)
        self.history.append((topic, canonical, ms, dict(data)))

    def fail_history(self, kind: str, times: int = 1) -> None:
        """The next `times` history requests: "500", "429", "401", "garbage" or "hang"."""
        with self._cond:
            self._history_faults.extend([kind] * times)

    def _history_get(self, handler: JsonHandler) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        segments = [s for s in parts.path.split("/") if s]
        with self._cond:
            fault = self._history_faults.pop(0) if self._history_faults else None
        status = self._history_answer(handler, segments, query, fault)
        with self._cond:
            self.history_requests.append((time.monotonic(), parts.path, status))
            self._cond.notify_all()

    def _history_answer(self, handler: JsonHandler, segments: list[str], query: dict[str, str],
                        fault: str | None) -> int:
        if fault == "hang":
            self._stop.wait(self.hang_secs)
            return 0
        if fault == "500":
            handler._answer(500, {"error": "internal"})
            return 500
        if fault == "429":
            handler._answer(429, {"error": "rate limited"}, {"Retry-After": "1"})
            return 429
        if fault == "garbage":
            body = b"<html>not json"
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return 200
        auth = handler._headers().get("authorization", "")
        if fault == "401" or auth != f"Bearer {self.token}":
            handler._answer(401, {"error": "Unauthorized"})
            return 401
        if len(segments) != 2 or segments[0] not in ("activities", "tips"):
            handler._answer(404, {"error": "not found"})
            return 404
        topic = "channel.activities" if segments[0] == "activities" else "channel.tips"
        room = self.canonical_rooms.get(segments[1], segments[1])
        try:
            after = int(query.get("after", "0"))
            before = int(query.get("before", str(1 << 62)))
            limit = min(100, int(query.get("limit", "25")))
            offset = int(query.get("offset", "0"))
        except ValueError:
            handler._answer(400, {"error": "bad query"})
            return 400
        with self._cond:
            docs = [d for t, r, ms, d in sorted(self.history, key=lambda h: -h[2])
                    if t == topic and r == room and after <= ms < before]
        if topic == "channel.activities":
            handler._answer(200, docs[:limit])  # type: ignore[arg-type]
        else:
            handler._answer(200, {"docs": docs[offset:offset + limit], "total": len(docs)})
        return 200

    # -- control ------------------------------------------------------------------------

    def live(self) -> list[AstroConn]:
        with self._cond:
            return [c for c in self.connections if c.open]

    def subscribed(self, *topics: str, conn: int | None = None) -> bool:
        """True when a live socket (or socket number `conn`) holds every topic."""
        with self._cond:
            conns = [self.connections[conn]] if conn is not None and conn < len(self.connections) else (
                [] if conn is not None else [c for c in self.connections if c.open])
            return any(c.open and all(t in c.subscriptions for t in topics) for c in conns)

    def refuse_upgrades(self, status: int, retry_after: float | None = None, count: int = 1) -> None:
        with self._cond:
            self._refusals.extend([(status, retry_after)] * count)

    def admit_upgrades(self) -> None:
        """Forget the refusals still queued: the next upgrades are accepted."""
        with self._cond:
            self._refusals.clear()

    def fail_subscribe(self, topic: str, error: str, times: int | None = 1) -> None:
        """Answer the next `times` subscribes to `topic` with `error` (None: every one)."""
        with self._cond:
            if times is None:
                self._always_fail[topic] = error
            else:
                self._failures.setdefault(topic, []).extend([error] * times)

    def allow_subscribe(self, topic: str) -> None:
        with self._cond:
            self._always_fail.pop(topic, None)
            self._failures.pop(topic, None)

    def next_id(self) -> str:
        with self._cond:
            self._counter += 1
            return f"01STANDIN{self._counter:017d}"

    def publish(self, topic: str, room: str, data: Mapping[str, Any], *, frame_id: str | None = None,
                with_room: bool = True) -> dict[str, Any]:
        """Send a `message` to every socket subscribed to `topic` for `room`; returns the frame."""
        return self.publish_counted(topic, room, data, frame_id=frame_id, with_room=with_room)[0]

    def publish_counted(self, topic: str, room: str, data: Mapping[str, Any], *,
                        frame_id: str | None = None, with_room: bool = True) -> tuple[dict[str, Any], int]:
        """`publish`, and how many sockets (or pending reconnect tokens) it went to."""
        canonical = self.canonical_rooms.get(room, room)
        frame: dict[str, Any] = {"id": frame_id or self.next_id(),
                                 "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "type": "message", "topic": topic}
        if with_room:
            frame["room"] = canonical
        frame["data"] = dict(data)
        text = json.dumps(frame, separators=(",", ":"))
        reached = 0
        with self._cond:
            self._keep(topic, canonical, data)
            for handoff in self._handoffs.values():
                if handoff.subscriptions.get(topic) == canonical:
                    handoff.held.append(text)
                    reached += 1
            for conn in self.connections:
                if conn.open and not conn.reconnecting and conn.subscriptions.get(topic) == canonical:
                    conn.outbox.append(text)
                    reached += 1
            self._cond.notify_all()
        return frame, reached

    def send_raw(self, text: str, conn: int = -1) -> None:
        """Send any text (malformed on purpose, say) on one socket."""
        with self._cond:
            self.connections[conn].outbox.append(text)
            self._cond.notify_all()

    def send_reconnect(self, conn: int = -1, *, honour: bool = True) -> str:
        """Ask a socket to reconnect; returns the reconnect token (refused later if not `honour`)."""
        with self._cond:
            target = self.connections[conn]
            self._counter += 1
            token = f"reconnect-{self._counter}"
            self._handoffs[token] = _Handoff(dict(target.subscriptions), [], honour, target)
            target.outbox.append(json.dumps({"type": "reconnect", "data": {
                "message": "The server is shutting down.", "reconnect_token": token}}))
            target.reconnecting = True
            self._cond.notify_all()
            return token

    def drop(self, *, abrupt: bool = False, code: int = 1011) -> None:
        """Close every live socket (abrupt: cut TCP without a close frame)."""
        with self._cond:
            for conn in self.connections:
                if conn.open:
                    conn.close_request = (code, "dropped on request", abrupt)
            self._cond.notify_all()

    # -- serving -----------------------------------------------------------------------------

    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        with self._cond:
            refusal = self._refusals.pop(0) if self._refusals else None
            self.upgrades.append((time.monotonic(), refusal[0] if refusal else 101))
            self._cond.notify_all()
        if refusal is None:
            return None
        status, retry_after = refusal
        response = conn.respond(status, "refused by the stand-in\n")
        if retry_after is not None:
            response.headers["Retry-After"] = f"{retry_after:g}"
        return response

    def _handle_ws(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        parts = urlsplit(ws.request.path)
        token = parse_qs(parts.query).get("reconnect_token", [None])[0]
        with self._cond:
            conn = AstroConn(len(self.connections), parts.query, token, time.monotonic())
            self.connections.append(conn)
            handoff = self._handoffs.pop(token, None) if token is not None else None
            self._cond.notify_all()
        try:
            if token is not None and (handoff is None or not handoff.honour):
                ws.close(4000, "invalid reconnect token")
                self._closed_conn(conn, 4000)
                return
            with self._cond:
                self._counter += 1
                welcome = {"id": f"01WELCOME{self._counter:017d}",
                           "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "type": "welcome",
                           "data": {"message": "You are in a maze of dank memes, all alike.",
                                    "client_id": f"client-{conn.index}"}}
                if handoff is not None:
                    conn.subscriptions.update(handoff.subscriptions)
                    conn.outbox.extend(handoff.held)
                    handoff.held = []
            ws.send(json.dumps(welcome))
            with self._cond:
                conn.welcomed_at = time.monotonic()
                self._cond.notify_all()
            self._serve(ws, conn)
        except (ConnectionClosed, OSError):
            pass
        finally:
            self._closed_conn(conn, ws.close_code if conn.close_code is None else conn.close_code)

    def _closed_conn(self, conn: AstroConn, code: int | None) -> None:
        with self._cond:
            if conn.open:
                conn.open = False
                conn.close_code = code
            self._cond.notify_all()

    def _serve(self, ws: ServerConnection, conn: AstroConn) -> None:
        pings: list[tuple[float, threading.Event]] = []
        next_ping = time.monotonic() + self.ping_interval
        reconnect_sent_at: float | None = None
        while True:
            try:
                text = ws.recv(timeout=_POLL)
            except TimeoutError:
                text = None
            if text is not None:
                self._request(conn, text if isinstance(text, str) else text.decode("utf-8", "replace"))
            with self._cond:
                if self._stop.is_set():
                    ws.close(1001, "stand-in closing")
                    return
                out, conn.outbox = conn.outbox, []
                request = conn.close_request
            for item in out:
                ws.send(item)
                try:
                    frame = json.loads(item)
                except ValueError:
                    continue
                if isinstance(frame, dict) and frame.get("type") == "message" and self.record_sent:
                    conn.sent_ids.append(str(frame.get("id")))
                if isinstance(frame, dict) and frame.get("type") == "reconnect":
                    reconnect_sent_at = time.monotonic()
            if request is not None:
                code, reason, abrupt = request
                if abrupt:
                    ws.socket.shutdown(socket.SHUT_RDWR)
                    self._closed_conn(conn, None)
                else:
                    ws.close(code, reason)
                    self._closed_conn(conn, code)
                return
            now = time.monotonic()
            if reconnect_sent_at is not None and now - reconnect_sent_at >= self.reconnect_grace:
                ws.close(1001, "reconnect grace over")
                self._closed_conn(conn, 1001)
                return
            answered = [p for p in pings if p[1].is_set()]
            if answered:
                pings = [p for p in pings if not p[1].is_set()]
                with self._cond:
                    conn.pongs += len(answered)
                    self._cond.notify_all()
            if pings and now - pings[0][0] >= self.pong_timeout:
                with self._cond:
                    conn.no_pong = True
                self._closed_conn(conn, 4000)  # recorded first: the close waits for a peer that may not read
                ws.close(4000, "no pong")
                return
            if now >= next_ping:
                next_ping = now + self.ping_interval
                pings.append((now, ws.ping()))
                with self._cond:
                    conn.pings += 1

    def _request(self, conn: AstroConn, text: str) -> None:
        try:
            req = json.loads(text)
        except ValueError:
            req = None
        if not isinstance(req, dict) or not isinstance(req.get("data"), dict):
            self._answer(conn, None, "err_bad_request", "not a JSON request")
            return
        nonce = req.get("nonce") if isinstance(req.get("nonce"), str) else None
        data = req["data"]
        with self._cond:
            conn.subscribes.append((time.monotonic(), req))
            self._cond.notify_all()
        if req.get("type") != "subscribe":
            if req.get("type") == "unsubscribe":
                with self._cond:
                    conn.subscriptions.pop(str(data.get("topic")), None)
                self._answer(conn, nonce, None, "successfully unsubscribed from topic",
                             topic=data.get("topic"), room=data.get("room"))
                return
            self._answer(conn, nonce, "invalid_message_type", "unknown message type")
            return
        topic = data.get("topic")
        room = data.get("room") if isinstance(data.get("room"), str) else ""
        if not isinstance(topic, str) or not topic:
            self._answer(conn, nonce, "err_bad_request", "topic is required")
            return
        with self._cond:
            queued = self._failures.get(topic)
            error = queued.pop(0) if queued else self._always_fail.get(topic)
        if error is None and (data.get("token") != self.token or data.get("token_type") != self.token_type):
            error = "err_unauthorized"
        if error is not None:
            self._answer(conn, nonce, error, f"subscribe to {topic} refused")
            return
        canonical = self.canonical_rooms.get(room, room)
        with self._cond:
            conn.subscriptions[topic] = canonical
        self._answer(conn, nonce, None, "successfully subscribed to topic", topic=topic, room=canonical)

    def _answer(self, conn: AstroConn, nonce: str | None, error: str | None, message: str,
                **data: Any) -> None:
        with self._cond:
            self._counter += 1
            frame: dict[str, Any] = {"id": f"01RESPONSE{self._counter:016d}",
                                     "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     "type": "response", "nonce": nonce or ""}
            if error is not None:
                frame["error"] = error
            frame["data"] = {"message": message, **data}
            conn.outbox.append(json.dumps(frame))
            self._cond.notify_all()


# -- documents (the shapes of docs/platforms.rst, "The Astro protocol"; values invented) -----


def tip_doc(tip_id: str, channel: str, *, amount: float = 5.0, currency: str = "EUR",
            username: str = "kind_donor", message: str = "keep it up", status: str = "success",
            approved: str = "allowed", created_at: str | None = None,
            email: str = "donor@example.com", geo: str = "DE", ip: str | None = None) -> dict[str, Any]:
    created = created_at or time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    user: dict[str, Any] = {"username": username, "geo": geo, "email": email, "channel": channel}
    if ip is not None:
        user["ipAddress"] = ip
    return {"donation": {"user": user, "message": message, "amount": amount, "currency": currency,
                         "paymentMethod": "paypal"},
            "_id": tip_id, "channel": channel, "provider": "paypal", "approved": approved,
            "status": status, "createdAt": created, "updatedAt": created, "transactionId": f"TXN-{tip_id}"}


def activity_doc(activity_id: str, channel: str, kind: str, *, provider: str = "twitch",
                 data: Mapping[str, Any] | None = None, created_at: str | None = None) -> dict[str, Any]:
    created = created_at or time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    inner = dict(data) if data is not None else {
        "username": "newfan", "displayName": "NewFan", "providerId": "424242",
        "avatar": "https://example.com/a.png"}
    return {"type": kind, "provider": provider, "channel": channel, "data": inner, "_id": activity_id,
            "createdAt": created, "updatedAt": created, "activityId": activity_id,
            "sessionEventsCount": 1}


def tip_activity_doc(activity_id: str, tip_id: str | None, channel: str, *, amount: float = 5.0,
                     currency: str = "EUR", username: str = "kind_donor",
                     message: str = "keep it up", created_at: str | None = None) -> dict[str, Any]:
    """The activity StreamElements emits for a tip (`data.tipId` names the tip, when present)."""
    inner: dict[str, Any] = {"username": username, "displayName": username, "amount": amount,
                             "currency": currency, "message": message, "avatar": "",
                             "email": "donor@example.com"}
    if tip_id is not None:
        inner["tipId"] = tip_id
    return activity_doc(activity_id, channel, "tip", provider="streamelements", data=inner,
                        created_at=created_at)
