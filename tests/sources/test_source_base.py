"""The Source base over a real TCP socket: reconnect with backoff, prompt stop, release."""

from __future__ import annotations

import socket
import threading
import time

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.base import Source, SourceClosed
from support.harness.servers import wait_until


class LineSource(Source):
    """Reads newline-terminated lines from a TCP server."""

    platform = "test"
    reconnect_min_secs = 0.05
    reconnect_max_secs = 0.2

    def __init__(self, port: int) -> None:
        super().__init__("line-source", Metrics())
        self.port = port
        self.sock: socket.socket | None = None
        self.lines: list[bytes] = []
        self.held: list[bytes] = []
        self.released: list[bytes] = []
        self._buf = b""

    def connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
        self.sock.settimeout(0.2)

    def read_once(self) -> None:
        assert self.sock is not None
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return
        if not data:
            raise SourceClosed("peer closed")
        self._buf += data
        *done, self._buf = self._buf.split(b"\n")
        self.lines.extend(done)
        self.held.extend(done)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def release(self) -> None:
        self.released.extend(self.held)
        self.held.clear()


def test_reconnects_after_the_peer_closes_and_stops_promptly() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sessions: list[int] = []
    done = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        n = 0
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            n += 1
            sessions.append(n)
            conn.sendall(f"hello {n}\n".encode())
            if n < 3:
                conn.close()  # the first two connections drop at once
            else:
                done.wait(10)
                conn.close()

    server = threading.Thread(target=serve)
    server.start()
    src = LineSource(port)
    src.start()
    try:
        assert wait_until(lambda: len(src.lines) == 3, timeout=5)
        assert src.lines == [b"hello 1", b"hello 2", b"hello 3"]
        assert src.metrics.source_disconnects.labels("test")._value.get() == 2
        started = time.monotonic()
        src.request_stop()
        assert src.join(2)
        assert time.monotonic() - started < 0.5
        assert src.released == src.lines  # what it held went out before it stopped
    finally:
        done.set()
        server.join(5)
        listener.close()


def test_connect_failures_back_off_with_jitter_within_bounds() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nobody listens: every connect is refused
    src = LineSource(port)
    delays = []
    for _ in range(8):
        delays.append(src.run_once())
    assert all(0.05 <= d <= 0.2 for d in delays)
    assert len(set(delays)) > 1  # jittered, not a fixed cadence
    assert src.metrics.source_connect_failures.labels("test")._value.get() == 8
