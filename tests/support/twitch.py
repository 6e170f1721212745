"""A rig for the Twitch tests: the stand-in Twitch, real Redis and PostgreSQL, a real source.

`TwitchRig` builds one daemon's worth of Twitch plumbing against real servers:
config (through the real loader), migrated database, pool, Redis client,
ChatIngest + ChatQueue + ChatFlusher (so chat reaches its table), EventIngest,
the alert publisher, the sink and a `TwitchSource` for account 42 pointed at
a `TwitchStandin`. The oracles read the database over a connection of their own.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import redis

from lumio_ingestd.chat.flusher import ChatFlusher
from lumio_ingestd.chat.ingest import ChatIngest, ChatQueue
from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.events.alerts import AlertPublisher
from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.twitch.oauth import TokenStore
from lumio_ingestd.sources.twitch.sink import TwitchSink
from lumio_ingestd.sources.twitch.source import TwitchSource
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.sessions import StreamSessions
from support import make_config

ACCOUNT = 42
WEBHOOK_SECRET = "webhook-secret-0123456789"
EMIT_TOKEN = "emit-token-abcdef"



def write_token_file(path: Path, access: str, refresh: str) -> Path:
    path.write_text(json.dumps({"access_token": access, "refresh_token": refresh, "note": "kept"}))
    path.chmod(0o600)
    return path


def twitch_config(tmp_path: Path, pg_url: str, redis_url: str, fake: TwitchStandin | None, *,
                  extra: Mapping[str, Mapping[str, object]] | None = None) -> Config:
    cfg_dir = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}"
    cfg_dir.mkdir()
    secrets = cfg_dir / "secrets"
    secrets.mkdir()
    (secrets / "client_secret").write_text((fake.client_secret if fake else "x" * 12) + "\n")
    (secrets / "webhook_secret").write_text(WEBHOOK_SECRET + "\n")
    (secrets / "emit_token").write_text(EMIT_TOKEN + "\n")
    token_file = write_token_file(cfg_dir / "token.json", fake.access_token if fake else "a",
                                  fake.refresh_token if fake else "r")
    sections: dict[str, dict[str, object]] = {
        "daemon": {"instance_id": "twitch-test", "state_dir": tmp_path / "state"},
        "chat": {"flush_interval_secs": 0.2},
        "timescale": {"pool_size": 3, "acquire_timeout_secs": 2, "statement_timeout_secs": 5,
                      "connect_timeout_secs": 2},
        "events": {"insert_timeout_secs": 3},
        "redis": {"socket_timeout_secs": 1, "connect_timeout_secs": 1},
        "http": {"listen": "127.0.0.1:0", "emit_token_file": secrets / "emit_token"},
        "twitch": {"client_id": fake.client_id if fake else "cid",
                   "client_secret_file": secrets / "client_secret",
                   "webhook_secret_file": secrets / "webhook_secret",
                   **({"eventsub_ws_url": fake.ws_url, "helix_url": fake.helix_url,
                       "oauth_url": fake.oauth_url} if fake else {})},
        f"account.{ACCOUNT}": {"twitch_user_id": fake.user_id if fake else "12826",
                               "twitch_token_file": token_file},
    }
    for section, keys in (extra or {}).items():
        sections.setdefault(section, {}).update(keys)
    return make_config(cfg_dir, pg_url=pg_url, redis_url=redis_url, sections=sections)


@dataclass
class TwitchRig:
    cfg: Config
    fake: TwitchStandin | None
    pg_url: str
    metrics: Metrics
    pool: Pool
    redis: redis.Redis
    chat: ChatIngest
    events: EventIngest
    alerts: AlertPublisher
    sessions: StreamSessions
    sink: TwitchSink
    flusher: ChatFlusher
    sources: list[TwitchSource] = field(default_factory=list)

    def source(self, **kwargs: Any) -> TwitchSource:
        assert self.fake is not None
        account = self.cfg.accounts[0]
        assert account.twitch_token_file is not None
        tokens = TokenStore(account.twitch_token_file, self.cfg.twitch.oauth_url, self.cfg.twitch.client_id,
                            self.cfg.twitch.client_secret, self.metrics)
        kwargs.setdefault("keepalive_secs", 10)
        kwargs.setdefault("gift_window_secs", 1.0)
        src = TwitchSource(account, self.cfg.twitch, chat_queue=ChatQueue(self.chat, self.metrics),
                           sink=self.sink, tokens=tokens, metrics=self.metrics, **kwargs)
        src.reconnect_min_secs = 0.05
        src.reconnect_max_secs = 0.3
        self.sources.append(src)
        return src

    def value(self, name: str, **labels: str) -> float:
        v = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v

    def close(self) -> None:
        for src in self.sources:
            src.request_stop()
        for src in self.sources:
            assert src.join(10), f"{src.name} did not stop"
        self.alerts.request_stop()
        self.flusher.request_stop()
        self.alerts.join(10)
        self.flusher.join(10)
        self.pool.close()
        self.redis.close()

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

    def chat_ids(self) -> Counter[str]:
        return Counter(r[0] for r in self.rows("SELECT message_id FROM chat_messages"))

    def event_ids(self) -> Counter[str]:
        return Counter(r[0] for r in self.rows("SELECT external_id FROM events"))


def make_rig(tmp_path: Path, pg_url: str, redis_url: str, fake: TwitchStandin | None, *,
             extra: Mapping[str, Mapping[str, object]] | None = None) -> TwitchRig:
    cfg = twitch_config(tmp_path, pg_url, redis_url, fake, extra=extra)
    migrate(cfg.timescale)
    metrics = Metrics()
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    chat = ChatIngest(client, pool, None, metrics, cfg)
    events = EventIngest(client, pool, None, metrics, cfg)
    alerts = AlertPublisher(client, metrics, client_queue_max=16)
    sessions = StreamSessions(pool, metrics, retry_every_secs=0.2)
    sink = TwitchSink(events.persist_event, metrics, alerts=alerts, sessions=sessions)
    flusher = ChatFlusher(client, pool, metrics, cfg)
    alerts.start()
    flusher.start()
    return TwitchRig(cfg, fake, pg_url, metrics, pool, client, chat, events, alerts, sessions, sink, flusher)
