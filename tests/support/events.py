"""Shared pieces of the event durability tests: a rig of real clients, and oracles.

A `Rig` is one daemon's worth of event plumbing (config, pool, Redis client,
metrics, EventIngest) against real servers. The oracles read the database
over a connection of their own, never the pool under test.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras
import redis

from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.events.retry import EventRetryWorker
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import EventChild, PlatformEvent
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.spool import Spool
from support import make_config
from support.harness.servers import wait_until


def event_config(tmp_path: Path, pg_url: str, redis_url: str, *,
                 timescale: Mapping[str, object] | None = None,
                 events: Mapping[str, object] | None = None,
                 instance: str = "test-1") -> Config:
    ts: dict[str, object] = {"pool_size": 3, "acquire_timeout_secs": 30,
                             "statement_timeout_secs": 30}
    ts.update(timescale or {})
    ev: dict[str, object] = {"insert_timeout_secs": 3, "retry_interval_secs": 0.2}
    ev.update(events or {})
    cfg_dir = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}"
    cfg_dir.mkdir()
    return make_config(cfg_dir, pg_url=pg_url, redis_url=redis_url, sections={
        "daemon": {"instance_id": instance, "state_dir": tmp_path / "state"},
        "timescale": ts, "events": ev, "redis": {"socket_timeout_secs": 2}})


@dataclass
class Rig:
    cfg: Config
    pool: Pool
    redis: redis.Redis
    metrics: Metrics
    ingest: EventIngest
    pg_url: str
    spool: Spool | None = None
    workers: list[EventRetryWorker] = field(default_factory=list)

    def worker(self, instance: str = "replayer-1", **kwargs: Any) -> EventRetryWorker:
        kwargs.setdefault("lease_ttl_secs", 5)
        kwargs.setdefault("heartbeat_ttl_secs", 5)
        w = EventRetryWorker(self.redis, self.pool, self.metrics, self.cfg, instance=instance,
                             **kwargs)
        self.workers.append(w)
        return w

    def counter(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value

    def failures(self, outcome: str) -> float:
        return self.counter("events_persist_failures_total", outcome=outcome)

    def warm(self) -> None:
        """Open one pooled connection while the database is healthy."""
        with self.pool.transaction() as cur:
            cur.execute("SELECT 1")

    def close(self) -> None:
        for w in self.workers:
            w.lease.release()
        self.pool.close()
        self.redis.close()
        if self.spool is not None:
            self.spool.close()


def make_rig(tmp_path: Path, pg_url: str, redis_url: str, *, spool_bytes: int | None = None,
             migrate_db: bool = True, timescale: Mapping[str, object] | None = None,
             events: Mapping[str, object] | None = None) -> Rig:
    """A rig; with `spool_bytes`, a real spool of that cap under tmp_path."""
    cfg = event_config(tmp_path, pg_url, redis_url, timescale=timescale, events=events)
    if migrate_db:
        migrate(cfg.timescale)
    metrics = Metrics()
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    spool: Spool | None = None
    if spool_bytes is not None:
        spool = Spool(tmp_path / f"spool-{uuid.uuid4().hex[:6]}", spool_bytes, metrics)
        spool.open()
    ingest = EventIngest(client, pool, spool, metrics, cfg)
    return Rig(cfg, pool, client, metrics, ingest, pg_url, spool)


# -- events -------------------------------------------------------------------


def make_event(account: int = 7, *, external_id: str | None = None, n: int = 0,
               created_at: datetime | None = None, children: int = 0,
               payload: Mapping[str, Any] | None = None) -> PlatformEvent:
    return PlatformEvent.new(
        account_id=account, platform="twitch", type="channel.subscription.gift",
        external_id=external_id, created_at=created_at,
        payload=dict(payload) if payload is not None else {"n": n, "tier": "1000"},
        user_id=f"u{n}",
        children=tuple(EventChild(kind="gift_recipient", user_id=f"r{n}.{i}",
                                  user_login=f"recipient{i}", payload={"i": i})
                       for i in range(children)))


def old(hours: float) -> datetime:
    return datetime.now(UTC) - timedelta(hours=hours)


# -- oracles --------------------------------------------------------------------


def uuid_connection(pg_url: str) -> psycopg2.extensions.connection:
    """A connection of the test's own that passes uuid.UUID values (the replay's statements)."""
    conn = psycopg2.connect(pg_url, connect_timeout=5)
    psycopg2.extras.register_uuid(conn_or_curs=conn)  # type: ignore[no-untyped-call]
    return conn


def db_rows(pg_url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(pg_url, connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql, tuple(params))
            return list(cur.fetchall())
    finally:
        conn.close()


def one_waits_on_an_advisory_lock(pg_url: str, timeout: float = 5.0) -> bool:
    """Whether, within `timeout`, exactly one session waits for an advisory lock."""
    return wait_until(lambda: db_rows(
        pg_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
    )[0][0] == 1, timeout=timeout)


def stored_ids(pg_url: str) -> list[str]:
    """Every events.id (as text), duplicates kept."""
    return [r[0] for r in db_rows(pg_url, "SELECT id::text FROM events")]


def stored_rows(pg_url: str) -> dict[str, tuple[datetime, int, str | None]]:
    """id -> (created_at, account_id, external_id); asserts there is no duplicate id."""
    rows = db_rows(pg_url, "SELECT id::text, created_at, account_id, external_id FROM events")
    out = {r[0]: (r[1], r[2], r[3]) for r in rows}
    assert len(out) == len(rows), "an event id is stored twice"
    return out


def children_of(pg_url: str, event_id: uuid.UUID | str) -> list[tuple[int, str | None]]:
    return [(r[0], r[1]) for r in db_rows(
        pg_url, "SELECT ordinal, user_id FROM event_children WHERE event_id = %s ORDER BY ordinal",
        (str(event_id),))]


def lrange(client: redis.Redis, key: str | bytes) -> list[bytes]:
    return [x if isinstance(x, bytes) else x.encode() for x in client.lrange(key, 0, -1)]


def parked(client: redis.Redis, account: int) -> list[bytes]:
    return lrange(client, rediskeys.events_deadletter(account))


def inflight(client: redis.Redis, account: int, instance: str) -> list[bytes]:
    return lrange(client, rediskeys.events_inflight(account, instance))


def quarantined(client: redis.Redis, account: int) -> list[dict[str, Any]]:
    return [json.loads(q) for q in client.lrange(rediskeys.events_quarantine(account), 0, -1)]


def ids_in(entries: Sequence[bytes]) -> list[str]:
    return [json.loads(e)["id"] for e in entries]


def all_parked_ids(client: redis.Redis) -> list[str]:
    """Ids in every dead-letter and in-flight list of every account."""
    out: list[str] = []
    for pattern in ("lumio:events:deadletter:{*}", "lumio:events:inflight:{*}:*"):
        for key in client.scan_iter(match=pattern):
            out += ids_in(lrange(client, key))
    return out


def iter_accounts(client: redis.Redis) -> Iterator[int]:
    for key in client.scan_iter(match="lumio:events:deadletter:{*}"):
        yield rediskeys.account_of(key.decode())
