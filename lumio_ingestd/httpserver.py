"""The HTTP listener: a routes table on the standard library's HTTP server.

Every request runs on its own named, non-daemon thread that the server
tracks, so that shutdown can stop accepting, give the requests in flight a
bounded time, and then close the streams that are still open (Server-Sent
Events and other long responses). The accept loop is a `Worker` (named
"http"), so the supervisor restarts it and the watchdog sees it.

Limits, because the port faces webhooks from the internet: one request per
connection (HTTP/1.0: no idle keep-alive connections to wait for), a cap on
the header section (431), on the body (413, and only Content-Length bodies:
411/501 otherwise), on the time to read a request (408 when it runs out,
slow senders included), and on concurrent requests (503). An exception in a
handler is logged with its traceback and answered with a bare 500: a response
never carries a traceback or an exception's text.

Later issues add routes (POST /webhooks/twitch, POST /v1/events/emit, the
alert streams) with `Routes.add`. Nothing durable lives here; what a handler
stores is its own business, and it has returned before the response is sent.
"""

from __future__ import annotations

import email.message
import http.client
import io
import itertools
import json
import logging
import re
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

from .metrics import Metrics
from .worker import Worker

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
READ_TIMEOUT_SECS = 10.0
MAX_CONCURRENT = 64
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
    flight had their time); a handler's loop checks `closed` or uses
    `wait_closed(timeout)` as its timer.
    """

    def __init__(self, wfile: BinaryIO, sock: socket.socket) -> None:
        self._wfile = wfile
        self._sock = sock
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def write(self, data: bytes) -> bool:
        if self.closed.is_set():
            return False
        try:
            with self._lock:
                self._wfile.write(data)
                self._wfile.flush()
        except OSError:  # the peer went away, or close() shut the socket down
            self.closed.set()
            return False
        return True

    def wait_closed(self, timeout: float) -> bool:
        return self.closed.wait(timeout)

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


class _BoundedReader:
    """The connection's input, with a byte budget and a deadline for the current phase."""

    def __init__(self, raw: io.BufferedReader, sock: socket.socket, io_timeout: float) -> None:
        self._raw = raw
        self._sock = sock
        self._io_timeout = io_timeout
        self._budget = 0
        self._deadline = 0.0

    def limit(self, budget: int, deadline: float) -> None:
        self._budget = budget
        self._deadline = deadline

    def budget(self, budget: int) -> None:
        """A new byte budget, same deadline (the header section after the request line)."""
        self._budget = budget

    def _check_time(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request not read in time")
        # Every single recv waits at most until the deadline: a client that
        # trickles a byte at a time cannot stretch the read past it.
        self._sock.settimeout(left)

    def readline(self, size: int = -1) -> bytes:
        if self._budget <= 0:
            raise http.client.LineTooLong("header section")
        cap = self._budget if size < 0 else min(size, self._budget)
        line = bytearray()
        while len(line) < cap:
            self._check_time()
            chunk = self._raw.peek(1)[:cap - len(line)]  # at most one recv
            if not chunk:
                break
            end = chunk.find(b"\n")
            line += self._raw.read(end + 1 if end >= 0 else len(chunk))
            if end >= 0:
                break
        self._budget -= len(line)
        if self._budget <= 0 and not line.endswith(b"\n"):
            raise http.client.LineTooLong("header section")
        self._sock.settimeout(self._io_timeout)  # writes keep the ordinary bound
        return bytes(line)

    def close(self) -> None:
        self._raw.close()

    def read(self, size: int) -> bytes:
        """Exactly `size` bytes or fewer at EOF; bounded by the deadline."""
        chunks: list[bytes] = []
        remaining = size
        while remaining > 0:
            self._check_time()
            chunk = self._raw.read1(min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        self._sock.settimeout(self._io_timeout)
        return b"".join(chunks)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"
    server_version = "lumio-ingestd"

    def version_string(self) -> str:
        return self.server_version  # no Python version for the curious

    def setup(self) -> None:
        super().setup()
        # A bound on every socket operation; _BoundedReader bounds the whole read.
        self.connection.settimeout(self.server.read_timeout_secs)
        self._reader = _BoundedReader(self.rfile, self.connection,  # type: ignore[arg-type]
                                      self.server.read_timeout_secs)
        self.rfile = self._reader  # type: ignore[assignment]

    def handle(self) -> None:
        # HTTP/1.0: exactly one request per connection.
        self.close_connection = True
        self.handle_one_request()

    def handle_one_request(self) -> None:
        self._reader.limit(MAX_HEADER_BYTES + _MAX_REQUEST_LINE,
                           time.monotonic() + self.server.read_timeout_secs)
        try:
            self.raw_requestline = self.rfile.readline(_MAX_REQUEST_LINE + 1)
        except http.client.LineTooLong:
            self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return
        except TimeoutError:
            self._timed_out()
            return
        if not self.raw_requestline:
            return
        if len(self.raw_requestline) > _MAX_REQUEST_LINE:
            self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return
        self._reader.budget(MAX_HEADER_BYTES)
        try:
            if not self.parse_request():  # answers 400/431/505 itself
                return
        except TimeoutError:
            self._timed_out()
            return
        self._dispatch()

    def _timed_out(self) -> None:
        self.requestline = self.requestline if hasattr(self, "requestline") else ""
        self.request_version = "HTTP/1.0"
        self.command = getattr(self, "command", "") or ""
        try:
            self.send_error(HTTPStatus.REQUEST_TIMEOUT)
        except OSError:
            pass  # the client is gone too

    # -- dispatch ----------------------------------------------------------------

    def _dispatch(self) -> None:
        server = self.server
        url = urlsplit(self.path)
        path = url.path or "/"
        route, params, allowed = server.routes.match(self.command, path)
        if route is None:
            if allowed:
                self._send(Response.json(405, {"error": "method not allowed"},
                                         {"Allow": ", ".join(sorted(set(allowed)))}))
            else:
                self._send(Response.json(404, {"error": "not found"}))
            return
        body = self._read_body(route.max_body_bytes)
        if body is None:
            return
        request = Request(self.command, path, parse_qs(url.query), self.headers, body,
                          f"{self.client_address[0]}", params)
        try:
            result = route.handler(request)
        except Exception:
            log.exception("http: %s %s failed", self.command, path)
            self._send(Response.json(500, {"error": "internal error"}))
            return
        if isinstance(result, StreamResponse):
            self._stream(result)
        else:
            self._send(result)

    def _read_body(self, limit: int) -> bytes | None:
        if self.headers.get("Transfer-Encoding"):
            self._send(Response.json(501, {"error": "chunked request bodies are not supported"}))
            return None
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            if self.command in ("POST", "PUT", "PATCH"):
                self._send(Response.json(411, {"error": "Content-Length required"}))
                return None
            return b""
        if not re.fullmatch(r"[0-9]{1,10}", raw_length.strip()):
            self._send(Response.json(400, {"error": "bad Content-Length"}))
            return None
        length = int(raw_length)
        if length > limit:
            self._send(Response.json(413, {"error": f"body larger than {limit} bytes"}))
            return None
        self._reader.limit(0, time.monotonic() + self.server.read_timeout_secs)
        try:
            body = self._reader.read(length)
        except TimeoutError:
            self._send(Response.json(408, {"error": "request body not received in time"}))
            return None
        if len(body) != length:
            self._send(Response.json(400, {"error": "body shorter than Content-Length"}))
            return None
        return body

    def _send(self, response: Response) -> None:
        try:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)
            self.wfile.flush()
        except OSError as exc:
            log.debug("http: client went away before the response was sent: %s", exc)

    def _stream(self, result: StreamResponse) -> None:
        try:
            self.send_response(result.status)
            self.send_header("Content-Type", result.content_type)
            self.send_header("Cache-Control", "no-store")
            for name, value in result.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.flush()
        except OSError as exc:
            log.debug("http: client went away before the stream started: %s", exc)
            return
        stream = Stream(self.wfile, self.connection)  # type: ignore[arg-type]
        self.server.stream_opened(stream)
        try:
            result.run(stream)
        except Exception:
            log.exception("http: stream %s failed", self.path)
        finally:
            stream.closed.set()
            self.server.stream_closed(stream)

    # -- the standard library's own output -------------------------------------

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Short JSON errors; the standard library's HTML page is not needed."""
        try:
            status = HTTPStatus(code)
            text = message or status.phrase
        except ValueError:
            text = message or "error"
        self.close_connection = True
        self._send(Response.json(code, {"error": text}))

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: %s %s", self.address_string(), format % args)


class _Server(socketserver.TCPServer):
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], routes: Routes, read_timeout_secs: float,
                 max_concurrent: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.routes = routes
        self.read_timeout_secs = read_timeout_secs
        self.max_concurrent = max_concurrent
        self._lock = threading.Lock()
        self._threads: dict[threading.Thread, bool] = {}  # thread -> is a stream
        self._streams: set[Stream] = set()
        self._counter = itertools.count(1)
        super().__init__(address, _RequestHandler)

    # -- one thread per request, tracked ---------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            busy = len(self._threads)
        if busy >= self.max_concurrent:
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        thread = threading.Thread(target=self._serve_one, args=(request, client_address),
                                  name=f"http-request-{next(self._counter)}", daemon=False)
        with self._lock:
            self._threads[thread] = False
        thread.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except (OSError, http.client.HTTPException) as exc:
            log.debug("http: connection from %s ended: %s", client_address[0], exc)
        except Exception:
            log.exception("http: request from %s failed", client_address[0])
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._threads.pop(threading.current_thread(), None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("http: request from %s failed", client_address[0])

    def stream_opened(self, stream: Stream) -> None:
        with self._lock:
            self._threads[threading.current_thread()] = True
            self._streams.add(stream)

    def stream_closed(self, stream: Stream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def in_flight(self) -> list[str]:
        with self._lock:
            return [t.name for t, is_stream in self._threads.items() if not is_stream]

    def stream_threads(self) -> list[str]:
        with self._lock:
            return [t.name for t, is_stream in self._threads.items() if is_stream]

    def close_streams(self) -> int:
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close()
        return len(streams)


def _refuse_busy(sock: socket.socket) -> None:
    body = b'{"error":"too many requests in flight"}\n'
    try:
        sock.settimeout(1.0)
        sock.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass  # best effort; the connection is closed next


class HttpServer(Worker):
    """The accept loop as a worker; request threads are tracked by the server.

    `bind()` opens the socket (port 0 picks a free port: see `address`), then
    `start()` runs the loop. Shutdown: `request_stop()` (stop accepting: the
    loop ends and the listening socket is closed), wait for `in_flight()` to
    empty, then `close_streams()` and wait for `stream_threads()`.
    """

    max_turn_secs = 10.0

    def __init__(self, host: str, port: int, routes: Routes, metrics: Metrics, *,
                 read_timeout_secs: float = READ_TIMEOUT_SECS,
                 max_concurrent: int = MAX_CONCURRENT, name: str = "http") -> None:
        super().__init__(name, metrics)
        self._requested = (host, port)
        self._routes = routes
        self._read_timeout = read_timeout_secs
        self._max_concurrent = max_concurrent
        self._server: _Server | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closed = threading.Event()

    def bind(self) -> tuple[str, int]:
        self._server = _Server(self._requested, self._routes, self._read_timeout, self._max_concurrent)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server.socket, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("http server is not bound")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def accepting(self) -> bool:
        return self._server is not None and not self._closed.is_set()

    def run_once(self) -> float:
        assert self._server is not None and self._selector is not None, "bind() first"
        for key, _ in self._selector.select(timeout=1.0):
            if key.data == "wake":
                _drain(self._wake_r)
            elif not self.stop_event.is_set():
                self._accept_one()
        return 0.0

    def _accept_one(self) -> None:
        assert self._server is not None
        try:
            request, client_address = self._server.get_request()
        except OSError as exc:  # a connection reset before accept, EMFILE, ...
            log.debug("http: accept failed: %s", exc)
            return
        try:
            self._server.process_request(request, client_address)
        except Exception:
            log.exception("http: could not start a request thread")
            self._server.shutdown_request(request)

    def wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # the pipe is full: a wake-up is pending anyway

    def final(self) -> None:
        # Stop accepting: close the listening socket, so a new client is refused
        # at once instead of waiting in the backlog of a server that will not answer.
        if self._server is not None and self.stop_event.is_set() and not self._closed.is_set():
            host, port = self.address
            if self._selector is not None:
                self._selector.close()
            self._server.server_close()
            self._closed.set()
            log.info("http: stopped accepting on %s:%d", host, port)

    def in_flight(self) -> list[str]:
        return self._server.in_flight() if self._server is not None else []

    def stream_threads(self) -> list[str]:
        return self._server.stream_threads() if self._server is not None else []

    def close_streams(self) -> int:
        count = self._server.close_streams() if self._server is not None else 0
        if count:
            log.info("http: closed %d open stream(s)", count)
        return count

    def close(self) -> None:
        """Release the wake pipe (after the loop ended)."""
        if self._server is not None and not self._closed.is_set():
            self._server.server_close()
            self._closed.set()
        self._wake_r.close()
        self._wake_w.close()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, OSError):
        pass
