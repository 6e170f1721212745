"""A stand-in Kick on loopback: a Pusher protocol-7 WebSocket server, a webhook signer, the public API.

Used by the tests, the benchmarks and `lumio-ingestd demo` (it needs the
`websockets` package: the `demo` and `test` extras). What it mirrors
(docs/platforms.rst, "Kick"), over real sockets:

- Pusher `ws://127.0.0.1:P/app/KEY?protocol=7...`: `pusher:connection_established`
  with `activity_timeout` on connect; `pusher:subscribe` answered with
  `pusher_internal:subscription_succeeded` (`pusher:subscription_error` while
  `refuse_subscribes` is set, and for the next N subscribes to a channel in
  `refuse_next`); a client `pusher:ping` answered with
  `pusher:pong` (unless `answer_pings` is off: a half-dead server); with
  `server_ping_after_secs` set, a `pusher:ping` after that much silence and
  close 4201 when no `pusher:pong` comes within `pong_timeout_secs`; any close
  code or `pusher:error` on request; `publish()` sends an App event (its `data`
  a JSON string, as Kick does) to every connection subscribed to a channel.
- Webhooks: the stand-in signs like Kick (RSA PKCS#1 v1.5 SHA-256 over
  `{message id}.{timestamp}.{raw body}`) with its own key pair, made at start
  (`public_pem()` is what the daemon is configured with), and POSTs to
  `webhook_url`; `deliver()` sends to it only when a subscription exists for
  the broadcaster and event, `send_webhook()` always (and lets a test forge,
  age or strip a delivery).
- API `http://127.0.0.1:P`: `POST /oauth/token` (client credentials),
  `GET/POST/DELETE /public/v1/events/subscriptions` (bearer app token), and
  `GET /public/v1/livestreams?broadcaster_user_id=...` driven by `set_live()`
  and `set_offline()`.

The key pair is a TEST key made with Python integers (Miller-Rabin primes,
`pow(m, d, n)` to sign); it signs nothing but this stand-in's deliveries.
Nothing durable here.
"""

from __future__ import annotations

import base64
import functools
import http.client
import itertools
import json
import secrets
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.sync.server import ServerConnection

from lumio_ingestd.devkit.standins.base import JsonHandler, StandinHttpServer, StandinServers
from lumio_ingestd.sources.kick.signature import RSA_OID, emsa_pkcs1_v15_sha256, signed_bytes

APP_KEY = "32cbd69e4b950bf97679"


# --------------------------------------------------------------------------- the test key pair


_SMALL_PRIMES = [p for p in range(3, 2000) if all(p % q for q in range(2, int(p ** 0.5) + 1))]


def _probable_prime(n: int, rounds: int = 24) -> bool:
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for _ in range(rounds):
        x = pow(secrets.randbelow(n - 3) + 2, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def _prime(bits: int) -> int:
    while True:
        candidate = secrets.randbits(bits) | (3 << (bits - 2)) | 1
        if _probable_prime(candidate):
            return candidate


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def _der_int(value: int) -> bytes:
    return _der(0x02, value.to_bytes(value.bit_length() // 8 + 1, "big"))


@dataclass(frozen=True)
class TestKeyPair:
    n: int
    e: int
    d: int

    @property
    def size(self) -> int:
        return (self.n.bit_length() + 7) // 8

    def public_pem(self) -> str:
        rsa = _der(0x30, _der_int(self.n) + _der_int(self.e))
        spki = _der(0x30, _der(0x30, _der(0x06, RSA_OID) + b"\x05\x00") + _der(0x03, b"\x00" + rsa))
        body = base64.b64encode(spki).decode()
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        return "-----BEGIN PUBLIC KEY-----\n" + "\n".join(lines) + "\n-----END PUBLIC KEY-----\n"

    def sign(self, message: bytes) -> str:
        em = int.from_bytes(emsa_pkcs1_v15_sha256(message, self.size), "big")
        return base64.b64encode(pow(em, self.d, self.n).to_bytes(self.size, "big")).decode()


@functools.lru_cache(maxsize=1)
def test_key_pair(bits: int = 2048) -> TestKeyPair:
    """One key pair per process (half a second to make): every stand-in of a test run shares it."""
    e = 65537
    while True:
        p, q = _prime(bits // 2), _prime(bits // 2)
        phi = (p - 1) * (q - 1)
        if p != q and phi % e:
            return TestKeyPair(p * q, e, pow(e, -1, phi))


# --------------------------------------------------------------------------- payload builders


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def user(user_id: int, username: str, *, identity: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A webhook user object (docs/platforms.rst, "Official webhooks")."""
    return {"is_anonymous": False, "user_id": user_id, "username": username, "is_verified": False,
            "profile_picture": "", "channel_slug": username.lower(), "identity": identity}


def pusher_chat(chatroom_id: int, message_id: str, content: str, *, sender_id: int = 1001,
                username: str = "ChatFan", created_at: str | None = None) -> dict[str, Any]:
    return {"id": message_id, "chatroom_id": chatroom_id, "content": content, "type": "message",
            "created_at": created_at or now_text().replace("Z", "+00:00"),
            "sender": {"id": sender_id, "username": username, "slug": username.lower(),
                       "identity": {"color": "#B9D6F6", "badges": []}}}


def webhook_chat(broadcaster: tuple[int, str], message_id: str, content: str, *, sender_id: int = 1001,
                 username: str = "ChatFan", created_at: str | None = None) -> dict[str, Any]:
    return {"message_id": message_id, "broadcaster": user(*broadcaster),
            "sender": user(sender_id, username, identity={"username_color": "#B9D6F6", "badges": []}),
            "content": content, "emotes": [], "created_at": created_at or now_text()}


# --------------------------------------------------------------------------- Pusher connections


@dataclass
class PusherConnection:
    socket_id: str
    conn: ServerConnection
    opened_at: float = field(default_factory=time.monotonic)
    channels: dict[str, float] = field(default_factory=dict)  # channel -> seconds after open
    inbound: list[dict[str, Any]] = field(default_factory=list)
    pings: int = 0  # client pings received
    pongs: int = 0  # client pongs received
    last_received: float = field(default_factory=time.monotonic)
    last_sent: float = field(default_factory=time.monotonic)
    ping_sent_at: float | None = None
    closed: threading.Event = field(default_factory=threading.Event)
    close_code: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def open(self) -> bool:
        return not self.closed.is_set()


class _HttpServer(StandinHttpServer):
    request_queue_size = 256


class KickStandin(StandinServers):
    def __init__(self, *, client_id: str = "kick-standin-client", client_secret: str = "kick-standin-secret",
                 activity_timeout: int = 120, server_ping_after_secs: float | None = None,
                 pong_timeout_secs: float = 30.0, token_lifetime_secs: int = 3600) -> None:
        super().__init__("kick", http_handler=_http_handler(self), http_server=_HttpServer,
                         loops=[("timers", self._timers)])
        self.client_id = client_id
        self.client_secret = client_secret
        self.activity_timeout = activity_timeout
        self.server_ping_after_secs = server_ping_after_secs
        self.pong_timeout_secs = pong_timeout_secs
        self.token_lifetime_secs = token_lifetime_secs
        self.answer_pings = True
        #: Answer every `pusher:subscribe` with `pusher:subscription_error` (a welcomed session
        #: that never becomes a working one).
        self.refuse_subscribes = False
        #: Channel -> how many of its next `pusher:subscribe` are answered with an error.
        self.refuse_next: dict[str, int] = {}
        self.key = test_key_pair()
        self.webhook_url: str | None = None
        self.connections: list[PusherConnection] = []
        #: Webhook subscriptions: id -> {id, app_id, broadcaster_user_id, event, version, method, ...}.
        self.subscriptions: dict[str, dict[str, Any]] = {}
        self.api_requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.deliveries: list[tuple[str, str, int]] = []  # (message id, event type, status)
        self.tokens_issued = 0
        self.api_status: dict[str, int] = {}  # "METHOD" -> forced error status, until removed
        self._live: dict[str, dict[str, Any]] = {}
        self._tokens: set[str] = set()
        self._socket_ids = itertools.count(1)

    # -- URLs (the base owns the servers' lifecycle) -----------------------------------------

    @property
    def pusher_url(self) -> str:
        return self._ws_url(f"/app/{APP_KEY}?protocol=7&client=js&version=8.4.0&flash=false")

    @property
    def api_url(self) -> str:
        return self._http_url("/public/v1")

    @property
    def oauth_url(self) -> str:
        return self._http_url("")

    def public_pem(self) -> str:
        return self.key.public_pem()

    def wait_subscribed(self, channel: str, n: int = 1, timeout: float = 10.0) -> PusherConnection:
        """The `n`-th connection (1-based) that subscribed to `channel`, once it has."""
        def found() -> bool:
            return len([c for c in self.connections if channel in c.channels]) >= n
        assert self.wait_for(found, timeout), f"no connection #{n} subscribed to {channel}"
        return [c for c in self.connections if channel in c.channels][n - 1]

    # -- Pusher -------------------------------------------------------------------------

    def _handle_ws(self, conn: ServerConnection) -> None:
        path = urlsplit(conn.request.path if conn.request else "/")
        query = parse_qs(path.query)
        if not path.path.startswith("/app/"):
            conn.close(4005, "Path not found")
            return
        if query.get("protocol", [""])[0] != "7":
            conn.close(4007, "Unsupported protocol version")
            return
        pc = PusherConnection(f"{next(self._socket_ids)}.{secrets.randbelow(10 ** 7)}", conn)
        with self._lock:
            self.connections.append(pc)
        self._send(pc, {"event": "pusher:connection_established", "data": json.dumps(
            {"socket_id": pc.socket_id, "activity_timeout": self.activity_timeout})})
        self._notify()
        try:
            for raw in conn:
                pc.last_received = time.monotonic()
                try:
                    frame = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(frame, dict):
                    continue
                with self._lock:
                    pc.inbound.append(frame)
                self._on_client_frame(pc, frame)
                self._notify()
        except ConnectionClosed:
            pass
        finally:
            pc.closed.set()
            self._notify()

    def _on_client_frame(self, pc: PusherConnection, frame: Mapping[str, Any]) -> None:
        event = frame.get("event")
        data = frame.get("data")
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                data = {}
        data = data if isinstance(data, dict) else {}
        if event == "pusher:subscribe":
            channel = data.get("channel")
            refuse = False
            if isinstance(channel, str) and channel:
                with self._lock:
                    left = self.refuse_next.get(channel, 0)
                    if left > 0:
                        self.refuse_next[channel] = left - 1
                refuse = self.refuse_subscribes or left > 0
            if isinstance(channel, str) and channel and refuse:
                self._send(pc, {"event": "pusher:subscription_error", "channel": channel,
                                "data": json.dumps({"type": "AuthError", "error": "refused by the stand-in",
                                                    "status": 401})})
            elif isinstance(channel, str) and channel:
                with self._lock:
                    pc.channels[channel] = time.monotonic() - pc.opened_at
                self._send(pc, {"event": "pusher_internal:subscription_succeeded", "channel": channel,
                                "data": "{}"})
        elif event == "pusher:unsubscribe":
            with self._lock:
                pc.channels.pop(str(data.get("channel")), None)
        elif event == "pusher:ping":
            pc.pings += 1
            if self.answer_pings:
                self._send(pc, {"event": "pusher:pong", "data": {}})
        elif event == "pusher:pong":
            pc.pongs += 1
            pc.ping_sent_at = None

    def _send(self, pc: PusherConnection, frame: Mapping[str, Any] | str) -> bool:
        text = frame if isinstance(frame, str) else json.dumps(frame)
        with pc.lock:
            if pc.closed.is_set():
                return False
            try:
                pc.conn.send(text)
            except (ConnectionClosed, OSError):
                return False
            pc.last_sent = time.monotonic()
        return True

    def _timers(self) -> None:
        while not self._stop.wait(0.05):
            after = self.server_ping_after_secs
            if after is None:
                continue
            now = time.monotonic()
            for pc in list(self.connections):
                if not pc.open:
                    continue
                if pc.ping_sent_at is not None:
                    if now - pc.ping_sent_at >= self.pong_timeout_secs:
                        self.close_connection(pc, 4201, "Pong reply not received")
                elif now - max(pc.last_received, pc.last_sent) >= after:
                    pc.ping_sent_at = now
                    self._send(pc, {"event": "pusher:ping", "data": {}})

    def subscribed(self, channel: str) -> list[PusherConnection]:
        with self._lock:
            return [c for c in self.connections if c.open and channel in c.channels]

    def publish(self, channel: str, event: str, data: Mapping[str, Any] | str, *,
                namespace: str = "App\\Events\\") -> int:
        """Send an event to every open connection subscribed to `channel`; how many got it."""
        frame = json.dumps({"event": namespace + event, "channel": channel,
                            "data": data if isinstance(data, str) else json.dumps(data)})
        return sum(self._send(pc, frame) for pc in self.subscribed(channel))

    def send_raw(self, pc: PusherConnection, text: str) -> bool:
        return self._send(pc, text)

    @staticmethod
    def encode_bulk(frames: Sequence[str]) -> list[bytes]:
        """Text frames as the wire bytes `send_bulk` writes (unmasked server frames).

        Done before a load test, so that the send itself costs the server
        nothing but `sendall`.
        """
        return [Frame(Opcode.TEXT, text.encode()).serialize(mask=False) for text in frames]

    def send_bulk(self, pc: PusherConnection, frames: Sequence[bytes], *, chunk_bytes: int = 1 << 20) -> int:
        """Load generation: frames made by `encode_bulk`, written to the socket in large chunks.

        As the Twitch stand-in's: written with `sendall` under the connection's
        send lock; the WebSocket library's state is untouched, since the
        server's own outgoing frames do not change it. Returns how many were
        written.
        """
        sent = 0
        with pc.lock:
            if pc.closed.is_set():
                return 0
            buffer: list[bytes] = []
            size = 0
            try:
                for data in frames:
                    buffer.append(data)
                    size += len(data)
                    if size >= chunk_bytes:
                        pc.conn.socket.sendall(b"".join(buffer))
                        sent += len(buffer)
                        buffer, size = [], 0
                if buffer:
                    pc.conn.socket.sendall(b"".join(buffer))
                    sent += len(buffer)
            except OSError:
                return sent
            pc.last_sent = time.monotonic()
        return sent

    def send_error(self, pc: PusherConnection, code: int, message: str = "") -> bool:
        return self._send(pc, {"event": "pusher:error", "data": {"code": code, "message": message}})

    def close_connection(self, pc: PusherConnection, code: int, reason: str = "") -> None:
        with pc.lock:
            if pc.closed.is_set():
                return
            pc.close_code = code
            pc.closed.set()
        try:
            pc.conn.close(code, reason)
        except ConnectionClosed:
            pass
        self._notify()

    def close_all(self, code: int, reason: str = "") -> None:
        for pc in list(self.connections):
            self.close_connection(pc, code, reason)

    # -- webhooks ------------------------------------------------------------------------

    def send_webhook(self, event_type: str, body: Mapping[str, Any] | bytes, *, message_id: str | None = None,
                     timestamp: str | None = None, signature: str | None = None,
                     drop_headers: Sequence[str] = (), url: str | None = None,
                     timeout: float = 15.0) -> tuple[int, str]:
        """POST one signed delivery to `url` (default `webhook_url`); (status, message id)."""
        target = url or self.webhook_url
        assert target, "no webhook_url set"
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        message_id = message_id or _ulid()
        timestamp = timestamp or now_text()
        signature = signature or self.key.sign(signed_bytes(message_id, timestamp, raw))
        headers = {"Kick-Event-Message-Id": message_id, "Kick-Event-Subscription-Id": _ulid(),
                   "Kick-Event-Signature": signature,
                   "Kick-Event-Message-Timestamp": timestamp, "Kick-Event-Type": event_type,
                   "Kick-Event-Version": "1", "Content-Type": "application/json"}
        for name in drop_headers:
            headers.pop(name, None)
        parts = urlsplit(target)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
        try:
            conn.request("POST", parts.path or "/", body=raw, headers=headers)
            status = conn.getresponse().status
        finally:
            conn.close()
        with self._lock:
            self.deliveries.append((message_id, event_type, status))
        return status, message_id

    def deliver(self, broadcaster_user_id: int | str, event_type: str, body: Mapping[str, Any],
                **kwargs: Any) -> tuple[int, str] | None:
        """Like Kick: a delivery only where a webhook subscription for it exists (else None)."""
        with self._lock:
            wanted = any(str(s["broadcaster_user_id"]) == str(broadcaster_user_id)
                         and s["event"] == event_type for s in self.subscriptions.values())
        if not wanted or self.webhook_url is None:
            return None
        return self.send_webhook(event_type, body, **kwargs)

    # -- livestreams ---------------------------------------------------------------------

    def set_live(self, broadcaster_user_id: str, *, viewers: int, title: str, category: str,
                 stream_id: str | None = None, started_at: datetime | None = None) -> None:
        started = (started_at or datetime.now(UTC)).astimezone(UTC)
        with self._lock:
            self._live[str(broadcaster_user_id)] = {
                "broadcaster_user_id": int(broadcaster_user_id), "channel_id": int(broadcaster_user_id),
                "slug": f"user{broadcaster_user_id}", "stream_title": title, "viewer_count": viewers,
                "category": {"id": abs(hash(category)) % 100_000, "name": category, "thumbnail": ""},
                "has_mature_content": False, "language": "en", "thumbnail": "",
                "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "stream_id": stream_id or str(uuid.uuid4())}

    def set_offline(self, broadcaster_user_id: str) -> None:
        with self._lock:
            self._live.pop(str(broadcaster_user_id), None)

    # -- the HTTP side -------------------------------------------------------------------

    def _authorized(self, headers: Mapping[str, str]) -> bool:
        auth = headers.get("authorization", "")
        with self._lock:
            return auth.startswith("Bearer ") and auth[7:] in self._tokens

    def _token(self, body: bytes) -> tuple[int, dict[str, Any]]:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") != "client_credentials":
            return 400, {"error": "unsupported_grant_type",
                         "message": "grant_type must be client_credentials"}
        if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
            return 401, {"error": "invalid_client", "message": "invalid client credentials"}
        token = secrets.token_hex(16)
        with self._lock:
            self._tokens.add(token)
            self.tokens_issued += 1
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": self.token_lifetime_secs}

    def revoke_tokens(self) -> None:
        with self._lock:
            self._tokens.clear()

    def _api(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
             body: bytes) -> tuple[int, dict[str, Any] | None]:
        if method in self.api_status:
            status = self.api_status[method]
            return status, {"data": None, "message": f"forced {status}"}
        if not self._authorized(headers):
            return 401, {"data": None, "message": "Unauthorized"}
        if path == "/public/v1/livestreams" and method == "GET":
            ids = query.get("broadcaster_user_id", [])
            with self._lock:
                live = [dict(self._live[i]) for i in ids if i in self._live] if ids else \
                    [dict(v) for v in self._live.values()]
            for item in live:
                item.pop("stream_id", None)  # Kick's public endpoint shows no stream id
            return 200, {"data": live, "message": "OK"}
        if path != "/public/v1/events/subscriptions":
            return 404, {"data": None, "message": "not found"}
        if method == "GET":
            wanted = query.get("broadcaster_user_id", [])
            with self._lock:
                subs = [dict(s) for s in self.subscriptions.values()
                        if not wanted or str(s["broadcaster_user_id"]) in wanted]
            return 200, {"data": subs, "message": "OK"}
        if method == "DELETE":
            with self._lock:
                for sub_id in query.get("id", []):
                    self.subscriptions.pop(sub_id, None)
            return 204, None
        try:
            req = json.loads(body)
            broadcaster = int(req["broadcaster_user_id"])
            events = [(str(e["name"]), int(e.get("version", 1))) for e in req["events"]]
        except (ValueError, KeyError, TypeError):
            return 400, {"data": None, "message": "invalid request body"}
        if req.get("method") != "webhook":
            return 400, {"data": None, "message": "method must be webhook"}
        out = []
        stamp = now_text()
        with self._lock:
            for name, version in events:
                sub_id = _ulid()
                self.subscriptions[sub_id] = {
                    "id": sub_id, "app_id": self.client_id, "broadcaster_user_id": broadcaster, "event": name,
                    "version": version, "method": "webhook", "created_at": stamp, "updated_at": stamp}
                out.append({"name": name, "version": version, "subscription_id": sub_id, "error": None})
        return 200, {"data": out, "message": "OK"}


_ULID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _ulid() -> str:
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(_ULID_ALPHABET[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def _http_handler(standin: KickStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def _route(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            obj: dict[str, Any] | None
            if method == "POST" and url.path == "/oauth/token":
                status, obj = standin._token(body)
            else:
                status, obj = standin._api(method, url.path, parse_qs(url.query), self._headers(), body)
            with standin._lock:
                standin.api_requests.append((method, url.path, status))
            self._answer(status, obj)

        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._route("DELETE")

    return Handler
