"""What the demo watches while the daemon works: rows, Redis depths, the daemon's metrics, alerts.

`Observer.sample()` reads, each over a short timeout and each allowed to
fail on its own (the database is stopped on purpose by `--chaos`):

- the database: rows in `chat_messages`, `events`, `event_children` and
  `bsky_records` (and with `exact=True` the distinct keys, to count
  duplicates) over a connection of its own, never the daemon's;
- Redis: the depth of every chat buffer, dead-letter, in-flight and
  quarantine list and of the parked events, read directly;
- the daemon's `/metrics` (parked, recovered, lost, quarantined, spool).

`AlertListener` is a worker thread with `PSUBSCRIBE lumio:alerts:*` that
counts the live alerts the daemon publishes, by event type.

Nothing durable here: everything is read-only.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import psycopg2
import psycopg2.extensions
import redis
from prometheus_client.parser import text_string_to_metric_families

from lumio_ingestd.devkit.demo.traffic import SentCounts
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.demo.observe")

Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True)
class Rows:
    chat: int
    events: int
    children: int
    bluesky: int
    chat_distinct: int | None = None  # distinct (account, platform, message id), with exact=True
    events_distinct: int | None = None  # distinct (account, external id): every Twitch event has one
    viewers: int | None = None  # stream_stats: both channels' peak in the latest minute written


@dataclass(frozen=True)
class Depths:
    chat_buffer: int
    chat_deadletter: int
    chat_inflight: int
    chat_quarantine: int
    events_parked: int
    events_inflight: int
    events_quarantine: int

    @property
    def chat_waiting(self) -> int:
        return self.chat_buffer + self.chat_deadletter + self.chat_inflight

    @property
    def events_waiting(self) -> int:
        return self.events_parked + self.events_inflight


@dataclass(frozen=True)
class Snapshot:
    at: float  # monotonic
    sent: SentCounts
    rows: Rows | None  # None: the database did not answer
    depths: Depths | None  # None: Redis did not answer
    metrics: Samples | None  # None: the daemon's /metrics did not answer
    alerts: int

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples called `name` whose labels include `labels` (0 if none)."""
        if self.metrics is None:
            return 0.0
        want = set(labels.items())
        return sum(v for (n, ls), v in self.metrics.items() if n == name and want <= set(ls))


class Observer:
    def __init__(self, database_url: str, client: redis.Redis, account_ids: tuple[int, ...]) -> None:
        self._database_url = database_url
        self._redis = client
        self._accounts = account_ids
        self._conn: psycopg2.extensions.connection | None = None
        self.metrics_port: int | None = None

    def close(self) -> None:
        self._drop_connection()

    def sample(self, sent: SentCounts, alerts: int, *, exact: bool = False,
               metrics: bool = True) -> Snapshot:
        return Snapshot(time.monotonic(), sent, self.rows(exact), self.depths(),
                        self.scrape() if metrics else None, alerts)

    # -- the database ------------------------------------------------------------------------

    def rows(self, exact: bool = False) -> Rows | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg2.connect(self._database_url, connect_timeout=2,
                                              options="-c statement_timeout=5000")
                self._conn.autocommit = True
            with self._conn.cursor() as cur:
                cur.execute("SELECT (SELECT count(*) FROM chat_messages), (SELECT count(*) FROM events), "
                            "(SELECT count(*) FROM event_children), (SELECT count(*) FROM bsky_records), "
                            "(SELECT sum(viewers_max) FROM stream_stats "
                            " WHERE ts = (SELECT max(ts) FROM stream_stats))")
                chat, events, children, bluesky, viewers = cur.fetchone() or (0, 0, 0, 0, None)
                viewers = int(viewers) if viewers is not None else None
                if not exact:
                    return Rows(chat, events, children, bluesky, viewers=viewers)
                cur.execute("SELECT count(*) FROM (SELECT DISTINCT account_id, platform, message_id "
                            "FROM chat_messages) d")
                chat_distinct = (cur.fetchone() or (0,))[0]
                cur.execute("SELECT count(DISTINCT (account_id, platform, external_id)) FROM events")
                events_distinct = (cur.fetchone() or (0,))[0]
                return Rows(chat, events, children, bluesky, chat_distinct, events_distinct, viewers)
        except psycopg2.Error:
            # Expected while --chaos has the database stopped: shown as "db down".
            self._drop_connection()
            return None

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg2.Error:
                pass
            self._conn = None

    # -- Redis ----------------------------------------------------------------------------------

    def depths(self) -> Depths | None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for account in self._accounts:
                pipe.llen(rediskeys.chat_buffer(account))
                pipe.llen(rediskeys.chat_deadletter(account))
                pipe.llen(rediskeys.chat_quarantine(account))
                pipe.llen(rediskeys.events_deadletter(account))
                pipe.llen(rediskeys.events_quarantine(account))
            lengths = [int(n) for n in pipe.execute()]
            inflight = {"chat": 0, "events": 0}
            for kind in inflight:
                for key in self._redis.scan_iter(match=f"lumio:{kind}:inflight:*", count=500):
                    inflight[kind] += int(self._redis.llen(key))
        except REDIS_ERRORS:
            return None
        per = [lengths[i::5] for i in range(5)]
        return Depths(chat_buffer=sum(per[0]), chat_deadletter=sum(per[1]), chat_quarantine=sum(per[2]),
                      events_parked=sum(per[3]), events_quarantine=sum(per[4]),
                      chat_inflight=inflight["chat"], events_inflight=inflight["events"])

    # -- the daemon's metrics ----------------------------------------------------------------------

    def scrape(self) -> Samples | None:
        if self.metrics_port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        return {(s.name, tuple(sorted(s.labels.items()))): float(s.value)
                for family in text_string_to_metric_families(text) for s in family.samples}


class AlertListener(Worker):
    """Counts the alerts on `lumio:alerts:*`, by event type."""

    max_turn_secs = 30.0

    def __init__(self, client: redis.Redis, metrics: Metrics) -> None:
        super().__init__("demo-alerts", metrics)
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        self._lock = threading.Lock()
        self._by_type: Counter[str] = Counter()

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._by_type.values())

    def by_type(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_type)

    def start(self) -> None:
        self._pubsub.psubscribe("lumio:alerts:*")
        super().start()

    def run_once(self) -> float:
        message = self._pubsub.get_message(timeout=0.2)
        if message is not None and message.get("type") == "pmessage":
            try:
                kind = json.loads(message["data"]).get("type", "?")
            except (ValueError, AttributeError):
                kind = "?"
            with self._lock:
                self._by_type[str(kind)] += 1
        return 0.0

    def final(self) -> None:
        self._pubsub.close()
