"""The WebSocket frame reader every platform socket reads through (sources/ws.py).

Frames are written by hand onto real sockets (a socketpair, and a loopback
server that does the opening handshake) so each case is exact: fragments,
control frames between them, a frame split across reads, oversized frames.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.sources.ws import (
    MAX_FRAME_BYTES,
    MAX_MESSAGE_BYTES,
    WsClosed,
    WsConnection,
    _FrameReader,
)

TEXT, BINARY, CONT, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes, *, fin: bool = True, declared: int | None = None) -> bytes:
    """A server frame (unmasked); `declared` lies about the length."""
    n = len(payload) if declared is None else declared
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, _FrameReader]]:
    ours, theirs = socket.socketpair()
    try:
        yield theirs, _FrameReader(ours)
    finally:
        ours.close()
        theirs.close()


def _next(reader: _FrameReader, within: float = 2.0) -> tuple[int, bytes] | None:
    return reader.message(time.monotonic() + within)


def test_a_burst_of_frames_in_one_read_comes_out_in_order(
        pair: tuple[socket.socket, _FrameReader]) -> None:
    peer, reader = pair
    payloads = [f'{{"n":{i}}}'.encode() * (i % 50 + 1) for i in range(500)]
    peer.sendall(b"".join(frame(TEXT, p) for p in payloads) + frame(BINARY, b"\x00\x01"))
    assert [_next(reader) for _ in payloads] == [(TEXT, p) for p in payloads]
    assert _next(reader) == (BINARY, b"\x00\x01")


def test_a_frame_split_across_reads_is_put_together(
        pair: tuple[socket.socket, _FrameReader]) -> None:
    peer, reader = pair
    big = os.urandom(70_000)  # a 64-bit length header
    data = frame(TEXT, b"small") + frame(BINARY, big)
    for cut in (1, 3, 7, 11, len(data) - 1):  # inside each header kind and the payload
        peer.sendall(data[:cut])
        got = []
        while (item := reader.message(time.monotonic() + 0.05)) is not None:
            got.append(item)
        peer.sendall(data[cut:])
        while len(got) < 2:
            item = _next(reader)
            assert item is not None
            got.append(item)
        assert got == [(TEXT, b"small"), (BINARY, big)]


def test_fragments_with_control_frames_between_them_make_one_message(
        pair: tuple[socket.socket, _FrameReader]) -> None:
    peer, reader = pair
    peer.sendall(frame(TEXT, b'{"a":', fin=False) + frame(PING, b"p1")
                 + frame(CONT, b'"b",', fin=False) + frame(PONG, b"")
                 + frame(CONT, b'"c":1}') + frame(TEXT, b"next"))
    assert _next(reader) == (PING, b"p1")
    assert _next(reader) == (PONG, b"")
    assert _next(reader) == (TEXT, b'{"a":"b","c":1}')
    assert _next(reader) == (TEXT, b"next")


def test_an_oversized_message_is_cut_and_the_connection_goes_on(
        pair: tuple[socket.socket, _FrameReader]) -> None:
    peer, reader = pair
    big = b"x" * (MAX_MESSAGE_BYTES + 5000)
    sender = threading.Thread(target=peer.sendall, args=(
        frame(TEXT, big) + frame(TEXT, big[:600_000], fin=False)
        + frame(CONT, big[600_000:]) + frame(TEXT, b"after"),), name="test-ws-sender")
    sender.start()
    try:
        for _ in range(2):  # one frame, then the same size in two fragments
            item = _next(reader, 10)
            assert item is not None and item[0] == TEXT
            assert len(item[1]) == MAX_MESSAGE_BYTES + 1  # the caller refuses it as too large
        assert _next(reader) == (TEXT, b"after")
    finally:
        sender.join(10)


def test_a_16_mib_frame_is_refused_unread(pair: tuple[socket.socket, _FrameReader]) -> None:
    peer, reader = pair
    peer.sendall(frame(TEXT, b"", declared=MAX_FRAME_BYTES))
    with pytest.raises(WsClosed) as info:
        _next(reader)
    assert info.value.code == 1009


def test_a_fragmented_message_reaching_16_mib_is_refused(
        pair: tuple[socket.socket, _FrameReader]) -> None:
    peer, reader = pair
    chunk = b"y" * (4 * 1024 * 1024)
    def send() -> None:
        try:
            for i in range(4):
                peer.sendall(frame(TEXT if i == 0 else CONT, chunk, fin=False))
        except OSError:
            pass  # the reader gave up first

    sender = threading.Thread(target=send, name="test-ws-sender")
    sender.start()
    try:
        with pytest.raises(WsClosed) as info:
            _next(reader, 10)
        assert info.value.code == 1009
    finally:
        peer.close()
        sender.join(10)


@pytest.mark.parametrize("data,why", [
    (bytes([0x80 | 0x40 | TEXT, 1]) + b"x", "reserved bits"),
    (bytes([0x80 | 0x3, 0]), "unknown opcode"),
    (frame(CONT, b"x"), "continuation frame without a start"),
    (frame(TEXT, b"a", fin=False) + frame(TEXT, b"b"), "a new message inside"),
    (frame(PING, b"x" * 126), "control frame"),
], ids=["rsv", "opcode", "orphan-continuation", "interleaved-message", "long-ping"])
def test_protocol_errors_end_the_connection_with_1002(
        pair: tuple[socket.socket, _FrameReader], data: bytes, why: str) -> None:
    peer, reader = pair
    peer.sendall(data)
    with pytest.raises(WsClosed) as info:
        _next(reader)
    assert info.value.code == 1002 and why in str(info.value)


def test_a_quiet_connection_times_out_and_a_closed_one_says_so(
        pair: tuple[socket.socket, _FrameReader]) -> None:
    peer, reader = pair
    started = time.monotonic()
    assert reader.message(time.monotonic() + 0.2) is None
    assert 0.15 <= time.monotonic() - started < 2.0
    peer.close()
    with pytest.raises(WsClosed, match="without a close frame"):
        _next(reader)


# -- over TLS, as every platform's socket is -------------------------------------------------
# The reader's socket is non-blocking: a TLS socket can hold decrypted bytes the
# kernel no longer shows as readable, and a record can arrive in pieces.


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_pair(tls_cert: tuple[Path, Path]) -> Iterator[tuple[ssl.SSLSocket, _FrameReader]]:
    cert, key = tls_cert
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    accepted: list[ssl.SSLSocket] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(5)

        def accept() -> None:
            conn, _ = listener.accept()
            accepted.append(server_ctx.wrap_socket(conn, server_side=True))

        thread = threading.Thread(target=accept, name="test-tls-accept")
        thread.start()
        client = client_ctx.wrap_socket(socket.create_connection(listener.getsockname(), timeout=5),
                                        server_hostname="127.0.0.1")
        thread.join(5)
    try:
        yield accepted[0], _FrameReader(client)
    finally:
        client.close()
        accepted[0].close()


def test_over_tls_a_burst_of_many_records_comes_out_whole_and_in_order(
        tls_pair: tuple[ssl.SSLSocket, _FrameReader]) -> None:
    peer, reader = tls_pair
    payloads = [f"message {i} ".encode() * (1 + i % 40) for i in range(3000)]
    sender = threading.Thread(target=peer.sendall, args=(b"".join(frame(TEXT, p) for p in payloads),),
                              name="test-tls-send")
    sender.start()  # ~1.5 MB: about a hundred TLS records, more than the socket buffers hold
    try:
        assert [_next(reader) for _ in payloads] == [(TEXT, p) for p in payloads]
    finally:
        sender.join(10)


def test_over_tls_a_frame_split_across_records_waits_for_its_rest(
        tls_pair: tuple[ssl.SSLSocket, _FrameReader]) -> None:
    peer, reader = tls_pair
    whole = frame(TEXT, b"x" * 50_000)
    peer.sendall(whole[:30_000])
    assert reader.message(time.monotonic() + 0.2) is None  # read what came, not a frame yet
    peer.sendall(whole[30_000:] + frame(TEXT, b"next"))
    assert _next(reader) == (TEXT, b"x" * 50_000)
    assert _next(reader) == (TEXT, b"next")


def test_over_tls_a_quiet_connection_times_out_and_a_closed_one_says_so(
        tls_pair: tuple[ssl.SSLSocket, _FrameReader]) -> None:
    peer, reader = tls_pair
    started = time.monotonic()
    assert reader.message(time.monotonic() + 0.2) is None
    assert 0.15 <= time.monotonic() - started < 2.0
    peer.sendall(frame(TEXT, b"late"))
    assert _next(reader) == (TEXT, b"late")
    peer.close()
    with pytest.raises(WsClosed):
        _next(reader)


# -- through WsConnection, after a real opening handshake --------------------------------


class _Server:
    """A loopback WebSocket server that writes a script of raw frames and records what it
    gets back (the client's frames, unmasked)."""

    def __init__(self, script: bytes) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._script = script
        self.received = bytearray()
        self.got_pong = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="test-ws-server")
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            conn.settimeout(5)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                       if line.lower().startswith(b"sec-websocket-key"))
            accept = base64.b64encode(hashlib.sha1(
                key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
                         + self._script)
            while not self.got_pong.is_set():
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                self.received += data
                if any(op == PONG for op, _ in _client_frames(bytes(self.received))):
                    self.got_pong.set()

    def close(self) -> None:
        self._listener.close()
        self._thread.join(5)


def _client_frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    while len(data) >= 6:
        opcode, n = data[0] & 0x0F, data[1] & 0x7F
        mask, body = data[2:6], data[6:6 + n]
        if len(body) < n:
            break
        out.append((opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(body))))
        data = data[6 + n:]
    return out


def test_a_ping_between_fragments_is_answered_and_the_message_arrives_whole() -> None:
    server = _Server(frame(TEXT, b"hel", fin=False) + frame(PING, b"are you there")
                     + frame(CONT, b"lo") + frame(CLOSE, struct.pack("!H", 4000) + b"bye"))
    conn = WsConnection(f"ws://127.0.0.1:{server.port}/", connect_timeout=5)
    try:
        conn.open()
        assert conn.recv(5) == b"hello"
        with pytest.raises(WsClosed) as info:
            conn.recv(5)
        assert (info.value.code, info.value.reason) == (4000, "bye")
        assert server.got_pong.wait(5)
        assert _client_frames(bytes(server.received))[0] == (PONG, b"are you there")
    finally:
        conn.abort()
        server.close()


def test_a_send_between_reads_does_not_stretch_the_read_timeout() -> None:
    """send_text sets the socket's timeout to at least 1 s; the next recv must still end
    at its own, shorter deadline."""
    server = _Server(frame(TEXT, b"hi"))
    conn = WsConnection(f"ws://127.0.0.1:{server.port}/", connect_timeout=10)
    try:
        conn.open()
        assert conn.recv(5) == b"hi"
        conn.send_text("ping")  # the socket's timeout is now 10 s
        started = time.monotonic()
        assert conn.recv(0.6) is None
        assert time.monotonic() - started < 3.0
    finally:
        conn.abort()
        server.close()
