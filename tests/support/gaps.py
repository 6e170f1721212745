"""A rig for the gaps tests: the ledger and heal threads on real Redis and PostgreSQL.

`GapRig` wires what runtime/build.py wires (SourceSeen, GapTable, HealQueue,
GapLedgerWorker, HealWorker threads) with short intervals, and reads the
ledger back over a connection of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg2
import redis

from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events.gaps import GapLedgerWorker, HealQueue, HealWorker
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.gaps import GapTable
from lumio_ingestd.stores.sourceseen import SourceSeen
from support.harness.servers import wait_until


@dataclass
class GapRig:
    pg_url: str
    metrics: Metrics
    ledger: GapLedgerWorker
    queue: HealQueue
    table: GapTable
    healers: list[HealWorker] = field(default_factory=list)

    def start(self) -> GapRig:
        self.ledger.start()
        for h in self.healers:
            h.start()
        return self

    def stop(self) -> None:
        for w in (self.ledger, *self.healers):
            w.request_stop()
        for w in (self.ledger, *self.healers):
            assert w.join(15), f"{w.name} did not stop"

    def rows(self) -> list[dict[str, Any]]:
        conn = psycopg2.connect(self.pg_url, connect_timeout=5)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT account_id, platform, source, started_at, ended_at, status, "
                            "healed_rows, detail FROM source_gaps ORDER BY started_at, platform, source")
                names = [d[0] for d in cur.description or ()]
                return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        finally:
            conn.close()

    def wait_rows(self, n: int, *, closed: bool = True, timeout: float = 20.0) -> list[dict[str, Any]]:
        def done() -> bool:
            rows = self.rows()
            return len(rows) >= n and (not closed or all(r["status"] != "open" for r in rows))
        assert wait_until(done, timeout, interval=0.1), self.rows()
        return self.rows()

    def value(self, name: str, **labels: str) -> float:
        v = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v


def make_gap_rig(pool: Pool, client: redis.Redis, metrics: Metrics, pg_url: str, *,
                 seen_interval_secs: float = 0.2, heal_max_hours: float = 72.0, heal_threads: int = 2,
                 max_tries: int = 4, retry_min_secs: float = 0.1,
                 retry_max_secs: float = 0.5) -> GapRig:
    queue = HealQueue()
    table = GapTable(pool)
    ledger = GapLedgerWorker(SourceSeen(client), table, metrics, queue,
                             seen_interval_secs=seen_interval_secs)
    healers = [HealWorker(f"gap-heal-{n}", queue, table, metrics, heal_max_hours=heal_max_hours,
                          max_tries=max_tries, retry_min_secs=retry_min_secs,
                          retry_max_secs=retry_max_secs, poll_secs=0.1)
               for n in range(1, heal_threads + 1)]
    return GapRig(pg_url, metrics, ledger, queue, table, healers)


def seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()
