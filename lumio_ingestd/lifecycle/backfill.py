"""Startup backfills, on a pool of their own.

They run on a one-connection pool without `statement_timeout`, which is closed
once they finish, so a long backfill neither holds one of the daemon's pooled
connections nor inherits its limit. Query helpers take the cursor of the
transaction they run in; acquiring from the backfill pool again while its one
connection is held fails at once with `PoolReentryError` instead of stalling
the boot.

Durable when `run_backfills` returns: each backfill's transaction committed.
"""

from __future__ import annotations

import logging

from lumio_ingestd.config import Config
from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import STOP_GRACE_SECS, Worker

log = logging.getLogger("lumio_ingestd.lifecycle.backfill")


def link_events_to_sessions(cur: Cursor) -> int:
    """Set `events.stream_session_id` where a session's time range holds the event."""
    cur.execute("""
        UPDATE events e SET stream_session_id = s.id
          FROM stream_sessions s
         WHERE e.stream_session_id IS NULL
           AND e.account_id = s.account_id AND e.platform = s.platform
           AND e.created_at >= s.started_at
           AND (s.ended_at IS NULL OR e.created_at < s.ended_at)""")
    return int(cur.rowcount)


def backfill_pool(cfg: Config) -> Pool:
    return Pool(cfg.timescale, name="backfill", size=1, statement_timeout_secs=0)


def run_backfills(cfg: Config, pool: Pool | None = None) -> dict[str, int]:
    """Run every backfill on `pool` (a fresh backfill pool, closed afterwards, by default)."""
    own = pool is None
    bp = backfill_pool(cfg) if pool is None else pool
    try:
        results: dict[str, int] = {}
        with bp.transaction() as cur:
            results["link_events_to_sessions"] = link_events_to_sessions(cur)
        log.info("startup backfills done: %s", results)
        return results
    finally:
        if own:
            bp.close()


class StartupBackfill(Worker):
    """Runs the backfills once after start, off the boot path; retried with backoff
    while the database is away; then idles until the stop."""

    max_turn_secs = 6 * 3600.0

    def __init__(self, cfg: Config, metrics: Metrics) -> None:
        super().__init__("startup-backfill", metrics)
        self._cfg = cfg
        self._pool: Pool | None = None
        self.results: dict[str, int] | None = None

    def run_once(self) -> float:
        if self.results is None:
            self._pool = backfill_pool(self._cfg)
            try:
                self.results = run_backfills(self._cfg, self._pool)
            finally:
                self._pool.close()
        return _IDLE_SECS

    def wake(self) -> None:
        if self._pool is not None:
            self._pool.expire_calls_of(self.ident, STOP_GRACE_SECS)


_IDLE_SECS = 86_400.0
