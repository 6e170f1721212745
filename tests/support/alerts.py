"""Clients of the live-alert stream for the tests: the SSE route over a rig, and a reader.

`stream_routes(rig, token)` serves `GET /v1/accounts/A/alerts/stream` for a
`TwitchRig`'s publisher; `open_stream(port)` connects to it over a real
socket and sends the request; `Reader` reads the response on its own thread
and splits it into SSE messages.
"""

from __future__ import annotations

import socket
import threading

from lumio_ingestd.config import Secret
from lumio_ingestd.events.alerts import STREAM_PATH, stream_handler
from lumio_ingestd.web.server import Routes
from support.twitch import EMIT_TOKEN, TwitchRig


def stream_routes(rig: TwitchRig, token: Secret | None, heartbeat_secs: float = 15.0) -> Routes:
    routes = Routes()
    routes.add("GET", STREAM_PATH,
               stream_handler(rig.alerts, token, rig.metrics, heartbeat_secs=heartbeat_secs))
    return routes


def open_stream(port: int, account: int = 42, token: str = EMIT_TOKEN,
                rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /v1/accounts/{account}/alerts/stream HTTP/1.0\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    return sock


class Reader:
    """Reads an SSE response on its own thread and splits it into messages."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            while chunk := self.sock.recv(65536):
                self.data += chunk
        except OSError:
            pass

    def messages(self) -> list[dict[str, str]]:
        body = self.data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in self.data else b""
        out = []
        for block in body.decode().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line and
                          not line.startswith(":"))
            if "data" in fields:
                out.append(fields)
        return out

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(10)
        self.sock.close()
