"""A rig for the 7TV tests: the stand-in 7TV, real Redis and PostgreSQL, a real source.

`SevenTvRig` builds one daemon's worth of 7TV plumbing against real servers:
config (through the real loader), migrated database, pool, Redis client,
EventIngest (inline insert, else park in Redis), the shared EventSink, the
state store, and `SevenTvSource`s pointed at a `SevenTvStandin` with short
timers. The oracles read the database over a connection of their own.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import redis

from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.seventv import Followed, SevenTvSource, followed_accounts
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.seventv import SetStateStore
from support import make_config

#: Socket timers for tests: short waits everywhere, long ones only where a test asks.
FAST: dict[str, Any] = dict(
    connect_timeout_secs=3.0, read_poll_secs=0.05, resume_ack_secs=1.0, heal_budget_secs=2.0,
    heal_retry_min_secs=0.2, heal_retry_max_secs=1.0, reconnect_jitter_secs=0.05,
    maintenance_wait_secs=30.0, rate_limited_wait_secs=30.0, client_bug_wait_secs=30.0)


def seventv_config(tmp_path: Path, pg_url: str, redis_url: str, standin: SevenTvStandin,
                   accounts: Mapping[int, Mapping[str, object]]) -> Config:
    cfg_dir = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}"
    cfg_dir.mkdir()
    sections: dict[str, dict[str, object]] = {
        "daemon": {"instance_id": "seventv-test", "state_dir": tmp_path / "state"},
        "timescale": {"pool_size": 4, "acquire_timeout_secs": 2, "statement_timeout_secs": 5,
                      "connect_timeout_secs": 2},
        "events": {"insert_timeout_secs": 3, "retry_interval_secs": 0.3},  # 3: room to open a connection
        "redis": {"socket_timeout_secs": 1, "connect_timeout_secs": 1},
        "seventv": {"enabled": "true", "eventapi_url": standin.eventapi_url, "api_url": standin.api_url},
    }
    for account_id, keys in accounts.items():
        sections[f"account.{account_id}"] = dict(keys)
    return make_config(cfg_dir, pg_url=pg_url, redis_url=redis_url, sections=sections)


@dataclass
class SevenTvRig:
    cfg: Config
    standin: SevenTvStandin
    pg_url: str
    metrics: Metrics
    pool: Pool
    redis: redis.Redis
    events: EventIngest
    sink: EventSink
    store: SetStateStore
    sources: list[SevenTvSource] = field(default_factory=list)

    def source(self, accounts: Sequence[Followed] | None = None, *, start: bool = True,
               **opts: Any) -> SevenTvSource:
        merged = dict(FAST)
        merged.update(opts)
        src = SevenTvSource(self.standin.eventapi_url, self.standin.api_url,
                            accounts if accounts is not None else followed_accounts(self.cfg),
                            store=self.store, sink=self.sink, metrics=self.metrics, turn_secs=0.05,
                            api_timeout_secs=3.0, **merged)
        src.reconnect_min_secs, src.reconnect_max_secs = 0.05, 0.3
        self.sources.append(src)
        if start:
            src.start()
        return src

    def stop(self, src: SevenTvSource) -> None:
        src.request_stop()
        assert src.join(10), f"{src.name} did not stop"
        for sock in src.sockets:
            assert not sock.alive, f"{sock.name} still running"

    def value(self, name: str, **labels: str) -> float:
        v = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v

    def total(self, name: str) -> float:
        """A counter's samples summed over every label (`seventv_dispatches_total`: all handled)."""
        return sum(s.value for m in self.metrics.registry.collect() for s in m.samples if s.name == name)

    def healed(self, account: int) -> bool:
        """The newest source holds the account with every subscription acked and no heal due."""
        return any(f.account_id == account and not f.heal_due and f.subscriptions()
                   and all(sub in sock.acked_subs for sub in f.subscriptions())
                   for sock in self.sources[-1].sockets for f in sock.group)

    def close(self) -> None:
        for src in self.sources:
            src.request_stop()
        for src in self.sources:
            src.join(10)
        self.pool.close()
        self.redis.close()

    # -- oracles ------------------------------------------------------------------------

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(self.pg_url, connect_timeout=5)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def changes(self, account_id: int | None = None) -> list[tuple[str, str, str | None, str]]:
        """(type, emote id, old name, name) of the stored 7TV events, in insertion order."""
        where = "platform = 'seventv'" + (" AND account_id = %s" if account_id is not None else "")
        got = self.rows(f"SELECT type, payload FROM events WHERE {where} ORDER BY ingested_at, id",
                        (account_id,) if account_id is not None else ())
        return [(t, p["emote_id"], p.get("old_name"), p["name"]) for t, p in got]

    def external_ids(self) -> Counter[str]:
        return Counter(r[0] for r in self.rows("SELECT external_id FROM events WHERE platform = 'seventv'"))

    def state(self, account_id: int) -> tuple[str, dict[str, Any], int] | None:
        """(set id, {emote id: [name, ...]}, version); what the row keeps beside the emotes (its
        values are not lists) is left out."""
        got = self.rows("SELECT emote_set_id, emotes, version FROM seventv_emote_sets WHERE account_id = %s",
                        (account_id,))
        if not got:
            return None
        return got[0][0], {k: v for k, v in got[0][1].items() if isinstance(v, list)}, got[0][2]


def make_rig(tmp_path: Path, pg_url: str, redis_url: str, standin: SevenTvStandin,
             accounts: Mapping[int, Mapping[str, object]]) -> SevenTvRig:
    cfg = seventv_config(tmp_path, pg_url, redis_url, standin, accounts)
    migrate(cfg.timescale)
    metrics = Metrics()
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    events = EventIngest(client, pool, None, metrics, cfg)
    sink = EventSink(events.persist_event, alerts=None, sessions=None)
    return SevenTvRig(cfg, standin, pg_url, metrics, pool, client, events, sink, SetStateStore(pool))
