"""A rig for the StreamElements tests: the stand-in Astro gateway, real Redis and PostgreSQL, a real source.

`SeRig` builds one daemon's worth of StreamElements plumbing against real
servers: config (through the real loader), migrated database, pool, Redis
client, EventIngest (with a real spool), the alert publisher, the shared
`EventSink` and a `StreamElementsSource` for account 42 pointed at an
`AstroStandin`. The oracles read the database over a connection of their own.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import redis

from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.devkit.standins.streamelements import AstroStandin
from lumio_ingestd.events.alerts import AlertPublisher
from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.events.retry import EventRetryWorker
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.streamelements.source import StreamElementsSource
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.spool import Spool
from support import make_config

ACCOUNT = 42
ROOM = "60aa00000000000000000001"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.se-test.sig"


def write_token(path: Path, token: str = TOKEN, token_type: str | None = "jwt") -> Path:
    if token_type is None:
        path.write_text(token + "\n")
    else:
        path.write_text(json.dumps({"token": token, "token_type": token_type}))
    path.chmod(0o600)
    return path


def se_config(tmp_path: Path, pg_url: str, redis_url: str, astro: AstroStandin | None, *,
              topics: str = "channel.tips,channel.activities", keep_pii: bool = False,
              token_type: str | None = "jwt") -> Config:
    cfg_dir = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}"
    cfg_dir.mkdir()
    token_file = write_token(cfg_dir / "se-token.json", astro.token if astro else TOKEN, token_type)
    sections: dict[str, dict[str, object]] = {
        "daemon": {"instance_id": "se-test", "state_dir": tmp_path / "state"},
        "timescale": {"pool_size": 3, "acquire_timeout_secs": 2, "statement_timeout_secs": 5,
                      "connect_timeout_secs": 2},
        "events": {"insert_timeout_secs": 3, "retry_interval_secs": 0.2},
        "redis": {"socket_timeout_secs": 1, "connect_timeout_secs": 1},
        "streamelements": {"astro_url": astro.url if astro else "ws://127.0.0.1:1/",
                           "topics": topics, "keep_donor_pii": "true" if keep_pii else "false"},
        f"account.{ACCOUNT}": {"streamelements_channel_id": ROOM,
                               "streamelements_token_file": token_file},
    }
    return make_config(cfg_dir, pg_url=pg_url, redis_url=redis_url, sections=sections)


@dataclass
class SeRig:
    cfg: Config
    astro: AstroStandin | None
    pg_url: str
    metrics: Metrics
    pool: Pool
    redis: redis.Redis
    spool: Spool
    events: EventIngest
    alerts: AlertPublisher
    sink: EventSink
    sources: list[StreamElementsSource] = field(default_factory=list)
    workers: list[EventRetryWorker] = field(default_factory=list)

    @property
    def token_file(self) -> Path:
        path = self.cfg.accounts[0].streamelements_token_file
        assert path is not None
        return path

    def source(self, **kwargs: Any) -> StreamElementsSource:
        kwargs.setdefault("read_budget_secs", 0.1)
        kwargs.setdefault("retry_min_secs", 0.05)
        kwargs.setdefault("retry_max_secs", 0.3)
        kwargs.setdefault("response_timeout_secs", 2.0)
        kwargs.setdefault("rate_limit_secs", 0.3)
        kwargs.setdefault("connect_timeout_secs", 3.0)
        kwargs.setdefault("welcome_timeout_secs", 3.0)
        src = StreamElementsSource(self.cfg.accounts[0], self.cfg.streamelements, sink=self.sink,
                                   metrics=self.metrics, **kwargs)
        src.reconnect_min_secs = 0.05
        src.reconnect_max_secs = 0.3
        self.sources.append(src)
        return src

    def worker(self) -> EventRetryWorker:
        w = EventRetryWorker(self.redis, self.pool, self.metrics, self.cfg, instance="se-replayer",
                             lease_ttl_secs=5, heartbeat_ttl_secs=5)
        self.workers.append(w)
        return w

    def value(self, name: str, **labels: str) -> float:
        v = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v

    def close(self) -> None:
        for src in self.sources:
            src.request_stop()
        for src in self.sources:
            assert src.join(10), f"{src.name} did not stop"
        self.alerts.request_stop()
        self.alerts.join(10)
        for w in self.workers:
            w.lease.release()
        self.pool.close()
        self.redis.close()
        self.spool.close()

    # -- oracles ------------------------------------------------------------------------

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.pg_url, connect_timeout=5)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def stored(self) -> Counter[tuple[str, str]]:
        """(type, external_id) of every stored StreamElements event, with how often."""
        return Counter((r[0], r[1]) for r in self.rows(
            "SELECT type, external_id FROM events WHERE platform = 'streamelements'"))

    def payloads(self) -> list[dict[str, Any]]:
        return [r[0] for r in self.rows("SELECT payload FROM events WHERE platform = 'streamelements'")]


def make_rig(tmp_path: Path, pg_url: str, redis_url: str, astro: AstroStandin | None, *,
             topics: str = "channel.tips,channel.activities", keep_pii: bool = False,
             token_type: str | None = "jwt", migrate_db: bool = True) -> SeRig:
    cfg = se_config(tmp_path, pg_url, redis_url, astro, topics=topics, keep_pii=keep_pii,
                    token_type=token_type)
    if migrate_db:
        migrate(cfg.timescale)
    metrics = Metrics()
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    spool = Spool(tmp_path / f"spool-{uuid.uuid4().hex[:6]}", 1 << 20, metrics)
    spool.open()
    events = EventIngest(client, pool, spool, metrics, cfg)
    alerts = AlertPublisher(client, metrics, client_queue_max=16)
    sink = EventSink(events.persist_event, alerts=alerts, sessions=None)
    with pool.transaction() as cur:  # one pooled connection open while the database is healthy
        cur.execute("SELECT 1")
    alerts.start()
    return SeRig(cfg, astro, pg_url, metrics, pool, client, spool, events, alerts, sink)


