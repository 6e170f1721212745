"""The daemon's Redis client writes each command (or pipeline) to the socket in one piece.

Against a real redis-server. The count of writes is taken on the connection's
own socket, wrapped (not replaced) so every byte still reaches the server.
"""

from __future__ import annotations

import enum
import socket
from typing import Any

import pytest
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError
from redis.utils import HIREDIS_AVAILABLE

from lumio_ingestd.config import RedisConfig
from lumio_ingestd.stores.redisclient import OneWriteConnection, RespPacker, _connection_class, connect


class _CountingSocket:
    """A socket whose `sendall` calls are counted; everything else is the socket's."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.writes = 0

    def sendall(self, data: Any) -> None:
        self.writes += 1
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_a_hand_over_sized_pipeline_is_one_write_and_arrives_whole(redis_url: str) -> None:
    client = connect(RedisConfig(url=redis_url))
    try:
        client.ping()  # a connection in the pool
        conn = client.connection_pool.get_connection()
        assert isinstance(conn, OneWriteConnection)
        sock = conn._sock
        assert sock is not None
        counting = _CountingSocket(sock)
        conn._sock = counting
        client.connection_pool.release(conn)

        entries = [b'{"v":2,"text":"%d %s"}' % (i, b"x" * 300) for i in range(200)]  # ~64 KB
        pipe = client.pipeline(transaction=False)
        pipe.delete("one-write")
        pipe.rpush("one-write", *entries)
        assert pipe.execute() == [0, 200]
        # redis-py alone would have cut this into about twenty 6 KB writes.
        assert counting.writes == 1
        assert client.lrange("one-write", 0, -1) == entries
    finally:
        client.delete("one-write")
        client.close()


def test_every_url_scheme_gets_the_one_write_variant_of_its_class() -> None:
    assert issubclass(_connection_class("redis://127.0.0.1:6379/0"), OneWriteConnection)
    tls = _connection_class("rediss://127.0.0.1:6380/0")
    assert issubclass(tls, OneWriteConnection) and issubclass(tls, SSLConnection)
    unix = _connection_class("unix:///run/redis.sock")
    assert issubclass(unix, OneWriteConnection) and issubclass(unix, UnixDomainSocketConnection)


class _Level(enum.IntEnum):
    HIGH = 3


class _Text(str):
    pass


_AWKWARD: list[tuple[Any, ...]] = [
    ("RPUSH", b"lumio:chat:buffer:{1}", b""),  # an empty entry
    ("RPUSH", "k\u00e9y", "gr\u00fc\u00dfe \U0001f600", "", "a b\r\nc"),  # non-ASCII, CRLF inside
    ("SET", b"k", 0, -1, 2**70, 1.5, -0.0, 1e-5, float("inf")),  # ints, floats as redis-py writes them
    ("RPUSH", b"big", b"x" * 100_000, b"y" * 6001, "z" * 7000),  # past redis-py's 6 KB cutoff
    ("CONFIG GET", "maxmemory-policy"),  # literal arguments in the name
    ("CLIENT\tLIST",),
    ("",),
    (b"RPUSH", b"k", b"v"),  # a bytes name
    (b"CONFIG GET", b"x"),
    ("RPUSH", b"k", memoryview(b"view"), bytearray(b"array")),  # redis-py's packer decides these
    ("SET", b"k", _Level.HIGH),  # an int subclass: redis-py writes its repr
    ("SET", b"k", _Text("sub")),
]


def _python_packer() -> PythonRespSerializer:
    return PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("args", _AWKWARD)
def test_the_packer_writes_exactly_what_redis_py_writes(args: tuple[Any, ...]) -> None:
    fast = RespPacker(_python_packer(), "utf-8", "strict")
    assert b"".join(fast.pack(*args)) == b"".join(_python_packer().pack(*args))  # type: ignore[no-untyped-call]


def test_the_packer_refuses_what_redis_py_refuses() -> None:
    fast = RespPacker(_python_packer(), "utf-8", "strict")
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            _python_packer().pack("SET", b"k", bad)  # type: ignore[no-untyped-call]
        with pytest.raises(DataError):
            fast.pack("SET", b"k", bad)
    with pytest.raises(UnicodeEncodeError):
        fast.pack("SET", b"k", "lone \ud800")


def test_the_daemon_client_packs_with_it_and_the_server_reads_it_back(redis_url: str) -> None:
    client = connect(RedisConfig(url=redis_url))
    try:
        conn = client.connection_pool.get_connection()
        assert HIREDIS_AVAILABLE or isinstance(conn._command_packer, RespPacker)
        client.connection_pool.release(conn)
        values = [b"", "gr\u00fc\u00dfe \U0001f600".encode(), b"x" * 100_000, b"a b\r\nc"]
        pipe = client.pipeline(transaction=False)
        pipe.delete("packed")
        pipe.rpush("packed", *values)
        pipe.rpush("packed", "gr\u00fc\u00dfe", 7, 1.5)
        assert pipe.execute() == [0, 4, 7]
        assert client.lrange("packed", 0, -1) == [*values, "gr\u00fc\u00dfe".encode(), b"7", b"1.5"]
    finally:
        client.delete("packed")
        client.close()
