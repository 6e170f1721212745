"""A rig for the stream-status tests: stand-in Twitch, real Redis and PostgreSQL, a real poller.

`StatusRig` wires what `app.build()` wires for the poller: the record
writers, EventIngest (with the spool, when asked), the statistics store, the
stream sessions, the event sink and a `StreamStatusPoller` over Helix
clients pointed at stand-ins. Oracles read the database over connections
of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import redis

from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.events.records import RecordWriters
from lumio_ingestd.events.retry import EventRetryWorker
from lumio_ingestd.events.streamstats import KIND, StreamStats, canary_record
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.apptoken import AppToken
from lumio_ingestd.sources.httpclient import join
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.statusclient import StatusClient
from lumio_ingestd.sources.streamstatus import StreamStatusPoller
from lumio_ingestd.sources.twitch.streams import HelixStreams
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.sessions import StreamSessions
from lumio_ingestd.stores.spool import Spool
from support import make_config


def status_config(tmp_path: Path, pg_url: str, redis_url: str, *,
                  extra: Mapping[str, Mapping[str, object]] | None = None) -> Config:
    cfg_dir = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}"
    cfg_dir.mkdir()
    sections: dict[str, dict[str, object]] = {
        "daemon": {"instance_id": "status-test", "state_dir": tmp_path / "state"},
        "timescale": {"pool_size": 3, "acquire_timeout_secs": 2, "statement_timeout_secs": 5,
                      "connect_timeout_secs": 2},
        "events": {"insert_timeout_secs": 3, "retry_interval_secs": 0.2},
        "redis": {"socket_timeout_secs": 1, "connect_timeout_secs": 1},
    }
    for section, keys in (extra or {}).items():
        sections.setdefault(section, {}).update(keys)
    return make_config(cfg_dir, pg_url=pg_url, redis_url=redis_url, sections=sections)


def helix_client(fake: TwitchStandin, metrics: Metrics, *, timeout_secs: float = 2.0) -> HelixStreams:
    from lumio_ingestd.config import Secret

    token = AppToken(join(fake.oauth_url, "token"), fake.client_id, Secret(fake.client_secret),
                     timeout_secs=timeout_secs)
    return HelixStreams(fake.helix_url, fake.client_id, token, metrics, timeout_secs=timeout_secs)


@dataclass
class StatusRig:
    cfg: Config
    pg_url: str
    metrics: Metrics
    pool: Pool
    redis: redis.Redis
    records: RecordWriters
    events: EventIngest
    stats: StreamStats
    sessions: StreamSessions
    sink: EventSink
    spool: Spool | None = None
    pollers: list[StreamStatusPoller] = field(default_factory=list)
    workers: list[EventRetryWorker] = field(default_factory=list)

    def poller(self, clients: Sequence[tuple[StatusClient, Mapping[str, int]]],
               **kwargs: Any) -> StreamStatusPoller:
        kwargs.setdefault("interval_secs", 3600.0)  # the tests call poll_round() themselves
        kwargs.setdefault("start_grace_secs", 0.0)
        kwargs.setdefault("sessions", self.sessions)
        p = StreamStatusPoller(clients, sink=self.sink, stats=self.stats, metrics=self.metrics,
                               **kwargs)
        self.pollers.append(p)
        return p

    def retry_worker(self, **kwargs: Any) -> EventRetryWorker:
        w = EventRetryWorker(self.redis, self.pool, self.metrics, self.cfg, instance="replayer-1",
                             lease_ttl_secs=5, heartbeat_ttl_secs=5, records=self.records, **kwargs)
        self.workers.append(w)
        return w

    def value(self, name: str, **labels: str) -> float:
        v = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v

    def close(self) -> None:
        for p in self.pollers:
            p.request_stop()
        for p in self.pollers:
            assert p.join(10), f"{p.name} did not stop"
        for w in self.workers:
            w.lease.release()
        self.pool.close()
        self.redis.close()
        if self.spool is not None:
            self.spool.close()

    # -- oracles ------------------------------------------------------------------------

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return db_rows(self.pg_url, sql, params)

    def events_of(self, type_: str) -> list[tuple[Any, ...]]:
        """(account_id, external_id, created_at) of every `type_` row."""
        return self.rows("SELECT account_id, external_id, created_at FROM events WHERE type = %s "
                         "ORDER BY created_at", (type_,))

    def sessions_of(self, account: int) -> list[tuple[Any, ...]]:
        return self.rows("SELECT external_id, started_at, ended_at FROM stream_sessions "
                         "WHERE account_id = %s ORDER BY started_at", (account,))

    def stats_rows(self) -> list[tuple[Any, ...]]:
        return self.rows("SELECT account_id, platform, ts, viewers_avg, viewers_max, samples, title, "
                         "category FROM stream_stats ORDER BY account_id, ts")

    def stats_per_stream(self) -> dict[tuple[int, str], tuple[float, int, int, Any, Any]]:
        """(average, maximum, samples, title, category) per (account, platform), over minutes.

        A test's poll rounds can straddle a minute boundary, splitting one
        stream's samples over two windows; merged the way the upsert merges
        (average weighted by samples, the later title and category).
        """
        merged: dict[tuple[int, str], tuple[float, int, int, Any, Any]] = {}
        for account, platform, _, avg, top, samples, title, category in self.stats_rows():
            key = (account, platform)
            if key in merged:
                a, m, n, t, c = merged[key]
                avg = (a * n + avg * samples) / (n + samples)
                top, samples = max(m, top), n + samples
                title, category = title or t, category or c
            merged[key] = (avg, top, samples, title, category)
        return merged


def db_rows(pg_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(pg_url, connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    finally:
        conn.close()


def make_status_rig(tmp_path: Path, pg_url: str, redis_url: str, *, spool_bytes: int | None = None,
                    sessions_retry_secs: float = 0.2) -> StatusRig:
    cfg = status_config(tmp_path, pg_url, redis_url)
    migrate(cfg.timescale)
    metrics = Metrics()
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    spool: Spool | None = None
    if spool_bytes is not None:
        spool = Spool(tmp_path / f"spool-{uuid.uuid4().hex[:6]}", spool_bytes, metrics)
        spool.open()
    records = RecordWriters()
    events = EventIngest(client, pool, spool, metrics, cfg, records=records)
    stats = StreamStats(pool, events.deadletters, spool, metrics, timeout_secs=3.0)
    records.register(KIND, stats.write_record, canary_record)
    sessions = StreamSessions(pool, metrics, retry_every_secs=sessions_retry_secs)
    sink = EventSink(events.persist_event, alerts=None, sessions=sessions)
    return StatusRig(cfg, pg_url, metrics, pool, client, records, events, stats, sessions, sink, spool)
