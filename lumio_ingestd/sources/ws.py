"""One WebSocket client connection, shared by every platform's socket source.

Built on websocket-client's blocking API, which starts no thread of its own:
the source's thread reads, and pings are answered with pongs inside `recv`
(Twitch closes with 4002 otherwise; pings do not count as traffic for the
keepalive timer, so `recv` reports only data frames). `send_text` is for
protocols that talk back (Pusher, Astro, 7TV); EventSub closes the socket
with 4001 on any inbound data, so the Twitch source never calls it.

`abort()` may be called from any thread: it shuts the TCP socket down, which
wakes a `recv` blocked in another thread. Text is handed back as bytes and
decoded by the caller, so that invalid UTF-8 is one refused frame instead of
a broken connection. Nothing durable here.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import websocket

MAX_MESSAGE_BYTES = 1024 * 1024


class Binary(bytes):
    """The payload of a binary frame (EventSub sends only text; the reader refuses these)."""


class WsClosed(Exception):
    """The connection ended; `code` is the peer's close code (None: no close frame)."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"closed with {code}: {reason}" if code is not None else reason)
        self.code = code
        self.reason = reason


class WsConnection:
    def __init__(self, url: str, *, connect_timeout: float) -> None:
        self.url = url
        self._connect_timeout = connect_timeout
        self._ws: websocket.WebSocket | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._aborted = False
        self.last_frame = time.monotonic()  # when the last data frame arrived
        # When any frame arrived, pings included: for protocols whose only sign of
        # life on a quiet connection is the server's ping (Astro).
        self.last_seen = self.last_frame

    def open(self) -> None:
        """Connect and do the opening handshake, bounded by the connect timeout; raises OSError
        or websocket's exceptions."""
        ws = websocket.create_connection(self.url, timeout=self._connect_timeout,
                                         skip_utf8_validation=True, enable_multithread=True)
        with self._lock:
            if self._aborted:  # abort() raced with the connect
                ws.shutdown()  # type: ignore[no-untyped-call]
                raise WsClosed(None, "aborted while connecting")
            self._ws = ws
            self._sock = ws.sock
        self.last_frame = self.last_seen = time.monotonic()

    def recv(self, timeout: float) -> bytes | None:
        """One data frame's payload, or None when `timeout` passed first (or only control
        frames came). Raises WsClosed when the connection ends."""
        ws = self._ws
        if ws is None:
            raise WsClosed(None, "not connected")
        deadline = time.monotonic() + max(0.0, timeout)
        first = True  # one attempt even at timeout 0: what is buffered already is read
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and not first:
                return None
            first = False
            try:
                ws.settimeout(max(0.001, left))
                opcode, data = ws.recv_data(control_frame=True)
            except websocket.WebSocketTimeoutException:
                return None
            except websocket.WebSocketConnectionClosedException:
                raise WsClosed(None, "connection closed without a close frame") from None
            except websocket.WebSocketPayloadException as exc:
                raise WsClosed(1007, f"bad payload: {exc}") from None
            except websocket.WebSocketProtocolException as exc:
                raise WsClosed(1002, f"protocol error: {exc}") from None
            except (OSError, AttributeError) as exc:
                # AttributeError: websocket-client's socket was shut down under it by abort().
                raise WsClosed(None, f"{type(exc).__name__}: {exc}") from None
            self.last_seen = time.monotonic()
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None
                raise WsClosed(code, bytes(data[2:]).decode("utf-8", "replace"))
            if opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY):
                self.last_frame = time.monotonic()
                payload = bytes(data[:MAX_MESSAGE_BYTES + 1])  # longer: refused as too large
                return Binary(payload) if opcode == websocket.ABNF.OPCODE_BINARY else payload
            # Ping (answered inside recv_data) or pong: not traffic for the keepalive timer.

    def send_text(self, text: str) -> None:
        """Send one text frame from the reading thread (bounded by the last `recv` timeout,
        at least 1 s); raises WsClosed when the connection is gone."""
        ws = self._ws
        if ws is None:
            raise WsClosed(None, "not connected")
        try:
            ws.settimeout(max(1.0, ws.gettimeout() or 0.0))
            ws.send(text)
        except (OSError, AttributeError, websocket.WebSocketException) as exc:
            raise WsClosed(None, f"send failed: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        """Close politely (a close frame, no wait for the answer), then drop the socket."""
        with self._lock:
            ws, self._ws = self._ws, None
            self._aborted = True
        if ws is None:
            return
        try:
            ws.settimeout(0.5)
            ws.send_close(websocket.STATUS_NORMAL)
        except (OSError, websocket.WebSocketException):
            pass  # already gone: nothing to be polite to
        self._shutdown(ws.sock)
        ws.shutdown()  # type: ignore[no-untyped-call]

    def abort(self) -> None:
        """From any thread: shut the socket down so a blocked `recv` returns at once."""
        with self._lock:
            self._aborted = True
            sock = self._sock
        self._shutdown(sock)

    @staticmethod
    def _shutdown(sock: socket.socket | None) -> None:
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more
