"""The HTTP listener: a routes table, an I/O loop that reads requests, and request threads.

One thread, the `HttpServer` worker (named "http", so the supervisor
restarts it and the watchdog sees it), runs a selector loop. It accepts
connections and reads every request without blocking: the request line,
the header section and the body go into a per-connection buffer. Only a
complete request is handed to a request thread (named, non-daemon, tracked);
the thread runs the route's handler and writes the response. A client that
trickles its headers a byte at a time, or connects and says nothing, costs a
socket and a few bytes of buffer until its deadline, never a thread, so it
cannot starve the webhooks (measured: 100 trickling connections let through
4 of 50 legitimate requests when each one held a thread).

Why not waitress (which works the same way): the daemon keeps to four
run-time dependencies, and it needs things a WSGI server does not give:
Server-Sent Events on the request thread with the stream closed at shutdown
after the requests in flight (the shutdown stages in runtime/app.py), the request
slots shared with a reserve for webhooks, and its own limits and metrics.
The loop below is ~300 lines of standard library.

Limits, because the port faces webhooks from the internet:

- one request per connection (HTTP/1.0: no idle keep-alive connections);
- the header section is capped (431; a request line over 8 KiB is 414), the
  body too (413, and only Content-Length bodies: 411/501 otherwise; two
  different Content-Length headers are 400);
- a request not read within `read_timeout_secs` is answered 408 (counted
  from the connection for the head, and again from the head for the body);
- at most `max_connections` connections are being read at once; one more
  cuts the oldest unfinished one (a legitimate request takes milliseconds,
  a slow-loris one takes its whole deadline);
- at most `max_concurrent` request threads (responses being made, streams
  open); `webhook_reserve` of them are kept for paths under `/webhooks/`, so
  the emit API and the alert streams cannot take the last ones (503 with
  Retry-After beyond);
- with `trusted_proxy_header` set (the reverse proxy names the client in it),
  one client may have at most `max_connections_per_client` requests open
  (429 beyond). Without it there is no per-address cap: behind a proxy every
  request has the proxy's address, and a cap would cap the whole daemon.

An exception in a handler is logged with its traceback and answered with a
bare 500: a response never carries a traceback or an exception's text. The
log names a request by method and path, never its query string (it may
carry a token).

Later issues add routes with `Routes.add`. Nothing durable lives here; what a
handler stores is its own business, and it has returned before the response
is sent.
"""

from __future__ import annotations

import email.message
import email.utils
import http.client
import io
import itertools
import json
import logging
import re
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.httpserver")

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
READ_TIMEOUT_SECS = 10.0
MAX_CONCURRENT = 64
#: Connections being read at once (no thread each); one more cuts the oldest.
MAX_CONNECTIONS = 512
MAX_CONNECTIONS_PER_CLIENT = 16
#: Paths that may use the request slots kept for webhooks.
WEBHOOK_PREFIX = "/webhooks/"
SERVER_NAME = "lumio-ingestd"
# Longest request line the standard library reads (414 beyond it).
_MAX_REQUEST_LINE = 8 * 1024


# --------------------------------------------------------------------------- the API for handlers


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: email.message.Message
    body: bytes
    client: str
    #: Named groups of the route's pattern (for /v1/accounts/(?P<account>[0-9]+)/...).
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> Response:
        body = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n"
        return cls(status, body, "application/json", headers or {})


class Stream:
    """The open end of a long response. `write` returns False once it is closed.

    The server closes every open stream at shutdown (after the requests in
    flight had their time); a handler's loop checks `closed` (after
    `peer_gone()`, which notices a client that went away without waiting for
    the next write) or uses `wait_closed(timeout)` as its timer.
    """

    #: How often `wait_closed` looks at the socket for a client that went away.
    POLL_SECS = 0.25

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def write(self, data: bytes) -> bool:
        if self.closed.is_set():
            return False
        try:
            with self._lock:
                self._sock.sendall(data)
        except OSError:  # the peer went away, or close() shut the socket down
            self.closed.set()
            return False
        return True

    def peer_gone(self) -> bool:
        """True (and the stream closed) once the client closed its end or reset it.

        A stream's client sends nothing after its request, so a readable
        socket means EOF or an error; without this a dead client kept its slot
        until the next heartbeat write failed.
        """
        if self.closed.is_set():
            return True
        try:
            # poll first: on a socket with a timeout, recv waits for data
            # before it looks at MSG_DONTWAIT.
            poller = select.poll()
            poller.register(self._sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            if not poller.poll(0):
                return False
            data = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except (OSError, ValueError):  # reset, or closed here already (fileno -1)
            data = b""
        if data:
            return False  # it sent something after all (ignored); it is still there
        self.close()
        return True

    def wait_closed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self.peer_gone():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.closed.wait(min(left, self.POLL_SECS)):
                return True

    def close(self) -> None:
        self.closed.set()
        try:
            # Wakes a write blocked on a slow reader; the request thread then ends.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone


@dataclass(frozen=True)
class StreamResponse:
    """Headers now, then `run(stream)` on the request's thread until it returns."""

    run: Callable[[Stream], None]
    status: int = 200
    content_type: str = "text/event-stream"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response | StreamResponse]


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    max_body_bytes: int


class Routes:
    """(method, path pattern) -> handler. A pattern is a full-match regex of the path."""

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self._routes: list[_Route] = []
        self._max_body = max_body_bytes

    def add(self, method: str, pattern: str, handler: Handler, *,
            max_body_bytes: int | None = None) -> None:
        """`pattern` is matched against the whole path; plain paths match themselves."""
        self._routes.append(_Route(method.upper(), re.compile(pattern), handler,
                                   self._max_body if max_body_bytes is None else max_body_bytes))

    def match(self, method: str, path: str) -> tuple[_Route | None, dict[str, str], list[str]]:
        """The route and its params; else None and the methods the path allows (405 vs 404)."""
        allowed: list[str] = []
        for route in self._routes:
            m = route.pattern.fullmatch(path)
            if m is None:
                continue
            # HEAD is GET without the body (the sender leaves the body out).
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return route, m.groupdict(), []
            allowed.append(route.method)
        return None, {}, allowed


# --------------------------------------------------------------------------- the server


class _Refuse(Exception):
    """A request answered with an error before any handler ran."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        self.reason = reason  # the http_refused label, when it is one of the listener's limits


@dataclass(eq=False)
class _Conn:
    """A connection whose request is still being read (owned by the loop thread)."""

    sock: socket.socket
    peer: str
    opened: float
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    # Set once the head is read:
    method: str = ""
    path: str = ""
    query: str = ""
    headers: email.message.Message | None = None
    route: _Route | None = None
    params: dict[str, str] = field(default_factory=dict)
    need: int = 0
    client: str = ""
    counted: bool = False  # holds one of its client's max_connections_per_client


_HEAD_END = re.compile(rb"\r?\n\r?\n")
_VERSION = re.compile(r"HTTP/(\d)\.(\d)")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_ACCEPTS_PER_TURN = 64
_RECV_BYTES = 65536


class HttpServer(Worker):
    """The I/O loop as a worker; request threads are tracked here.

    `bind()` opens the socket (port 0 picks a free port: see `address`), then
    `start()` runs the loop. Shutdown: `request_stop()` (stop accepting: the
    loop ends, the listening socket and every unfinished connection are
    closed), wait for `in_flight()` to empty, then `close_streams()` and wait
    for `stream_threads()`.
    """

    max_turn_secs = 10.0

    def __init__(self, host: str, port: int, routes: Routes, metrics: Metrics, *,
                 read_timeout_secs: float = READ_TIMEOUT_SECS,
                 max_concurrent: int = MAX_CONCURRENT, max_connections: int = MAX_CONNECTIONS,
                 webhook_reserve: int | None = None, webhook_prefix: str = WEBHOOK_PREFIX,
                 trusted_proxy_header: str | None = None,
                 max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT,
                 name: str = "http") -> None:
        super().__init__(name, metrics)
        self._requested = (host, port)
        self._routes = routes
        self._read_timeout = read_timeout_secs
        self._max_concurrent = max_concurrent
        self._max_connections = max(1, max_connections)
        self._webhook_reserve = (max_concurrent // 4 if webhook_reserve is None
                                 else max(0, min(webhook_reserve, max_concurrent - 1)))
        self._webhook_prefix = webhook_prefix
        self._proxy_header = trusted_proxy_header
        self._per_client_max = max(1, max_connections_per_client)
        self._listen: socket.socket | None = None
        self._bound: tuple[Any, ...] = ()
        self._selector: selectors.BaseSelector | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closed = threading.Event()
        self._conns: dict[_Conn, None] = {}  # being read; insertion order = oldest first
        self._next_expiry_check = 0.0
        self._lock = threading.Lock()
        self._threads: dict[threading.Thread, bool] = {}  # thread -> is a stream
        self._streams: set[Stream] = set()
        self._per_client: dict[str, int] = {}
        self._counter = itertools.count(1)

    # -- binding --------------------------------------------------------------------

    def bind(self) -> tuple[str, int]:
        host, port = self._requested
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listen = socket.create_server((host, port), family=family, backlog=128)
        self._listen.setblocking(False)
        self._bound = self._listen.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listen, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        if self._listen is None:
            raise RuntimeError("http server is not bound")
        host, port = self._bound
        return str(host), int(port)

    @property
    def accepting(self) -> bool:
        return self._listen is not None and not self._closed.is_set()

    # -- the loop ---------------------------------------------------------------------

    def run_once(self) -> float:
        assert self._listen is not None and self._selector is not None, "bind() first"
        timeout = 0.1 if self._conns else 1.0
        for key, _ in self._selector.select(timeout=timeout):
            if self.stop_event.is_set():
                break
            data = key.data
            if data == "wake":
                _drain(self._wake_r)
            elif data == "accept":
                self._accept()
            elif isinstance(data, _Conn) and data in self._conns:
                self._read(data)
        now = time.monotonic()
        if now >= self._next_expiry_check:
            self._next_expiry_check = now + 0.1
            self._expire(now)
        return 0.0

    def _accept(self) -> None:
        assert self._listen is not None and self._selector is not None
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, address = self._listen.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # a connection reset before accept, EMFILE, ...
                log.debug("http: accept failed: %s", exc)
                return
            sock.setblocking(False)
            if len(self._conns) >= self._max_connections:
                # Full: cut the oldest unfinished request (slow-loris or idle:
                # a real client's request arrives in milliseconds).
                oldest = next(iter(self._conns))
                self.metrics.http_refused.labels("connections").inc()
                self._answer_and_drop(oldest, 408, "request not received in time")
            now = time.monotonic()
            conn = _Conn(sock, str(address[0]), now, now + self._read_timeout)
            self._conns[conn] = None
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("http: connection from %s ended: %s", conn.peer, exc)
            self._drop(conn)
            return
        if not data:
            self._drop(conn)  # the client gave up before its request was complete
            return
        conn.buf += data
        try:
            if conn.route is None:
                self._read_head(conn)
                if conn.route is None:
                    return
            if len(conn.buf) >= conn.need:
                self._complete(conn)
        except _Refuse as refused:
            if refused.reason is not None:
                self.metrics.http_refused.labels(refused.reason).inc()
            self._answer_and_drop(conn, refused.status, str(refused), refused.headers)

    def _expire(self, now: float) -> None:
        late = [c for c in self._conns if c.deadline <= now]
        for conn in late:
            self.metrics.http_refused.labels("timeout").inc()
            what = "request body" if conn.route is not None else "request"
            self._answer_and_drop(conn, 408, f"{what} not received in time")

    # -- parsing ------------------------------------------------------------------------

    def _read_head(self, conn: _Conn) -> None:
        buf = conn.buf
        end = _HEAD_END.search(buf)
        if end is None:
            line_end = buf.find(b"\n")
            if (line_end < 0 and len(buf) > _MAX_REQUEST_LINE) or line_end > _MAX_REQUEST_LINE:
                raise _Refuse(414, "request line too long")
            if len(buf) > _MAX_REQUEST_LINE + MAX_HEADER_BYTES:
                raise _Refuse(431, "header section too large")
            return
        head, rest = bytes(buf[:end.start()]), buf[end.end():]
        line, _, header_bytes = head.partition(b"\n")
        if len(line) > _MAX_REQUEST_LINE:
            raise _Refuse(414, "request line too long")
        if len(header_bytes) > MAX_HEADER_BYTES:
            raise _Refuse(431, "header section too large")
        words = line.rstrip(b"\r").decode("iso-8859-1").split()
        if len(words) != 3 or not _TOKEN.fullmatch(words[0]):
            raise _Refuse(400, "bad request line")
        method, target, version = words
        match = _VERSION.fullmatch(version)
        if match is None:
            raise _Refuse(400, "bad HTTP version")
        if match.group(1) != "1":
            raise _Refuse(505, "HTTP version not supported")
        try:
            headers = http.client.parse_headers(io.BytesIO(header_bytes + b"\r\n\r\n"))
        except http.client.HTTPException:
            raise _Refuse(431, "header section too large") from None
        url = urlsplit(target)
        conn.method, conn.path, conn.query, conn.headers = method, url.path or "/", url.query, headers
        route, params, allowed = self._routes.match(method, conn.path)
        if route is None:
            if allowed:
                raise _Refuse(405, "method not allowed", {"Allow": ", ".join(sorted(set(allowed)))})
            raise _Refuse(404, "not found")
        conn.need = self._body_length(method, headers, route.max_body_bytes)
        conn.client = self._client_of(conn.peer, headers)
        if self._proxy_header is not None:
            with self._lock:
                if self._per_client.get(conn.client, 0) >= self._per_client_max:
                    raise _Refuse(429, "too many requests from this client", {"Retry-After": "1"},
                                  "per_client")
                self._per_client[conn.client] = self._per_client.get(conn.client, 0) + 1
                conn.counted = True
        conn.route, conn.params, conn.buf = route, params, rest
        # The body has its own deadline, as long as the head's.
        conn.deadline = time.monotonic() + self._read_timeout

    @staticmethod
    def _body_length(method: str, headers: email.message.Message, limit: int) -> int:
        if headers.get("Transfer-Encoding"):
            raise _Refuse(501, "chunked request bodies are not supported")
        values = headers.get_all("Content-Length") or []
        if not values:
            if method in ("POST", "PUT", "PATCH"):
                raise _Refuse(411, "Content-Length required")
            return 0
        distinct = {v.strip() for v in values}
        if len(distinct) > 1:
            # Which one a proxy in front used is unknowable: request smuggling.
            raise _Refuse(400, "conflicting Content-Length headers")
        raw = distinct.pop()
        if not re.fullmatch(r"[0-9]{1,10}", raw):
            raise _Refuse(400, "bad Content-Length")
        length = int(raw)
        if length > limit:
            raise _Refuse(413, f"body larger than {limit} bytes")
        return length

    def _client_of(self, peer: str, headers: email.message.Message) -> str:
        if self._proxy_header is None:
            return peer
        value = headers.get(self._proxy_header)
        if not value:
            return peer
        # X-Forwarded-For: client, proxy1, proxy2: the first is the client.
        return value.split(",")[0].strip()[:64] or peer

    # -- handing over -------------------------------------------------------------------

    def _complete(self, conn: _Conn) -> None:
        assert conn.route is not None and conn.headers is not None
        webhook = conn.path.startswith(self._webhook_prefix)
        limit = self._max_concurrent if webhook else self._max_concurrent - self._webhook_reserve
        with self._lock:
            busy = len(self._threads)
        if busy >= limit:
            raise _Refuse(503, "too many requests in flight", {"Retry-After": "1"}, "busy")
        self._forget(conn)
        request = Request(conn.method, conn.path, parse_qs(conn.query), conn.headers,
                          bytes(conn.buf[:conn.need]), conn.client, conn.params)
        thread = threading.Thread(target=self._serve, args=(conn, request, conn.route),
                                  name=f"http-request-{next(self._counter)}", daemon=False)
        with self._lock:
            self._threads[thread] = False
        try:
            thread.start()
        except RuntimeError:  # cannot start a thread (resource limits)
            with self._lock:
                self._threads.pop(thread, None)
            log.exception("http: could not start a request thread")
            self._answer_quietly(conn.sock, 503, "too many requests in flight", {"Retry-After": "1"})
            self._close(conn)

    def _serve(self, conn: _Conn, request: Request, route: _Route) -> None:
        sock = conn.sock
        status = 0
        try:
            sock.setblocking(True)
            sock.settimeout(self._read_timeout)  # a bound on every write
            try:
                result = route.handler(request)
            except Exception:
                log.exception("http: %s %s failed", request.method, request.path)
                result = Response.json(500, {"error": "internal error"})
            status = result.status
            if isinstance(result, StreamResponse):
                self._stream(sock, request, result)
            else:
                _send(sock, request.method, result)
        except OSError as exc:
            log.debug("http: client %s went away: %s", request.client, exc)
        except Exception:
            log.exception("http: request from %s failed", request.client)
        finally:
            log.debug("http: %s %s %s -> %s", request.client, request.method, request.path, status)
            self._close(conn)
            with self._lock:
                self._threads.pop(threading.current_thread(), None)

    def _stream(self, sock: socket.socket, request: Request, result: StreamResponse) -> None:
        head = [("Content-Type", result.content_type), ("Cache-Control", "no-store"),
                *result.headers.items()]
        try:
            sock.sendall(_head(result.status, head))
        except OSError as exc:
            log.debug("http: client went away before the stream started: %s", exc)
            return
        stream = Stream(sock)
        with self._lock:
            self._threads[threading.current_thread()] = True
            self._streams.add(stream)
        try:
            result.run(stream)
        except Exception:
            log.exception("http: stream %s failed", request.path)
        finally:
            stream.closed.set()
            with self._lock:
                self._streams.discard(stream)

    # -- ending connections ---------------------------------------------------------------

    def _answer_and_drop(self, conn: _Conn, status: int, message: str,
                         headers: Mapping[str, str] | None = None) -> None:
        self._answer_quietly(conn.sock, status, message, headers)
        log.debug("http: %s %s %s -> %d (%s)", conn.peer, conn.method or "-", conn.path or "-",
                  status, message)
        self._drop(conn)

    @staticmethod
    def _answer_quietly(sock: socket.socket, status: int, message: str,
                        headers: Mapping[str, str] | None = None) -> None:
        """Best effort, never blocking: a short answer fits in an empty send buffer."""
        body = json.dumps({"error": message}, separators=(",", ":")).encode() + b"\n"
        data = _head(status, [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body))), *(headers or {}).items()]) + body
        try:
            sock.send(data)
        except OSError:
            pass  # the client is gone, or not reading: it gets the close

    def _forget(self, conn: _Conn) -> None:
        """Stop reading `conn` (the loop thread): it is handed over or dropped."""
        self._conns.pop(conn, None)
        if self._selector is not None:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass  # not registered (any more)

    def _drop(self, conn: _Conn) -> None:
        self._forget(conn)
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.counted:
            with self._lock:
                left = self._per_client.get(conn.client, 1) - 1
                if left > 0:
                    self._per_client[conn.client] = left
                else:
                    self._per_client.pop(conn.client, None)
            conn.counted = False
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
        conn.sock.close()

    # -- the worker's edges -----------------------------------------------------------------

    def wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # the pipe is full: a wake-up is pending anyway

    def final(self) -> None:
        # Stop accepting: close the listening socket, so a new client is refused
        # at once instead of waiting in the backlog of a server that will not answer.
        if self._listen is not None and self.stop_event.is_set() and not self._closed.is_set():
            host, port = self.address
            for conn in list(self._conns):
                self._drop(conn)  # unfinished requests: nothing was taken from them
            if self._selector is not None:
                self._selector.close()
            self._listen.close()
            self._closed.set()
            log.info("http: stopped accepting on %s:%d", host, port)

    def in_flight(self) -> list[str]:
        with self._lock:
            return [t.name for t, is_stream in self._threads.items() if not is_stream]

    def stream_threads(self) -> list[str]:
        with self._lock:
            return [t.name for t, is_stream in self._threads.items() if is_stream]

    def connections(self) -> int:
        """Connections whose request is still being read (for tests and status)."""
        return len(self._conns)

    def close_streams(self) -> int:
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close()
        if streams:
            log.info("http: closed %d open stream(s)", len(streams))
        return len(streams)

    def close(self) -> None:
        """Release the sockets (after the loop ended)."""
        if self._listen is not None and not self._closed.is_set():
            for conn in list(self._conns):
                self._drop(conn)
            if self._selector is not None:
                self._selector.close()
            self._listen.close()
            self._closed.set()
        self._wake_r.close()
        self._wake_w.close()


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.0 {status} {phrase}", f"Server: {SERVER_NAME}",
             f"Date: {email.utils.formatdate(usegmt=True)}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")


def _send(sock: socket.socket, method: str, response: Response) -> None:
    head = _head(response.status, [("Content-Type", response.content_type),
                                   ("Content-Length", str(len(response.body))),
                                   *response.headers.items()])
    sock.sendall(head if method == "HEAD" else head + response.body)


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, OSError):
        pass
