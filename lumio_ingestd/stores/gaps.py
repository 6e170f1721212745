"""The gaps ledger table `source_gaps`: one row per gap of one account's source path.

`GapTable` writes a row when a gap is found (`open` while it heals, else its
final status at once), closes it with its status and the rows healing stored,
and reads the open rows and the last closed ones for `status`. Every write is
idempotent: the primary key (account_id, platform, source, started_at) makes
a second insert of the same gap a no-op, and a close sets the same values
again.

Durable when `insert` or `close` returns: the row, committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.model import Gap, GapStatus

_INSERT = """
INSERT INTO source_gaps (account_id, platform, source, started_at, ended_at, status, healed_rows,
                         detail, closed_at)
VALUES (%s, %s, %s, %s, %s, %s, 0, %s, CASE WHEN %s = 'open' THEN NULL ELSE now() END)
ON CONFLICT (account_id, platform, source, started_at) DO NOTHING
"""

_CLOSE = """
UPDATE source_gaps SET status = %s, healed_rows = %s, detail = %s, closed_at = now()
 WHERE account_id = %s AND platform = %s AND source = %s AND started_at = %s
"""

_COLUMNS = "account_id, platform, source, started_at, ended_at, status, healed_rows, detail, closed_at"


def ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, UTC)


@dataclass(frozen=True)
class GapRow:
    account_id: int
    platform: str
    source: str
    started_at: datetime
    ended_at: datetime
    status: str
    healed_rows: int
    detail: str | None
    closed_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {"account_id": self.account_id, "platform": self.platform, "source": self.source,
                "started_at": self.started_at.isoformat(), "ended_at": self.ended_at.isoformat(),
                "seconds": round((self.ended_at - self.started_at).total_seconds(), 3),
                "status": self.status, "healed_rows": self.healed_rows, "detail": self.detail,
                "closed_at": self.closed_at.isoformat() if self.closed_at else None}


def insert(cur: Cursor, gap: Gap, status: GapStatus, detail: str | None = None) -> bool:
    k = gap.key
    cur.execute(_INSERT, (k.account_id, k.platform, k.source, ts(gap.started_ms), ts(gap.ended_ms),
                          status, detail, status))
    return bool(cur.rowcount == 1)


def close(cur: Cursor, gap: Gap, status: GapStatus, healed_rows: int, detail: str | None) -> None:
    k = gap.key
    cur.execute(_CLOSE, (status, healed_rows, detail, k.account_id, k.platform, k.source,
                         ts(gap.started_ms)))


def listing(cur: Cursor, *, last: int = 10) -> tuple[list[GapRow], list[GapRow]]:
    """The open gaps (oldest first) and the last `last` closed ones (newest first)."""
    cur.execute(f"SELECT {_COLUMNS} FROM source_gaps WHERE status = 'open' ORDER BY started_at")
    open_rows = [GapRow(*r) for r in cur.fetchall()]
    cur.execute(f"SELECT {_COLUMNS} FROM source_gaps WHERE status <> 'open' "
                "ORDER BY closed_at DESC NULLS LAST, started_at DESC LIMIT %s", (last,))
    return open_rows, [GapRow(*r) for r in cur.fetchall()]


class GapTable:
    """The ledger's handle on the table: one bounded transaction per call."""

    def __init__(self, pool: Pool, *, timeout_secs: float = 3.0) -> None:
        self._pool = pool
        self._timeout = timeout_secs

    def insert(self, gap: Gap, status: GapStatus, detail: str | None = None) -> bool:
        """True when the row is new (a second report of the same gap changes nothing)."""
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            return insert(cur, gap, status, detail)

    def close(self, gap: Gap, status: GapStatus, healed_rows: int, detail: str | None = None) -> None:
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            close(cur, gap, status, healed_rows, detail)

    def open_gaps(self, account_id: int, platform: str, source: str) -> list[tuple[int, int]]:
        """(started, ended) in epoch ms of the path's open rows, oldest first."""
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            cur.execute("SELECT started_at, ended_at FROM source_gaps WHERE account_id = %s AND "
                        "platform = %s AND source = %s AND status = 'open' ORDER BY started_at",
                        (account_id, platform, source))
            return [(round(a.timestamp() * 1000), round(b.timestamp() * 1000)) for a, b in cur.fetchall()]

    def listing(self, *, last: int = 10) -> tuple[list[GapRow], list[GapRow]]:
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            return listing(cur, last=last)
