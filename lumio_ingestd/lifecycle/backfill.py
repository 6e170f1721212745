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

from ..config import Config
from ..db.pool import Cursor, Pool

log = logging.getLogger(__name__)


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


def run_backfills(cfg: Config) -> dict[str, int]:
    pool = backfill_pool(cfg)
    try:
        results: dict[str, int] = {}
        with pool.transaction() as cur:
            results["link_events_to_sessions"] = link_events_to_sessions(cur)
        log.info("startup backfills done: %s", results)
        return results
    finally:
        pool.close()
