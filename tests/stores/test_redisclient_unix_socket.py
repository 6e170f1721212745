"""`[redis] url = unix:///path/redis.sock`: the daemon starts, ingests and stops over a Unix socket.

redis-py's Unix-socket connection takes no TCP options (`socket_keepalive` is
a TypeError there), so the client passes them to TCP connections only. The
test runs the real daemon as a process against a private redis-server that
listens on a Unix socket, with the synthetic chat source: READY=1, every
message stored once, exit 0 on SIGTERM.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.config import load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.stores.redisclient import connect
from support import dbname_of, write_ini
from support.daemon import Daemon, NotifySocket, assert_exactly_once, wait_stored
from support.harness import PostgresServer, RedisServer
from support.harness.servers import wait_until


@pytest.fixture
def unix_redis(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "unix_redis", unixsocket=True) as server:
        yield server


def _config(tmp_path: Path, redis_url: str, pg_url: str, **synthetic: object) -> Path:
    sections: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": tmp_path / "state", "instance_id": "unix-1"},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "chat": {"flush_interval_secs": 0.3},
        "events": {"retry_interval_secs": 0.5},
    }
    if synthetic:
        sections["synthetic"] = dict(synthetic)
    return write_ini(tmp_path / "unix.ini", sections)


def _stored(dsn: str) -> int:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM chat_messages")
        row = cur.fetchone()
    conn.close()
    return int(row[0]) if row else 0


def test_the_client_talks_over_a_unix_socket(tmp_path: Path, unix_redis: RedisServer) -> None:
    cfg = load(str(_config(tmp_path, unix_redis.unix_url, "postgresql://x@127.0.0.1:1/x")), {})
    client = connect(cfg.redis)
    try:
        assert client.ping()
        client.set("k", b"v")
        assert client.get("k") == b"v"
    finally:
        client.close()


def test_the_daemon_ingests_over_a_unix_socket(tmp_path: Path, unix_redis: RedisServer,
                                               pg_server: PostgresServer, pg_dsn: str) -> None:
    pg_url = pg_server.url(dbname_of(pg_dsn))
    path = _config(tmp_path, unix_redis.unix_url, pg_url,
                   rate_per_sec=100, accounts="1, 2", event_every=5, run_id="unix")
    migrate(load(str(path), {}).timescale)
    with NotifySocket() as notify, Daemon(path, tmp_path / "daemon.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        # Chat goes all the way through Redis (the socket) into the database while it runs.
        assert wait_until(lambda: _stored(pg_dsn) >= 100, 20), daemon.log
        sent = daemon.signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 5, after=sent)
        assert daemon.wait(10) == 0, daemon.log
    totals = daemon.synthetic_totals()
    assert_exactly_once(wait_stored(pg_dsn, totals, 20), totals)
    assert "internal error" not in daemon.log
