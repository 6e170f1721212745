"""Shared pieces of the chat durability tests: a rig of real clients, and the oracle.

A `ChatRig` is one daemon's worth of chat plumbing (config, pool, Redis client,
metrics) against real servers, with factories for the ingest, the flusher and
the drain. The oracle reads the database over a connection of its own and
Redis over a client of its own, never the ones under test.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import redis

from lumio_ingestd.chat.deadletter import ChatDeadLetterDrain
from lumio_ingestd.chat.flusher import ChatFlusher, flush_threads
from lumio_ingestd.chat.ingest import ChatIngest
from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import connect
from lumio_ingestd.stores.spool import Spool
from support import make_config

BASE_TIME = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)



def chat_config(tmp_path: Path, pg_url: str, redis_url: str, *, instance: str = "test-1",
                chat: Mapping[str, object] | None = None,
                timescale: Mapping[str, object] | None = None) -> Config:
    """Short intervals and timeouts, so that faults show within a second or two."""
    ch: dict[str, object] = {"flush_interval_secs": 0.2, "flush_batch_size": 100,
                             "max_flush_failures": 3, "deadletter_drain_interval_secs": 1,
                             "deadletter_ttl_hours": 72}
    ch.update(chat or {})
    ts: dict[str, object] = {"pool_size": 3, "acquire_timeout_secs": 1,
                             "statement_timeout_secs": 5, "connect_timeout_secs": 2}
    ts.update(timescale or {})
    cfg_dir = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}"
    cfg_dir.mkdir()
    return make_config(cfg_dir, pg_url=pg_url, redis_url=redis_url, sections={
        "daemon": {"instance_id": instance, "state_dir": tmp_path / "state"},
        "chat": ch, "timescale": ts, "events": {"insert_timeout_secs": 3},
        "redis": {"socket_timeout_secs": 1, "connect_timeout_secs": 1}})


def make_messages(n: int, *, account: int = 7, prefix: str | None = None,
                  start: int = 0) -> list[ChatMessage]:
    """`n` distinct messages with deterministic bodies; ids are PREFIX-SEQ."""
    prefix = prefix or uuid.uuid4().hex[:8]
    return [
        ChatMessage.create(
            platform="twitch", account_id=account, message_id=f"{prefix}-{i}",
            created_at=BASE_TIME + timedelta(microseconds=i * 1001),
            user_id=f"u{i % 17}", user_login=f"login{i % 17}", display_name=f"Name {i % 17}",
            text=f"message {i}: tab\there, newline\nthere, backslash \\ done",
            extras={"badges": [{"set_id": "sub", "id": "3"}], "seq": i})
        for i in range(start, start + n)
    ]


@dataclass
class ChatRig:
    cfg: Config
    pool: Pool
    client: redis.Redis
    metrics: Metrics
    pg_dsn: str  # libpq key/value DSN of the database, for the oracle
    redis_url: str
    _closers: list[Any] = field(default_factory=list)

    def ingest(self, spool: Spool | None = None, **kwargs: Any) -> ChatIngest:
        return ChatIngest(self.client, self.pool, spool, self.metrics, self.cfg, **kwargs)

    def flusher(self, *, metrics: Metrics | None = None, **kwargs: Any) -> ChatFlusher:
        flusher = ChatFlusher(self.client, self.pool, metrics or self.metrics, self.cfg, **kwargs)
        self._closers.append(flusher)
        return flusher

    def flush_threads(self, **kwargs: Any) -> list[ChatFlusher]:
        """The daemon's flush threads (`[chat] flush_workers` of them, within the pool)."""
        threads = flush_threads(self.client, self.pool, self.metrics, self.cfg, **kwargs)
        self._closers += threads
        return threads

    def drain(self, *, metrics: Metrics | None = None, **kwargs: Any) -> ChatDeadLetterDrain:
        drain = ChatDeadLetterDrain(self.client, self.pool, metrics or self.metrics, self.cfg, **kwargs)
        self._closers.append(drain)
        return drain

    def spool(self, max_bytes: int = 64 * 1024 * 1024) -> Spool:
        spool = Spool(self.cfg.daemon.state_dir / "spool", max_bytes, self.metrics)
        spool.open()
        self._closers.append(spool)
        return spool

    def close(self) -> None:
        for item in reversed(self._closers):
            if isinstance(item, (ChatFlusher, ChatDeadLetterDrain)):
                item.request_stop()
                item.join(10)
            else:
                item.close()
        self.pool.close()
        self.client.close()

    # -- the oracle ------------------------------------------------------------

    @contextmanager
    def db(self) -> Iterator[psycopg2.extensions.connection]:
        conn = psycopg2.connect(self.pg_dsn, connect_timeout=5)
        conn.autocommit = True
        try:
            yield conn
        finally:
            conn.close()

    def stored(self) -> Counter[str]:
        """message_id -> number of rows."""
        with self.db() as conn, conn.cursor() as cur:
            cur.execute("SELECT message_id, count(*) FROM chat_messages GROUP BY message_id")
            return Counter({mid: int(n) for mid, n in cur.fetchall()})

    def rows(self) -> dict[str, tuple[Any, ...]]:
        with self.db() as conn, conn.cursor() as cur:
            cur.execute("SELECT message_id, account_id, platform, created_at, user_id, user_login, "
                        "display_name, text, extras FROM chat_messages")
            return {r[0]: r[1:] for r in cur.fetchall()}

    def oracle_redis(self) -> redis.Redis:
        client = redis.Redis.from_url(self.redis_url, socket_timeout=2)
        self._closers.append(client)
        return client

    def quarantined(self, account: int) -> list[dict[str, Any]]:
        raw = self.oracle_redis().lrange(rediskeys.chat_quarantine(account), 0, -1)
        return [json.loads(r) for r in raw]

    def chat_keys(self) -> list[str]:
        """Every chat list left in Redis (the drain's lease key aside)."""
        return sorted(k.decode() for k in self.oracle_redis().scan_iter(match="lumio:chat:*")
                      if k.decode() != rediskeys.CHAT_DRAIN_LEADER)


def make_rig(tmp_path: Path, pg_url: str, pg_dsn: str, redis_url: str, **kwargs: Any) -> ChatRig:
    cfg = chat_config(tmp_path, pg_url, redis_url, **kwargs)
    migrate(cfg.timescale)
    return ChatRig(cfg=cfg, pool=Pool(cfg.timescale), client=connect(cfg.redis), metrics=Metrics(),
                   pg_dsn=pg_dsn, redis_url=redis_url)


def counter_value(metrics: Metrics, name: str, labels: Mapping[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, dict(labels or {}))
    return 0.0 if value is None else value


def assert_exactly_once(stored: Counter[str], sent: Iterable[str], *,
                        quarantined: Iterable[str] = (), lost: Iterable[str] = ()) -> None:
    """Every message sent is stored exactly once, or quarantined, or counted lost; nothing else."""
    sent = set(sent)
    quarantined, lost = set(quarantined), set(lost)
    assert not (quarantined & lost)
    dupes = {mid: n for mid, n in stored.items() if n != 1}
    assert not dupes, f"stored more than once: {sorted(dupes)[:10]}"
    unknown = set(stored) - sent
    assert not unknown, f"stored but never sent: {sorted(unknown)[:10]}"
    missing = sent - set(stored) - quarantined - lost
    assert not missing, f"{len(missing)} sent messages neither stored, quarantined nor lost: " \
                        f"{sorted(missing)[:10]}"
    both = set(stored) & (quarantined | lost)
    assert not both, f"stored and also quarantined/lost: {sorted(both)[:10]}"
