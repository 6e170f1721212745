"""`[redis] sentinels`: the daemon on a private Sentinel setup (a primary, two replicas,
three Sentinels), with `min_replicas_acked = 1`.

- The primary SIGKILLed under load, once while its replicas lag (their links
  cut a second before) and once plainly; the Sentinels promote a replica and
  the same process follows it, without a restart: every message and event is
  stored exactly once, and `status` names the new primary.
- The replicas stopped (SIGSTOP) for seconds: WAIT cannot confirm, so chat
  goes straight to the database and, with the database down too, chat and
  events go to the spool; nothing is lost and the fallbacks are counted.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.admin.status import collect
from lumio_ingestd.config import load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.stores.redisclient import connect
from support import write_ini
from support.daemon import (
    Daemon,
    NotifySocket,
    SyntheticTotals,
    assert_exactly_once,
    metric_value,
    wait_stored,
)
from support.harness import PostgresServer
from support.harness.sentinel import RedisSentinelServers
from support.harness.servers import wait_until

SHUTDOWN_BUDGET = 8.0
ACCOUNTS = "1, 2, 3, 4, 5, 6"


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelServers]:
    with RedisSentinelServers(tmp_path_factory.mktemp("redis_sentinel")) as servers:
        yield servers


def _config(tmp_path: Path, name: str, servers: RedisSentinelServers, pg_url: str, *,
            synthetic: dict[str, object] | None = None) -> Path:
    sections: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": tmp_path / "state", "instance_id": "sn-1",
                   "accounts_dir": tmp_path / "none"},
        # The URL's host and port are never used: the Sentinels name the primary.
        "redis": {"url": "redis://unused.invalid:1/0", "sentinels": servers.addresses,
                  "min_replicas_acked": 1, "replica_ack_timeout_ms": 300},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "chat": {"flush_interval_secs": 0.3, "deadletter_drain_interval_secs": 0.5},
        "events": {"retry_interval_secs": 0.5, "insert_timeout_secs": 1},
    }
    if synthetic:
        sections["synthetic"] = dict(synthetic)
    path = write_ini(tmp_path / f"{name}.ini", sections)
    migrate(load(str(path), {}).timescale)
    return path


def _count(pg_url: str) -> int:
    try:
        with psycopg2.connect(pg_url, connect_timeout=2) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM chat_messages")
            row = cur.fetchone()
        conn.close()
        return int(row[0]) if row else 0
    except psycopg2.Error:
        return -1


def _grows(pg_url: str, rows: int, timeout: float) -> bool:
    before = _count(pg_url)
    return wait_until(lambda: _count(pg_url) > before + rows, timeout)


def _drain(tmp_path: Path, servers: RedisSentinelServers, pg_url: str,
           totals: SyntheticTotals) -> tuple[dict[str, int], dict[str, int]]:
    """A second run without the source, with the first one's instance id: stores what it left."""
    cfg = _config(tmp_path, "drain", servers, pg_url)
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "drain.log", notify=notify) as second:
        notify.wait_for("READY=1", 20)
        stored = wait_stored(pg_url, totals, 40, alive=lambda: second.proc.poll() is None)
        second.signal(signal.SIGTERM)
        assert second.wait(SHUTDOWN_BUDGET + 1) == 0, second.log
    return stored


def test_a_primary_killed_under_sentinel_loses_nothing_and_status_names_the_new_one(
        tmp_path: Path, sentinel: RedisSentinelServers, private_pg: PostgresServer) -> None:
    private_pg.create_database("lumio")
    pg_url = private_pg.url("lumio")
    cfg = _config(tmp_path, "sn", sentinel, pg_url,
                  synthetic={"rate_per_sec": 300, "accounts": ACCOUNTS, "event_every": 4, "run_id": "sn"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "sn.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        assert wait_until(lambda: _count(pg_url) > 100, 20), daemon.log
        for lag in (1.0, 0.0):
            victim = sentinel.kill_primary(lag_secs=lag)
            assert _grows(pg_url, 150, 30), daemon.log  # the same process follows the new primary
            victim.start()  # the Sentinels make it a replica of the new primary
            assert wait_until(sentinel.synced, 30)
        primary = sentinel.primary()
        doc = collect(load(str(cfg), {}), connect_redis=lambda: connect(load(str(cfg), {}).redis))
        assert doc["redis"]["ok"] and f"127.0.0.1:{primary.port}" in doc["redis"]["primary"], doc
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(SHUTDOWN_BUDGET + 1) == 0, daemon.log
    assert len([n for n in notify.notices if n.has("READY=1")]) == 1  # never restarted
    totals = daemon.synthetic_totals()
    assert_exactly_once(_drain(tmp_path, sentinel, pg_url, totals), totals)
    assert "LOST" not in daemon.log


def test_replicas_that_cannot_confirm_send_chat_and_events_to_the_next_tier(
        tmp_path: Path, sentinel: RedisSentinelServers, private_pg: PostgresServer) -> None:
    private_pg.create_database("lumio")
    pg_url = private_pg.url("lumio")
    cfg = _config(tmp_path, "wt", sentinel, pg_url,
                  synthetic={"rate_per_sec": 300, "accounts": ACCOUNTS, "event_every": 4, "run_id": "wt"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "wt.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        _, port = daemon.ports()
        assert wait_until(lambda: _count(pg_url) > 100, 20), daemon.log
        direct = metric_value(port, "chat_messages_total", 'path="direct"')
        replicas = sentinel.replicas()
        # The database up: chat the replicas cannot confirm is inserted directly.
        for replica in replicas:
            replica.pause()
        assert _grows(pg_url, 300, 15), daemon.log
        assert metric_value(port, "chat_messages_total", 'path="direct"') > direct
        assert metric_value(port, "redis_replica_ack_failures_total", 'write="chat"') > 0
        # The database down as well: chat and events go to the spool.
        private_pg.stop("fast")
        assert wait_until(lambda: metric_value(port, "spool_records_total",
                                               'kind="event",op="written"') > 0, 15), daemon.log
        assert metric_value(port, "redis_replica_ack_failures_total", 'write="event"') > 0
        assert wait_until(lambda: metric_value(port, "spool_records_total",
                                               'kind="chat",op="written"') > 0, 15), daemon.log
        for replica in replicas:
            replica.resume()
        private_pg.start()
        assert _grows(pg_url, 150, 30), daemon.log
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(SHUTDOWN_BUDGET + 1) == 0, daemon.log
    totals = daemon.synthetic_totals()
    assert_exactly_once(_drain(tmp_path, sentinel, pg_url, totals), totals)
    assert "LOST" not in daemon.log
