"""GDPR erasure and export of a platform user's (or an account's) data.

Erasure deletes, in one unbounded transaction, every chat message, event and
event child row of the platform user across accounts, then removes their
entries from the Redis buffers, dead-letter lists, in-flight lists and
quarantines, and, given the refused-frame file (`FrameQuarantine`), drops
every refused frame of the platform that names the user and takes donor PII
out of the others (the daemon strips it before keeping a frame; a file an
older version wrote may still hold some). Export streams JSON Lines from a server-side cursor, so a large
history never sits in memory.

Durable when `erase_user` returns: the database deletes are committed; the
Redis removals are done (each list atomically); the refused-frame file is
rewritten (fsynced, then renamed into place).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TextIO
from uuid import UUID

import redis

from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.lifecycle.redis_purge import purge_user
from lumio_ingestd.model import format_time
from lumio_ingestd.stores.refused_frames import FrameQuarantine

log = logging.getLogger("lumio_ingestd.lifecycle.gdpr")


@dataclass
class ErasureReceipt:
    platform: str
    user_id: str
    chat_messages: int
    events: int
    event_children: int
    redis_entries: int
    redis_children: int
    #: Refused frames dropped because they name the user, and PII fields removed from the others.
    refused_frames: int = 0
    refused_frames_pii: int = 0

    def to_json(self) -> str:
        return json.dumps({"erasure": asdict(self)}, sort_keys=True)


def erase_user(pool: Pool, client: redis.Redis, platform: str, user_id: str,
               frames: FrameQuarantine | None = None) -> ErasureReceipt:
    with pool.begin_unbounded() as cur:
        cur.execute("DELETE FROM chat_messages WHERE platform = %s AND user_id = %s", (platform, user_id))
        chat = cur.rowcount
        # Children of the user's own events go with them; the user as a gift
        # recipient of someone else's event loses only their child row.
        cur.execute("""DELETE FROM event_children c USING events e
                        WHERE c.event_id = e.id AND c.event_created_at = e.created_at
                          AND e.platform = %s AND e.user_id = %s""", (platform, user_id))
        children = cur.rowcount
        cur.execute("""DELETE FROM event_children c USING events e
                        WHERE c.event_id = e.id AND c.event_created_at = e.created_at
                          AND e.platform = %s AND c.user_id = %s""", (platform, user_id))
        children += cur.rowcount
        cur.execute("DELETE FROM events WHERE platform = %s AND user_id = %s", (platform, user_id))
        events = cur.rowcount
    entries, redis_children = purge_user(client, platform, user_id)
    receipt = ErasureReceipt(platform, user_id, chat, events, children, entries, redis_children)
    if frames is not None:
        receipt.refused_frames, receipt.refused_frames_pii = frames.erase(platform, user_id)
    log.info("gdpr erase of a %s user: %s", platform, receipt.to_json())
    return receipt


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, UUID):
        return str(value)
    return value


def _stream(cur: Cursor, table: str, sql: str, params: tuple[Any, ...]) -> Iterator[str]:
    cur.execute(sql, params)
    names: list[str] = []
    for row in cur:
        if not names:  # a server-side cursor describes its rows with the first fetch
            names = [d.name for d in cur.description or ()]
        obj = {"table": table}
        obj.update({n: _jsonable(v) for n, v in zip(names, row, strict=True)})
        yield json.dumps(obj, ensure_ascii=False, sort_keys=True)


def _queries(account: int | None, platform: str | None,
             user_id: str | None) -> list[tuple[str, str, tuple[Any, ...]]]:
    if account is not None:
        a = (account,)
        return [
            ("chat_messages", "SELECT * FROM chat_messages WHERE account_id = %s ORDER BY created_at", a),
            ("events", "SELECT * FROM events WHERE account_id = %s ORDER BY created_at", a),
            ("event_children", """SELECT c.* FROM event_children c JOIN events e
                                    ON c.event_id = e.id AND c.event_created_at = e.created_at
                                 WHERE e.account_id = %s ORDER BY c.event_created_at, c.ordinal""", a),
            ("stream_sessions", "SELECT * FROM stream_sessions WHERE account_id = %s ORDER BY started_at", a),
            ("stream_stats", "SELECT * FROM stream_stats WHERE account_id = %s ORDER BY ts", a),
        ]
    u = (platform, user_id)
    return [
        ("chat_messages", "SELECT * FROM chat_messages WHERE platform = %s AND user_id = %s "
                          "ORDER BY created_at", u),
        ("events", "SELECT * FROM events WHERE platform = %s AND user_id = %s ORDER BY created_at", u),
        ("event_children", """SELECT c.* FROM event_children c JOIN events e
                                ON c.event_id = e.id AND c.event_created_at = e.created_at
                             WHERE e.platform = %s AND c.user_id = %s
                             ORDER BY c.event_created_at, c.ordinal""", u),
    ]


def export(pool: Pool, out: TextIO, *, account: int | None = None, platform: str | None = None,
           user_id: str | None = None, itersize: int = 2000) -> dict[str, int]:
    """Write every matching row as one JSON line; returns rows written per table."""
    if (account is None) == (platform is None or user_id is None):
        raise ValueError("export needs either an account, or a platform and a user id")
    counts: dict[str, int] = {}
    # One read-only transaction (a consistent snapshot across the tables) with
    # the statement limit lifted; the pool rolls it back on return. A named
    # cursor is server-side: rows arrive `itersize` at a time.
    with pool.connection(bounded=False) as conn:
        with conn.cursor() as setup:
            setup.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            setup.execute("SET LOCAL statement_timeout = 0")
        for i, (table, sql, params) in enumerate(_queries(account, platform, user_id)):
            with conn.cursor(name=f"lumio_export_{i}") as cur:
                cur.itersize = itersize
                n = 0
                for line in _stream(cur, table, sql, params):
                    out.write(line + "\n")
                    n += 1
                counts[table] = n
        conn.rollback()
    return counts
