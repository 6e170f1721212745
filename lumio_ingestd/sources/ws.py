"""One WebSocket client connection, shared by every platform's socket source.

Built on websocket-client's blocking API, which starts no thread of its own,
for the handshake and for sending; frames are read by a small reader of our
own (`_FrameReader`): websocket-client reads each frame with two or three
`recv` calls and its `recv_data` gives no way to read ahead, so under load
every frame cost several syscalls, each handing the interpreter lock away.
The reader keeps the socket non-blocking: a read while data flows is one
`recv` (no `poll` before it, no `settimeout` as a deadline nears); only a read
that finds nothing waits in `poll`, bounded by the caller's deadline.
The source's thread reads, and pings are answered with pongs inside `recv`
(Twitch closes with 4002 otherwise; pings do not count as traffic for the
keepalive timer, so `recv` reports only data frames). `send_text` is for
protocols that talk back (Pusher, Astro, 7TV); EventSub closes the socket
with 4001 on any inbound data, so the Twitch source never calls it.

Two ways to stop a reader from another thread. `wake()` (a graceful stop)
leaves the socket whole: it writes to a pipe the reader's `poll` also
watches, so a waiting `recv` returns None at once and every later one
returns None as soon as nothing is left to read without waiting. The owner's
thread then calls `drain()`: it sends our close frame and reads on until the
peer's close frame answers it (bounded by a time and a frame budget), so
everything the peer sent before it saw our close, whether in our buffer, in
the kernel's receive queue or still on the wire, is handed to the caller
before `close()` drops the socket. `abort()` (the hard path: a dead
connection, a stop that overran its bound) shuts the TCP socket down, which
wakes a `recv` blocked in another thread; what was unread is lost. Text is
handed back as bytes and decoded by the caller, so that invalid UTF-8 is one
refused frame instead of a broken connection. Nothing durable here.
"""

from __future__ import annotations

import functools
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator

import websocket

MAX_MESSAGE_BYTES = 1024 * 1024
#: How long a send (a protocol's message, a pong) may wait for the socket.
SEND_TIMEOUT_SECS = 1.0
#: A frame (or a fragmented message) declaring this many bytes or more ends the
#: connection with 1009 instead of being read: no platform sends anything near it.
MAX_FRAME_BYTES = 16 * 1024 * 1024

_OP_CONT, _OP_TEXT, _OP_BINARY = 0x0, 0x1, 0x2
_OP_CLOSE, _OP_PING, _OP_PONG = 0x8, 0x9, 0xA
_READ_SIZE = 256 * 1024
# A read that finds nothing waits at most this long at a time.
_READ_QUANTUM = 0.5
# What a non-blocking read says when there is nothing to read yet (TLS: no
# whole record yet; WantWrite: the TLS layer must write first, rare).
_NOTHING_YET = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
#: A graceful stop's drain: how long it reads after our close frame, and how many
#: data messages it hands over at most (a flood must not hold up the stop).
DRAIN_SECS = 1.0
DRAIN_MAX_FRAMES = 10_000


class _FrameReader:
    """Server-to-client WebSocket frames (RFC 6455) from a buffer filled by large reads.

    Owned by the one thread that reads the connection: no lock. Handles
    fragmented messages, control frames between their fragments, and frames
    split across reads; refuses reserved bits, bad opcodes and oversized frames
    (WsClosed with 1002 or 1009).
    """

    def __init__(self, sock: socket.socket, wake_fd: int | None = None) -> None:
        self._sock = sock
        #: Readable once a graceful stop was asked for (`WsConnection.wake`); None: not watched.
        self.wake_fd = wake_fd
        self.woken = False
        self._buf = bytearray()
        self._pos = 0
        self._timeout: float | None = None  # what this reader last set; None: unknown
        self._poll: select.poll | None = None
        # A fragmented message being assembled: its opcode, its parts and their size.
        self._opcode: int | None = None
        self._parts: list[bytes] = []
        self._size = 0

    def timeout_changed(self) -> None:
        """Someone else set the socket's timeout (a send): set ours again before reading."""
        self._timeout = None

    def message(self, deadline: float) -> tuple[int, bytes] | None:
        """The next control frame or whole data message, or None at `deadline`.

        What is already buffered is returned without a read; otherwise at least
        one read is tried, even past the deadline. Once woken (a graceful stop),
        it returns None as soon as a read finds nothing, whatever the deadline.
        """
        first = True
        while True:
            frame = self._frame()
            if frame is None:
                left = deadline - time.monotonic()
                if (left <= 0 or self.woken) and not first:
                    return None
                first = False
                self._fill(left)
                continue
            fin, opcode, payload = frame
            if opcode >= _OP_CLOSE:
                return opcode, payload
            if opcode == _OP_CONT:
                if self._opcode is None:
                    raise WsClosed(1002, "protocol error: continuation frame without a start")
                self._add(payload)
                if not fin:
                    continue
                opcode, self._opcode = self._opcode, None
                data = b"".join(self._parts)
                self._parts, self._size = [], 0
                return opcode, data
            if self._opcode is not None:
                raise WsClosed(1002, "protocol error: a new message inside a fragmented one")
            if fin:
                return opcode, payload[:MAX_MESSAGE_BYTES + 1]
            self._opcode = opcode
            self._add(payload)

    def _add(self, payload: bytes) -> None:
        self._size += len(payload)
        if self._size >= MAX_FRAME_BYTES:
            raise WsClosed(1009, f"message of {self._size} bytes or more refused")
        kept = sum(len(p) for p in self._parts)
        if kept <= MAX_MESSAGE_BYTES:  # keep only what shows it is too large
            self._parts.append(payload[:MAX_MESSAGE_BYTES + 1 - kept])

    def _frame(self) -> tuple[bool, int, bytes] | None:
        """One whole frame from the buffer, or None when it is not all there yet."""
        buf, pos = self._buf, self._pos
        have = len(buf) - pos
        if have < 2:
            return None
        b0, b1 = buf[pos], buf[pos + 1]
        if b0 & 0x70:
            raise WsClosed(1002, "protocol error: reserved bits set (no extension agreed)")
        opcode = b0 & 0x0F
        if opcode not in (_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG):
            raise WsClosed(1002, f"protocol error: unknown opcode {opcode:#x}")
        length = b1 & 0x7F
        head = 2
        if length == 126:
            if have < 4:
                return None
            length = int.from_bytes(buf[pos + 2:pos + 4], "big")
            head = 4
        elif length == 127:
            if have < 10:
                return None
            length = int.from_bytes(buf[pos + 2:pos + 10], "big")
            head = 10
        if opcode >= _OP_CLOSE and (length > 125 or not b0 & 0x80):
            raise WsClosed(1002, "protocol error: a control frame too long or fragmented")
        if length >= MAX_FRAME_BYTES:
            raise WsClosed(1009, f"frame of {length} bytes refused")
        mask = b""
        if b1 & 0x80:  # servers must not mask; accepted as websocket-client does
            if have < head + 4:
                return None
            mask = bytes(buf[pos + head:pos + head + 4])
            head += 4
        if have < head + length:
            return None
        start = pos + head
        payload = bytes(buf[start:start + length])
        self._pos = start + length
        if mask:
            payload = _unmask(payload, mask)
        return bool(b0 & 0x80), opcode, payload

    def _fill(self, left: float) -> None:
        """One read into the buffer; returns without data once `left` seconds passed."""
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        if self._timeout != 0.0:  # the first read, or a send set a timeout of its own
            self._sock.settimeout(0.0)
            self._timeout = 0.0
        try:
            try:
                data = self._sock.recv(_READ_SIZE)
            except _NOTHING_YET as exc:
                # A TLS socket may hold decrypted bytes the kernel does not
                # know of: that is why the read comes first and the wait second.
                want = select.POLLOUT if isinstance(exc, ssl.SSLWantWriteError) else select.POLLIN
                if not self._wait(want, min(max(0.001, left), _READ_QUANTUM)):
                    return
                data = self._sock.recv(_READ_SIZE)
        except _NOTHING_YET:
            return  # woken without data (a TLS record not yet whole): the caller reads again
        except OSError as exc:
            raise WsClosed(None, f"{type(exc).__name__}: {exc}") from None
        if not data:
            raise WsClosed(None, "connection closed without a close frame")
        self._buf += data

    def _wait(self, events: int, seconds: float) -> bool:
        """Whether the socket became ready (or broke: the next read says how) within `seconds`."""
        if self._poll is None:
            self._poll = select.poll()
            if self.wake_fd is not None:
                self._poll.register(self.wake_fd, select.POLLIN)
        self._poll.register(self._sock, events)  # (again: sets the events)
        ready = self._poll.poll(seconds * 1000.0)
        if self.wake_fd is not None and any(fd == self.wake_fd for fd, _ in ready):
            # The pipe stays readable: every later wait returns at once too.
            self.woken = True
            return any(fd != self.wake_fd for fd, _ in ready)
        return bool(ready)

    def unwatch_wake(self) -> None:
        """Wait for the socket only from now on (the drain after a graceful stop waits for the
        peer's close frame)."""
        if self._poll is not None and self.wake_fd is not None:
            self._poll.unregister(self.wake_fd)
        self.wake_fd = None
        self.woken = False


def _unmask(payload: bytes, mask: bytes) -> bytes:
    n = len(payload)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")


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
        self._reader: _FrameReader | None = None
        self._lock = threading.Lock()
        self._aborted = False
        self._woken = False
        self._close_sent = False
        # The self-pipe `wake()` writes to and the reader's poll watches: a socket pair, so a
        # connection dropped without `close()` (after an abort) still frees it when collected;
        # `close()` closes it under the lock, so a wake from another thread never meets a reused fd.
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
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
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_w.setblocking(False)
            if self._woken:  # wake() raced with the connect
                self._wake_w.send(b"w")
            # The handshake reads its response line by line, so nothing of the
            # first frames is left in websocket-client's buffers.
            self._reader = _FrameReader(ws.sock, self._wake_r.fileno()) if ws.sock is not None else None
        self.last_frame = self.last_seen = time.monotonic()

    def recv(self, timeout: float) -> bytes | None:
        """One data message's payload, or None when `timeout` passed first (or only control
        frames came). Raises WsClosed when the connection ends.

        Frames are parsed from a buffer that large reads fill (`_FrameReader`):
        a burst of frames costs one read, not three syscalls each. A message
        longer than MAX_MESSAGE_BYTES comes back cut to MAX_MESSAGE_BYTES + 1
        bytes (the caller refuses it as too large; the connection stays); a frame
        or message of MAX_FRAME_BYTES or more ends the connection (1009).
        """
        ws, reader = self._ws, self._reader
        if ws is None or reader is None:
            raise WsClosed(None, "not connected")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            frame = reader.message(deadline)
            if frame is None:
                return None
            opcode, data = frame
            self.last_seen = time.monotonic()
            if opcode == _OP_CLOSE:
                code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None
                raise WsClosed(code, bytes(data[2:]).decode("utf-8", "replace"))
            if opcode == _OP_PING:
                self._send("pong", functools.partial(ws.pong, data))
                continue
            if opcode == _OP_PONG:
                continue  # not traffic for the keepalive timer
            self.last_frame = time.monotonic()
            return Binary(data) if opcode == _OP_BINARY else data

    def send_text(self, text: str) -> None:
        """Send one text frame from the reading thread (bounded to SEND_TIMEOUT_SECS); raises
        WsClosed when the connection is gone."""
        ws = self._ws
        if ws is None:
            raise WsClosed(None, "not connected")
        if self._close_sent:
            raise WsClosed(None, "closing: our close frame went out")
        self._send("send", functools.partial(ws.send, text))

    def _send(self, what: str, send: Callable[[], object]) -> None:
        """A send on the reader's (non-blocking) socket, with a timeout of its own meanwhile."""
        ws = self._ws
        try:
            if ws is None:
                raise WsClosed(None, "not connected")
            ws.settimeout(SEND_TIMEOUT_SECS)
            send()
        except (OSError, AttributeError, websocket.WebSocketException) as exc:
            raise WsClosed(None, f"{what} failed: {type(exc).__name__}: {exc}") from None
        finally:
            if self._reader is not None:
                self._reader.timeout_changed()

    def wake(self) -> None:
        """From any thread, for a graceful stop: make the reader's `recv` return None as soon
        as nothing is left to read without waiting. The socket stays whole for `drain()`."""
        with self._lock:
            self._woken = True
            if self._wake_w is not None:
                try:
                    self._wake_w.send(b"w")
                except OSError:
                    pass  # full: it is readable already

    @property
    def woken(self) -> bool:
        return self._woken

    def drain(self, max_secs: float = DRAIN_SECS, max_frames: int = DRAIN_MAX_FRAMES) -> Iterator[bytes]:
        """On the owner's thread, after a graceful stop: the data messages the peer sent before
        it saw our close frame.

        Sends our close frame first, then reads until the peer's close frame
        answers it (TCP keeps the order: whatever the peer sent before it
        comes first), the connection ends, `max_secs` passed or `max_frames`
        messages were handed over. Never raises; `close()` is still the
        caller's to call. Nothing after an `abort()`: that is the hard path.
        """
        ws, reader = self._ws, self._reader
        if ws is None or reader is None or self._aborted:
            return
        deadline = time.monotonic() + max(0.0, max_secs)
        reader.unwatch_wake()
        try:
            self._send("close", functools.partial(ws.send_close, websocket.STATUS_NORMAL))
            self._close_sent = True
        except WsClosed:
            deadline = 0.0  # cannot send: still hand over what is already here
        for _ in range(max_frames):
            try:
                frame = reader.message(deadline)
            except WsClosed:
                return
            if frame is None or frame[0] == _OP_CLOSE:
                return
            opcode, data = frame
            if opcode in (_OP_PING, _OP_PONG):
                continue  # the connection is closing: no pong owed
            self.last_frame = self.last_seen = time.monotonic()
            yield Binary(data) if opcode == _OP_BINARY else data

    def close(self) -> None:
        """Close politely (a close frame unless `drain()` sent it, no wait for the answer), then
        drop the socket."""
        with self._lock:
            ws, self._ws = self._ws, None
            self._aborted = True
            wake_fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), None, None
        for end in wake_fds:
            if end is not None:
                end.close()
        if ws is None:
            return
        if not self._close_sent:
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
