"""`[redis] cluster = true`: the daemon on a private Redis Cluster (3 primaries, 3 replicas).

- The daemon with the synthetic source on six accounts (spread over the
  three primaries' slots), the database stopped mid-run so chat waits in the
  buffers and events go to their dead-letter lists, SIGTERM; then a second run
  drains everything (in-flight lists, dead letters, the event retry worker's
  SCAN over every primary): every message and event stored exactly once.
- Primaries SIGKILLed under load (some while their replicas lag), replicas
  promoted, with `min_replicas_acked = 1`: the same process goes on storing
  without a restart, and every message and event is stored exactly once.
- Leases, the membership's heartbeat and owner keys, and the per-account key
  purge of `dissolve-account` on the cluster client.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.cluster.lease import Lease
from lumio_ingestd.cluster.membership import Membership
from lumio_ingestd.config import RedisConfig, load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.lifecycle.redis_purge import delete_account_keys
from lumio_ingestd.metrics import Metrics
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
from support.harness.cluster import RedisClusterServers
from support.harness.servers import wait_until

SHUTDOWN_BUDGET = 8.0
ACCOUNTS = "1, 2, 3, 4, 5, 6"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with RedisClusterServers(tmp_path_factory.mktemp("redis_cluster")) as servers:
        yield servers


def _config(tmp_path: Path, name: str, cluster_url: str, pg_url: str, *, instance: str,
            synthetic: dict[str, object] | None = None,
            redis: dict[str, object] | None = None) -> Path:
    sections: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": tmp_path / "state", "instance_id": instance,
                   "accounts_dir": tmp_path / "none"},
        "redis": {"url": cluster_url, "cluster": "true", **(redis or {})},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "chat": {"flush_interval_secs": 0.3, "deadletter_drain_interval_secs": 0.5},
        "events": {"retry_interval_secs": 0.5},
    }
    if synthetic:
        sections["synthetic"] = dict(synthetic)
    path = write_ini(tmp_path / f"{name}.ini", sections)
    migrate(load(str(path), {}).timescale)
    return path


def _count(pg_url: str, table: str) -> int:
    try:
        with psycopg2.connect(pg_url, connect_timeout=2) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - a fixed table name
            row = cur.fetchone()
        conn.close()
        return int(row[0]) if row else 0
    except psycopg2.Error:
        return -1


def _drain(tmp_path: Path, name: str, cluster_url: str, pg_url: str, instance: str,
           totals: SyntheticTotals, wait_secs: float = 40.0) -> tuple[dict[str, int], dict[str, int]]:
    """A second run without the source, with the first one's instance id: stores what it left."""
    cfg = _config(tmp_path, name, cluster_url, pg_url, instance=instance)
    with NotifySocket() as notify, Daemon(cfg, tmp_path / f"{name}.log", notify=notify) as second:
        notify.wait_for("READY=1", 20)
        stored = wait_stored(pg_url, totals, wait_secs, alive=lambda: second.proc.poll() is None)
        second.signal(signal.SIGTERM)
        assert second.wait(SHUTDOWN_BUDGET + 1) == 0, second.log
    return stored


def test_chat_events_and_dead_letters_on_a_cluster_exactly_once(
        tmp_path: Path, cluster: RedisClusterServers, private_pg: PostgresServer) -> None:
    private_pg.create_database("lumio")
    pg_url = private_pg.url("lumio")
    cfg = _config(tmp_path, "cl", cluster.url, pg_url, instance="cl-1",
                  synthetic={"rate_per_sec": 300, "accounts": ACCOUNTS, "event_every": 4, "run_id": "cl"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "cl.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        assert wait_until(lambda: _count(pg_url, "chat_messages") > 100, 20), daemon.log
        private_pg.stop("fast")
        assert wait_until(lambda: "event inserts: the database unavailable" in daemon.log, 10), daemon.log
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(SHUTDOWN_BUDGET + 1) == 0, daemon.log
    totals = daemon.synthetic_totals()
    client = connect(RedisConfig(url=cluster.url, cluster=True))
    left = sum(1 for _ in client.scan_iter(match="lumio:*{*}*", count=1000))
    assert left > 0  # buffers, dead letters or in-flight lists wait on the cluster
    private_pg.start()
    assert_exactly_once(_drain(tmp_path, "cl-drain", cluster.url, pg_url, "cl-1", totals), totals)
    client.close()


def test_primaries_killed_under_load_lose_nothing_with_min_replicas_acked(
        tmp_path: Path, cluster: RedisClusterServers, private_pg: PostgresServer) -> None:
    """Five primaries SIGKILLed in one run of one process, `min_replicas_acked = 1`.

    Rounds 1 to 3 kill a primary whose replica was stopped and cut off a second
    before (it is promoted a second behind); in round 2 the database is down
    too, so chat waits in the buffers and events are parked while the lagging
    primary dies. Each victim comes back as a replica and syncs before the next.
    Every message and event is stored exactly once: 0 missing, none twice.
    """
    private_pg.create_database("lumio")
    pg_url = private_pg.url("lumio")
    cfg = _config(tmp_path, "fo", cluster.url, pg_url, instance="fo-1",
                  synthetic={"rate_per_sec": 300, "accounts": ACCOUNTS, "event_every": 4, "run_id": "fo"},
                  redis={"min_replicas_acked": 1, "replica_ack_timeout_ms": 300})
    accounts = [int(a) for a in ACCOUNTS.split(",")]
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "fo.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        _, metrics_port = daemon.ports()
        assert wait_until(lambda: _count(pg_url, "chat_messages") > 100, 20), daemon.log
        for round_ in range(5):
            lag = 1.0 if round_ in (1, 2, 3) else 0.0
            if round_ == 2:
                private_pg.stop("fast")
                assert wait_until(lambda: "event inserts: the database unavailable" in daemon.log, 10)
            victim = cluster.kill_primary_of(f"lumio:chat:buffer:{{{accounts[round_]}}}", lag_secs=lag)
            if round_ == 2:
                private_pg.start()
            victim.start()  # back as a replica; it syncs before the next kill
            cluster.wait_synced()
            # The same process goes on storing after each promotion.
            assert _grows(pg_url, 150, 30), daemon.log
        unconfirmed = metric_value(metrics_port, "redis_replica_ack_failures_total", 'write="chat"')
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(SHUTDOWN_BUDGET + 1) == 0, daemon.log
    totals = daemon.synthetic_totals()
    assert_exactly_once(_drain(tmp_path, "fo-drain", cluster.url, pg_url, "fo-1", totals), totals)
    # The lagging replicas could not confirm: those pushes took the next tier.
    assert unconfirmed > 0
    assert "LOST" not in daemon.log


def _grows(pg_url: str, rows: int, timeout: float) -> bool:
    """Whether `chat_messages` gains `rows` rows within `timeout` seconds."""
    before = _count(pg_url, "chat_messages")
    return wait_until(lambda: _count(pg_url, "chat_messages") > before + rows, timeout)


def test_leases_membership_and_account_purge_on_a_cluster(cluster: RedisClusterServers) -> None:
    client = connect(RedisConfig(url=cluster.url, cluster=True))
    metrics = Metrics()
    one = Lease(client, "lumio:test:cluster-lease", 5.0, metrics, owner="a")
    two = Lease(client, "lumio:test:cluster-lease", 5.0, metrics, owner="b")
    assert one.acquire() and not two.acquire() and one.extend()
    one.release()
    assert two.acquire()
    two.release()

    members = [Membership(client, name, 5.0, metrics, interval_secs=0.1) for name in ("cm-a", "cm-b")]
    for m in members:
        m.set_accounts(range(1, 21))
        m.run_once()  # announce
    for _ in range(2):
        for m in members:
            m.run_once()
            target = m.target()
            m.settled(target or frozenset(), released=())
    owned = [m.target() or frozenset() for m in members]
    assert owned[0] | owned[1] == frozenset(range(1, 21)) and not owned[0] & owned[1]
    assert set(members[0].live()) >= {"cm-a", "cm-b"}  # heartbeats found by SCAN on every primary
    for m in members:
        m.release_all()
    assert not [k for k in client.scan_iter(match="lumio:owner:*")]

    for account in (7, 8):
        client.rpush(f"lumio:chat:buffer:{{{account}}}", b"x")
        client.rpush(f"lumio:chat:deadletter:{{{account}}}", b"y")
    assert delete_account_keys(client, 7) == 2
    assert client.exists("lumio:chat:buffer:{7}") == 0 and client.exists("lumio:chat:buffer:{8}") == 1
    client.delete("lumio:chat:buffer:{8}", )
    client.delete("lumio:chat:deadletter:{8}")
    client.close()
