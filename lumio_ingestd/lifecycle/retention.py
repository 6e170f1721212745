"""Retention: deleting chat and events older than their horizons.

Plain tables are trimmed in bounded batches, each batch its own unbounded
transaction (short locks, steady progress, nothing half done: a batch either
commits or leaves its rows for the next run). Where a table is a TimescaleDB
hypertable, whole chunks past the horizon are dropped instead, which costs
nothing per row (their rows are counted first, so the report says the same on
both). The batches' outer scan is bounded by the horizon too: on a hypertable
it then reaches only the one chunk that straddles it, and never decompresses
the compressed chunks after it.

Durable when `run_retention` returns: every batch it counted is committed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lumio_ingestd.config import Config
from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import STOP_GRACE_SECS, IntervalWorker

log = logging.getLogger("lumio_ingestd.lifecycle.retention")

DAY_SECS = 86_400.0


@dataclass
class RetentionReport:
    deleted: dict[str, int] = field(default_factory=dict)
    dropped_chunks: dict[str, int] = field(default_factory=dict)
    complete: bool = True

    def summary(self) -> str:
        parts = [f"{table}: {n} rows" for table, n in self.deleted.items()]
        parts += [f"{table}: {n} chunks" for table, n in self.dropped_chunks.items()]
        return ", ".join(parts) + ("" if self.complete else " (interrupted)")


def _is_hypertable(cur: Cursor, table: str) -> bool:
    cur.execute("SELECT to_regclass('timescaledb_information.hypertables') IS NOT NULL")
    row = cur.fetchone()
    if not row or not row[0]:
        return False
    cur.execute("SELECT EXISTS (SELECT 1 FROM timescaledb_information.hypertables "
                "WHERE hypertable_name = %s)", (table,))
    row = cur.fetchone()
    return bool(row and row[0])


# Each table's time column and primary key. Batches are chosen by key, not
# ctid: on a hypertable a ctid is only unique within one chunk.
_TABLES = {
    "chat_messages": ("created_at", "account_id, platform, message_id, created_at"),
    "events": ("created_at", "id, created_at"),
    "event_children": ("event_created_at", "event_id, ordinal"),
}


def _delete_batch(cur: Cursor, table: str, horizon: datetime, batch_size: int) -> int:
    column, key = _TABLES[table]
    cur.execute(
        f"DELETE FROM {table} WHERE {column} < %s AND ({key}) IN ("
        f"SELECT {key} FROM {table} WHERE {column} < %s LIMIT %s)",
        (horizon, horizon, batch_size),
    )
    return int(cur.rowcount)


def _drop_chunks(cur: Cursor, table: str, horizon: datetime) -> tuple[int, int]:
    """Drop the chunks wholly past the horizon: (chunks, rows they held)."""
    cur.execute("SELECT c::text FROM show_chunks(%s, older_than => %s) c", (table, horizon))
    chunks = [str(r[0]) for r in cur.fetchall()]
    rows = 0
    for chunk in chunks:  # a chunk's name is TimescaleDB's own, schema-qualified
        cur.execute(f"SELECT count(*) FROM {chunk}")
        row = cur.fetchone()
        rows += int(row[0]) if row else 0
    cur.execute("SELECT count(*) FROM drop_chunks(%s, older_than => %s)", (table, horizon))
    row = cur.fetchone()
    dropped = int(row[0]) if row else 0
    if dropped != len(chunks):  # the count is taken in the same transaction: cannot differ
        raise RuntimeError(f"retention: {table}: counted {len(chunks)} chunks, dropped {dropped}")
    return dropped, rows


def run_retention(pool: Pool, cfg: Config, *, now: datetime | None = None,
                  batch_size: int = 10_000, stop: threading.Event | None = None) -> RetentionReport:
    """Delete what is past its horizon. `stop` ends it between batches."""
    now = now or datetime.now(UTC)
    horizons = {
        "chat_messages": now - timedelta(days=cfg.chat.retention_days),
        "events": now - timedelta(days=cfg.events.retention_days),
        # Children go with their events: same horizon, by the event's time.
        "event_children": now - timedelta(days=cfg.events.retention_days),
    }
    report = RetentionReport()
    for table, horizon in horizons.items():
        total = 0
        with pool.begin_unbounded() as cur:
            hyper = _is_hypertable(cur, table)
            if hyper:
                report.dropped_chunks[table], total = _drop_chunks(cur, table, horizon)
        while True:
            if stop is not None and stop.is_set():
                report.complete = False
                break
            # Rows a dropped chunk did not cover (a chunk straddling the horizon).
            with pool.begin_unbounded() as cur:
                n = _delete_batch(cur, table, horizon, batch_size)
            total += n
            if n < batch_size:
                break
        report.deleted[table] = total
        log.info("retention: %s older than %s: %d rows deleted%s", table,
                 horizon.isoformat(timespec="seconds"), total,
                 f", {report.dropped_chunks.get(table, 0)} chunks dropped" if hyper else "")
        if not report.complete:
            break
    return report


class RetentionWorker(IntervalWorker):
    """Runs retention once a day (or every `interval_secs`), between stops."""

    max_turn_secs = 6 * 3600.0  # a first run over a large backlog takes long

    def __init__(self, pool: Pool, cfg: Config, metrics: Metrics,
                 interval_secs: float = DAY_SECS, batch_size: int = 10_000) -> None:
        super().__init__("retention", metrics, interval_secs)
        self._pool = pool
        self._cfg = cfg
        self._batch_size = batch_size

    def tick(self) -> None:
        report = run_retention(self._pool, self._cfg, batch_size=self._batch_size,
                               stop=self.stop_event)
        log.info("retention run: %s", report.summary())

    def wake(self) -> None:
        # A long batch must not hold the shutdown: cut it (it rolls back whole).
        self._pool.expire_calls_of(self.ident, STOP_GRACE_SECS)
