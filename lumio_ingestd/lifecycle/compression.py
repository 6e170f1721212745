"""The daemon's compression timer: sets compression up once, then runs its policies.

TimescaleDB's own scheduler runs the columnstore policies too, but on TimescaleDB
2.28.3 with PostgreSQL 15.20 it marks each run failed after the work is done and
backs off (see `lumio_ingestd.db.compression`): compression must not hang on it.
So every `interval_secs` one replica (shard 0, or the lease holder with
`shard = auto`) runs each policy's job in a session of its own (`CALL run_job`),
which compresses the chunks that are due and nothing else; a run with nothing due
costs a catalogue lookup. After each run the chunk and byte gauges are updated.

The first turn also applies `[timescale] compress_after_hours` (settings and
policies), and on plain PostgreSQL logs the one warning that the key does nothing.

Durable when a turn returns: every chunk it compressed (one commit per chunk).
"""

from __future__ import annotations

import logging
import threading

import psycopg2
import psycopg2.extensions

from lumio_ingestd.config import Config
from lumio_ingestd.db.compression import CompressionState, ensure_compression, run_policies, session, storage
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import IntervalWorker

log = logging.getLogger("lumio_ingestd.lifecycle.compression")

#: How often the policies run. Chunks become due once per chunk interval (a day of
#: chat), so an hour's delay costs nothing, and an idle run is a few catalogue reads.
COMPRESSION_INTERVAL_SECS = 3600.0


class CompressionWorker(IntervalWorker):
    """Applies the compression settings on its first turn, then runs the policies."""

    max_turn_secs = 6 * 3600.0  # a first run over weeks of chunks takes long

    def __init__(self, cfg: Config, metrics: Metrics,
                 interval_secs: float = COMPRESSION_INTERVAL_SECS) -> None:
        super().__init__("timescale-compression", metrics, interval_secs)
        self._cfg = cfg
        self.state: CompressionState | None = None
        self.compressed: dict[str, int] = {}  # chunks compressed by this process, by table
        self._conn_lock = threading.Lock()
        self._conn: psycopg2.extensions.connection | None = None

    def _track(self, conn: psycopg2.extensions.connection | None) -> None:
        with self._conn_lock:
            self._conn = conn

    def tick(self) -> None:
        if self.state is None:
            self.state = ensure_compression(self._cfg.timescale)
        if not self.state.policies:
            return
        try:
            done = run_policies(self._cfg.timescale, self._track)
        except Exception:
            self.metrics.timescale_compression_runs.labels("failed").inc()
            raise
        self.metrics.timescale_compression_runs.labels("ok").inc()
        for table, n in done.items():
            self.compressed[table] = self.compressed.get(table, 0) + n
        if any(done.values()):
            log.info("compression: chunks compressed: %s", done)
        self._gauges()

    def _gauges(self) -> None:
        with session(self._cfg.timescale, self._track) as conn:
            tables = storage(conn) or []
        for t in tables:
            self.metrics.timescale_chunks.labels(t.table, "compressed").set(t.compressed_chunks)
            self.metrics.timescale_chunks.labels(t.table, "uncompressed").set(t.uncompressed_chunks)
            self.metrics.timescale_bytes.labels(t.table, "compressed_before").set(t.compressed_before_bytes)
            self.metrics.timescale_bytes.labels(t.table, "compressed_after").set(t.compressed_after_bytes)
            self.metrics.timescale_bytes.labels(t.table, "uncompressed").set(t.uncompressed_bytes)

    def wake(self) -> None:
        # Stopping: cancel the chunk being compressed (it rolls back; the ones
        # before it stay compressed) instead of waiting for it.
        with self._conn_lock:
            conn = self._conn
        if conn is not None:
            try:
                conn.cancel()
            except psycopg2.Error as exc:
                log.debug("cancel failed: %s", exc)
