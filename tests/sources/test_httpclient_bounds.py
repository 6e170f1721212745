"""`httpclient.request` against a real HTTP server on loopback: the whole-request deadline and the
per-call size cap.

A server that trickles its answer (status line, headers or body) a byte at a time never lets one
read wait as long as the timeout, yet the call ends at its deadline with `DeadlineExceeded`. An
answer above the caller's `max_bytes` is refused (`ResponseTooLarge`), whether its
`Content-Length` says so or it is sent without one; an answer within a larger cap is read whole.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from lumio_ingestd.sources.httpclient import DeadlineExceeded, HttpUnavailable, ResponseTooLarge, request


@contextmanager
def serving(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A one-connection-at-a-time server on loopback; `answer` writes the response."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)  # the request (small, in one piece on loopback)
                    answer(conn, stop)
                except OSError:
                    pass

    thread = threading.Thread(target=loop, name="test-http-server")
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/path"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def trickle(data: bytes, every: float) -> Callable[[socket.socket, threading.Event], None]:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        for i in range(len(data)):
            if stop.wait(every):
                return
            conn.sendall(data[i:i + 1])
    return answer


def whole(data: bytes) -> Callable[[socket.socket, threading.Event], None]:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)
    return answer


BODY = b'{"ok": true}' * 10
RESPONSE = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickled_answer_ends_at_the_whole_request_deadline(where: str) -> None:
    split = RESPONSE.index(b"\r\n\r\n") + 4
    head, tail = RESPONSE[:split], RESPONSE[split:]

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        if where == "body":
            conn.sendall(head)
            trickle(tail, 0.05)(conn, stop)
        else:
            trickle(RESPONSE, 0.05)(conn, stop)

    with serving(answer) as url:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="within 0.5s"):
            request("GET", url, headers={}, timeout=0.5)
        took = time.monotonic() - started
    # Each byte comes well within the timeout: only a deadline over the whole request ends it.
    assert took < 1.5, took


def test_an_answer_within_the_deadline_is_read_whole() -> None:
    with serving(trickle(RESPONSE, 0.001)) as url:
        result = request("GET", url, headers={}, timeout=5)
    assert result.status == 200 and result.body == BODY


def test_the_size_cap_is_the_callers_and_refuses_above_it() -> None:
    big = b"x" * (3 * 1024 * 1024)
    announced = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
    unannounced = b"HTTP/1.0 200 OK\r\n\r\n" + big
    for raw in (announced, unannounced):
        with serving(whole(raw)) as url:
            with pytest.raises(ResponseTooLarge, match="1048576"):
                request("GET", url, headers={}, timeout=5)
            with pytest.raises(ResponseTooLarge):
                request("GET", url, headers={}, timeout=5, max_bytes=len(big) - 1)
            assert request("GET", url, headers={}, timeout=5, max_bytes=len(big)).body == big
    assert issubclass(ResponseTooLarge, HttpUnavailable) and issubclass(DeadlineExceeded, HttpUnavailable)
