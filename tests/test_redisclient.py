"""The daemon's Redis client writes each command (or pipeline) to the socket in one piece.

Against a real redis-server. The count of writes is taken on the connection's
own socket, wrapped (not replaced) so every byte still reaches the server.
"""

from __future__ import annotations

import socket
from typing import Any

from redis.connection import SSLConnection, UnixDomainSocketConnection

from lumio_ingestd.config import RedisConfig
from lumio_ingestd.redisclient import OneWriteConnection, _connection_class, connect


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
