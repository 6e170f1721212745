"""The stand-ins' shared lifecycle (lumio_ingestd/devkit/standins/base.py), on real loopback sockets.

What every stand-in relies on: free ports and URLs once started, named
non-daemon threads, `close()` closing open WebSockets with 1001, waking the
loops and `wait_for` waiters through the stop event, shutting the HTTP side
and joining every thread; `wait_for` waking on a notification, not a poll.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request, Response
from websockets.sync.client import connect
from websockets.sync.server import ServerConnection

from lumio_ingestd.devkit.standins.base import JsonHandler, StandinServers
from lumio_ingestd.devkit.standins.jetstream import JetstreamStandin
from lumio_ingestd.devkit.standins.kick import KickStandin
from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.devkit.standins.streamelements import AstroStandin
from lumio_ingestd.devkit.standins.twitch import TwitchStandin


def _handler() -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            self._answer(200, {"path": self.path}, {"X-Standin": "yes"})

        def do_DELETE(self) -> None:  # noqa: N802
            self._answer(204, None)

    return Handler


class Echo(StandinServers):
    """A stand-in of nothing: echoes WebSocket frames, answers HTTP GETs, runs one loop."""

    def __init__(self, *, http: bool = True, refuse: bool = False) -> None:
        self.loop_exited = threading.Event()
        self.handlers_done = 0
        # A long poll: only a notification wakes wait_for within a test's time.
        super().__init__("echo", http_handler=_handler() if http else None,
                         loops=[("ticker", self._ticker)], wait_poll_secs=60.0,
                         process_request=self._refuse if refuse else None)

    def _ticker(self) -> None:
        while not self._stop.wait(0.05):
            pass
        self.loop_exited.set()

    def _refuse(self, conn: ServerConnection, request: Request) -> Response | None:
        return conn.respond(503, "refused\n")

    def _handle_ws(self, conn: ServerConnection) -> None:
        try:
            for message in conn:
                conn.send(message)
        except ConnectionClosed:
            pass
        finally:
            with self._lock:
                self.handlers_done += 1
            self._notify()


def _get(port: int, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, "/some/path")
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_start_serves_both_sides_on_free_ports_with_named_threads() -> None:
    with Echo() as echo:
        assert echo.ws_port and echo.http_port and echo.ws_port != echo.http_port
        assert echo.port == echo.ws_port
        assert echo._ws_url("/x") == f"ws://127.0.0.1:{echo.ws_port}/x"
        with connect(echo._ws_url("/"), open_timeout=5) as ws:
            ws.send("hello")
            assert ws.recv(timeout=5) == "hello"
        status, headers, body = _get(echo.http_port)
        assert (status, headers["x-standin"], headers["content-type"]) == (200, "yes", "application/json")
        assert body == b'{"path": "/some/path"}'
        status, headers, body = _get(echo.http_port, "DELETE")
        assert (status, body, "content-type" in headers) == (204, b"", False)
        names = {t.name: t for t in threading.enumerate()}
        for role in ("ws", "http", "ticker"):
            thread = names[f"standin-echo-{role}"]
            assert thread.is_alive() and not thread.daemon


def test_close_closes_sockets_wakes_loops_and_joins_every_thread() -> None:
    echo = Echo().start()
    threads = list(echo._threads)
    with connect(echo._ws_url("/"), open_timeout=5) as ws:
        assert echo.wait_for(lambda: False, 0.01) is False  # the lock works before close
        waiter_result: list[bool] = []
        looked = threading.Event()

        def stopped() -> bool:
            looked.set()
            return echo._stop.is_set()

        waiter = threading.Thread(target=lambda: waiter_result.append(echo.wait_for(stopped, 30)),
                                  name="test-waiter")
        waiter.start()
        assert looked.wait(5)
        started = time.monotonic()
        echo.close()
        assert time.monotonic() - started < 5
        waiter.join(5)
        assert waiter_result == [True]  # woken by the stop event, not by a timeout
        assert echo.loop_exited.is_set()
        assert echo.handlers_done == 1  # the WebSocket server waited for the handler
        assert not [t.name for t in threads if t.is_alive()]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        with pytest.raises(OSError):
            _get(echo.http_port)
    echo.close()  # a second close is harmless


def test_without_http_side_and_with_process_request() -> None:
    with Echo(http=False, refuse=True) as echo:
        assert echo.http_port == 0 and echo._http is None
        assert "standin-echo-http" not in {t.name for t in threading.enumerate()}
        with pytest.raises(InvalidStatus, match="503"), connect(echo._ws_url("/"), open_timeout=5):
            pass


def test_wait_for_wakes_on_notify_and_times_out() -> None:
    with Echo() as echo:
        flag: list[int] = []
        looked = threading.Event()

        def predicate() -> bool:
            looked.set()
            return bool(flag)

        def later() -> None:
            looked.wait(5)  # the waiter is waiting: it sees the change only if notified
            with echo._lock:
                flag.append(1)
            echo._notify()

        thread = threading.Thread(target=later, name="test-later")
        thread.start()
        started = time.monotonic()
        assert echo.wait_for(predicate, 30)
        assert time.monotonic() - started < 5
        thread.join(5)
        started = time.monotonic()
        assert echo.wait_for(lambda: False, 0.3) is False
        assert 0.3 <= time.monotonic() - started < 2


def test_port_before_start_is_an_error() -> None:
    with pytest.raises(AssertionError):
        _ = Echo().port


@pytest.mark.parametrize("make", [TwitchStandin, KickStandin, SevenTvStandin, AstroStandin,
                                  JetstreamStandin])
def test_every_standin_starts_and_closes_through_the_base(make: Callable[[], StandinServers]) -> None:
    standin = make()
    assert isinstance(standin, StandinServers)
    with standin:
        threads = list(standin._threads)
        assert standin.port > 0 and all(t.is_alive() for t in threads)
        assert threads[0].name.startswith("standin-") and threads[0].name.endswith("-ws")
    assert not [t.name for t in threads if t.is_alive()]
