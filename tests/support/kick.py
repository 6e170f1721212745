"""A rig for the Kick tests: the stand-in Kick, real Redis and PostgreSQL, a real source and receiver.

`KickRig` builds one daemon's worth of Kick plumbing against real servers:
config (through the real loader, the stand-in's public key as
`webhook_public_key_file`), migrated database, pool, Redis client,
ChatIngest + ChatQueue + ChatFlusher, EventIngest, the alert publisher,
stream sessions, the shared `EventSink`, `KickSource`s for account 42 and
the webhook receiver on a real HTTP server. The oracles read the database
over a connection of their own.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
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
from lumio_ingestd.devkit.standins.kick import KickStandin
from lumio_ingestd.events.alerts import AlertPublisher
from lumio_ingestd.events.persist import EventIngest
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.kick import webhook_key
from lumio_ingestd.sources.kick.source import KickSource
from lumio_ingestd.sources.kick.webhook import MAX_BODY_BYTES, PATH, KickWebhook
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.seen import SeenDeliveries
from lumio_ingestd.stores.sessions import StreamSessions
from lumio_ingestd.web.server import Routes
from support import make_config
from support.http_client import serving

ACCOUNT = 42
BROADCASTER = (4377088, "streamer")
CHATROOM = 4309481
CHANNEL = 4378473
CHAT_CHANNEL = f"chatrooms.{CHATROOM}.v2"
EVENT_CHANNEL = f"channel.{CHANNEL}"


#: 2**31 s: every time from 1970 to 2038 is one bucket.
TEST_BUCKET_SECS = 2**31


def kick_config(tmp_path: Path, pg_url: str, redis_url: str, fake: KickStandin, *,
                extra: Mapping[str, Mapping[str, object]] | None = None) -> Config:
    cfg_dir = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}"
    cfg_dir.mkdir()
    (cfg_dir / "kick_key.pem").write_text(fake.public_pem())
    (cfg_dir / "client_secret").write_text(fake.client_secret + "\n")
    sections: dict[str, dict[str, object]] = {
        "daemon": {"instance_id": "kick-test", "state_dir": tmp_path / "state"},
        "chat": {"flush_interval_secs": 0.2},
        "timescale": {"pool_size": 3, "acquire_timeout_secs": 2, "statement_timeout_secs": 5,
                      "connect_timeout_secs": 2},
        "events": {"insert_timeout_secs": 3, "retry_interval_secs": 0.5},
        "redis": {"socket_timeout_secs": 1, "connect_timeout_secs": 1},
        "kick": {"pusher_url": fake.pusher_url, "api_url": fake.api_url, "oauth_url": fake.oauth_url,
                 "client_id": fake.client_id, "client_secret_file": cfg_dir / "client_secret",
                 "webhook_public_key_file": cfg_dir / "kick_key.pem"},
        f"account.{ACCOUNT}": {"kick_broadcaster_user_id": str(BROADCASTER[0]),
                               "kick_chatroom_id": str(CHATROOM), "kick_channel_id": str(CHANNEL)},
    }
    for section, keys in (extra or {}).items():
        sections.setdefault(section, {}).update(keys)
    return make_config(cfg_dir, pg_url=pg_url, redis_url=redis_url, sections=sections)


@dataclass
class KickRig:
    cfg: Config
    fake: KickStandin
    pg_url: str
    metrics: Metrics
    pool: Pool
    redis: redis.Redis
    chat: ChatIngest
    events: EventIngest
    alerts: AlertPublisher
    sessions: StreamSessions
    sink: EventSink
    flusher: ChatFlusher
    sources: list[KickSource] = field(default_factory=list)

    def source(self, **kwargs: Any) -> KickSource:
        # One content-id bucket for the whole test run: a test that sends an event on the
        # socket and again by webhook must not straddle a 5-minute wall-clock boundary (two
        # rows, by design). The mapping tests cover the real bucket size.
        kwargs.setdefault("bucket_secs", TEST_BUCKET_SECS)
        src = KickSource(self.cfg.accounts[0], self.cfg.kick, chat_queue=ChatQueue(self.chat, self.metrics),
                         sink=self.sink, metrics=self.metrics, **kwargs)
        src.reconnect_min_secs = 0.05
        src.reconnect_max_secs = 0.3
        self.sources.append(src)
        return src

    def receiver(self, **kwargs: Any) -> KickWebhook:
        accounts = {a.kick_broadcaster_user_id: a.account_id for a in self.cfg.accounts
                    if a.kick_broadcaster_user_id}
        kwargs.setdefault("max_age_secs", self.cfg.kick.webhook_max_age_secs)
        kwargs.setdefault("bucket_secs", TEST_BUCKET_SECS)
        return KickWebhook(webhook_key(self.cfg), accounts, self.sink, self.chat.buffer_or_persist,
                           SeenDeliveries(self.redis, "kick"), self.metrics, **kwargs)

    @contextmanager
    def serving_webhooks(self, **kwargs: Any) -> Iterator[int]:
        routes = Routes()
        routes.add("POST", PATH, self.receiver(**kwargs).handle, max_body_bytes=MAX_BODY_BYTES)
        with serving(routes, self.metrics) as port:
            self.fake.webhook_url = f"http://127.0.0.1:{port}{PATH}"
            yield port

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

    def event_types(self) -> Counter[str]:
        return Counter(r[0] for r in self.rows("SELECT type FROM events"))


def make_rig(tmp_path: Path, pg_url: str, redis_url: str, fake: KickStandin, *,
             extra: Mapping[str, Mapping[str, object]] | None = None) -> KickRig:
    cfg = kick_config(tmp_path, pg_url, redis_url, fake, extra=extra)
    migrate(cfg.timescale)
    metrics = Metrics()
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    chat = ChatIngest(client, pool, None, metrics, cfg)
    events = EventIngest(client, pool, None, metrics, cfg)
    alerts = AlertPublisher(client, metrics, client_queue_max=16)
    sessions = StreamSessions(pool, metrics, retry_every_secs=0.2)
    sink = EventSink(events.persist_event, alerts=alerts, sessions=sessions)
    flusher = ChatFlusher(client, pool, metrics, cfg)
    alerts.start()
    flusher.start()
    return KickRig(cfg, fake, pg_url, metrics, pool, client, chat, events, alerts, sessions, sink, flusher)
