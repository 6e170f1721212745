"""The HTTP listener: routing, limits, timeouts, and no tracebacks in responses.

A real `HttpServer` on a free port, real sockets; requests are written by hand
where the point is a malformed or slow one.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.web.server import MAX_HEADER_BYTES, HttpServer, Request, Response, Routes
from support.harness.servers import wait_until

LIMIT = 1000


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def server(gate: threading.Event) -> Iterator[HttpServer]:
    routes = Routes(max_body_bytes=LIMIT)
    routes.add("GET", "/healthz", lambda r: Response.json(200, {"status": "alive"}))

    def echo(request: Request) -> Response:
        return Response.json(200, {"account": request.params["account"], "len": len(request.body),
                                   "q": request.query.get("q", [])})

    def fail(request: Request) -> Response:
        raise RuntimeError("secret-detail that must not leak")

    def wait(request: Request) -> Response:
        gate.wait(10)
        return Response.json(200, {})

    routes.add("POST", r"/v1/accounts/(?P<account>[0-9]+)/echo", echo)
    routes.add("GET", "/fail", fail)
    routes.add("GET", "/wait", wait)
    srv = HttpServer("127.0.0.1", 0, routes, Metrics(), read_timeout_secs=0.5, max_concurrent=2)
    srv.bind()
    srv.start()
    yield srv
    gate.set()
    srv.request_stop()
    assert srv.join(5)
    assert wait_until(lambda: not srv.in_flight(), 5)
    srv.close()


def _request(server: HttpServer, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*server.address, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _raw(server: HttpServer, data: bytes, *, wait_reply: bool = True) -> bytes:
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(data)
        if not wait_reply:
            return b""
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_routes_params_queries_and_methods(server: HttpServer) -> None:
    assert _request(server, "GET", "/healthz")[0] == 200
    status, _, body = _request(server, "POST", "/v1/accounts/42/echo?q=a&q=b", b"hello")
    assert status == 200 and json.loads(body) == {"account": "42", "len": 5, "q": ["a", "b"]}
    status, headers, _ = _request(server, "POST", "/healthz", b"")
    assert status == 405 and headers["Allow"] == "GET"
    status, _, body = _request(server, "HEAD", "/healthz")
    assert status == 200 and body == b""
    assert _request(server, "GET", "/nope")[0] == 404
    assert _request(server, "GET", "/v1/accounts/x/echo")[0] == 404


def test_a_failing_handler_answers_500_without_any_detail(server: HttpServer,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    status, _, body = _request(server, "GET", "/fail")
    assert status == 500 and json.loads(body) == {"error": "internal error"}
    assert b"secret-detail" not in body and b"Traceback" not in body
    assert "secret-detail" in caplog.text  # the log has it, with the traceback


def test_body_limits(server: HttpServer) -> None:
    assert _request(server, "POST", "/v1/accounts/1/echo", b"x" * (LIMIT + 1))[0] == 413
    assert _request(server, "POST", "/v1/accounts/1/echo", b"x" * LIMIT)[0] == 200
    reply = _raw(server, b"POST /v1/accounts/1/echo HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 411")
    reply = _raw(server, b"POST /v1/accounts/1/echo HTTP/1.1\r\nHost: x\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 501")


def test_header_and_request_line_limits(server: HttpServer) -> None:
    big = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"y" * 1000) for i in range(MAX_HEADER_BYTES // 1000 + 2))
    reply = _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
    assert reply.startswith(b"HTTP/1.0 431"), reply[:100]
    reply = _raw(server, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 414"), reply[:100]


def test_a_slow_client_is_cut_off_after_the_read_timeout(server: HttpServer) -> None:
    with socket.create_connection(server.address, timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        reply = sock.recv(65536)
        took = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.0 408"), reply[:100]
    assert took < 3.0
    # A sender that trickles bytes is cut off by the whole-request deadline too.
    with socket.create_connection(server.address, timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        got = b""
        for _ in range(40):
            try:
                sock.sendall(b"X: y\r\n")
            except OSError:
                break
            sock.settimeout(0.1)
            try:
                got = sock.recv(65536)
            except TimeoutError:
                continue
            break
        assert got.startswith(b"HTTP/1.0 408") or got == b"", got[:100]
        assert time.monotonic() - started < 3.0


def test_too_many_requests_in_flight_get_503(server: HttpServer, gate: threading.Event) -> None:
    results: list[int] = []
    askers = [threading.Thread(target=lambda: results.append(_request(server, "GET", "/wait")[0]),
                               name=f"test-asker-{i}") for i in range(2)]
    for asker in askers:
        asker.start()
    assert wait_until(lambda: len(server.in_flight()) == 2, 5)
    status, headers, _ = _request(server, "GET", "/healthz")
    assert status == 503 and headers.get("Retry-After") == "1"
    gate.set()
    for asker in askers:
        asker.join(10)
    assert results == [200, 200]


def test_stop_refuses_new_connections_and_lets_requests_in_flight_finish(
        server: HttpServer, gate: threading.Event) -> None:
    results: list[int] = []
    asker = threading.Thread(target=lambda: results.append(_request(server, "GET", "/wait")[0]),
                             name="test-asker")
    asker.start()
    assert wait_until(lambda: len(server.in_flight()) == 1, 5)
    server.request_stop()
    assert server.join(5)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(server.address, timeout=2)
    assert server.in_flight()  # still being answered
    gate.set()
    asker.join(10)
    assert results == [200]
    assert wait_until(lambda: not server.in_flight(), 5)


def test_a_header_trickled_a_byte_at_a_time_cannot_outlast_the_deadline(server: HttpServer) -> None:
    """Each byte arrives inside the socket timeout (0.5 s), so only a deadline applied to
    every single recv ends the request."""
    with socket.create_connection(server.address, timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        got = b""
        pause = threading.Event()
        while time.monotonic() - started < 5:
            try:
                sock.sendall(b"a")
            except OSError:
                break
            sock.settimeout(0.2)
            try:
                got = sock.recv(65536)
                break
            except TimeoutError:
                pause.wait(0.05)
        took = time.monotonic() - started
    assert got.startswith(b"HTTP/1.0 408") or got == b"", got[:100]
    assert took < 2.0, took
