"""The SQL of storing one platform event (and its child rows) idempotently.

Every writer of `events` goes through `insert_event`: the inline path, the
replay of parked events, the spool replay and the fail-fast REST emit. They
must all take the same advisory lock, or the dedup below stops holding.

- With an `external_id` (the platform's own id of the event): in the caller's
  READ COMMITTED transaction, `pg_advisory_xact_lock` on a hash of
  (account_id, platform, external_id), then an `EXISTS` probe on events_dedup_idx bounded
  to `DEDUP_WINDOW` on either side of `created_at`, then the INSERT. A
  hypertable cannot carry a unique index on (account_id, external_id) without
  the time column, hence the lock. READ COMMITTED matters: in REPEATABLE READ
  the snapshot is taken by the lock statement itself, before the lock is
  granted, and EXISTS would miss the previous holder's row (RELIABILITY.md
  2.6). The pool sets READ COMMITTED on every connection.
- Without one: `ON CONFLICT (id, created_at) DO NOTHING`; the id and
  created_at are fixed once, before the first attempt, so a replay conflicts
  with the stored row.

Child rows (gift-bundle recipients) are written in the same transaction, only
when the event row itself is new (a duplicate's children were written with
the row that is already stored).

Nothing is durable when `insert_event` returns: the caller's transaction
commits it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta

import psycopg2.extensions
import psycopg2.extras

from ..model import PlatformEvent

Cursor = psycopg2.extensions.cursor

# How far either side of an event's created_at the dedup probe looks for the
# same external_id. It must cover a platform's redelivery of one event (the
# same external_id with a delivery timestamp a little later) and the replay
# of a parked entry, which keeps its original created_at and is refused
# after 72 h anyway. Bounding the probe keeps it on the chunks around the
# event instead of every chunk of the hypertable, so the 3 s inline bound does
# not shrink as the table grows. An event redelivered more than this far
# apart would be stored twice; no platform we ingest redelivers that late.
DEDUP_WINDOW = timedelta(hours=72)

# The lock key every writer derives from (account_id, platform, external_id):
# platforms' ids are their own (a Kick and a Twitch stream may share a number).
# A hash collision only serialises two unrelated events.
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s::text || ':' || %s || ':' || %s, 0))"

_EXISTS = """
SELECT EXISTS (
    SELECT 1 FROM events
    WHERE account_id = %s AND external_id = %s AND platform = %s
      AND created_at BETWEEN %s AND %s
)
"""

_INSERT = """
INSERT INTO events (id, created_at, account_id, platform, type, external_id, user_id, payload)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id, created_at) DO NOTHING
"""

# The replay's statements, prepared once per connection (`prepare_replay`),
# so a replay of many events parses them once instead of per event:
# `_INSERT`, and `_EXISTS` and `_INSERT` as one statement. The probe is the
# same and still runs after the lock statement, on the snapshot the INSERT
# takes when it starts (READ COMMITTED).
_PREPARED = {
    "lumio_replay_insert": """
PREPARE lumio_replay_insert (uuid, timestamptz, bigint, text, text, text, text, jsonb) AS
INSERT INTO events (id, created_at, account_id, platform, type, external_id, user_id, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (id, created_at) DO NOTHING""",
    "lumio_replay_insert_unless_seen": """
PREPARE lumio_replay_insert_unless_seen
    (uuid, timestamptz, bigint, text, text, text, text, jsonb, timestamptz, timestamptz) AS
INSERT INTO events (id, created_at, account_id, platform, type, external_id, user_id, payload)
SELECT $1, $2, $3, $4, $5, $6, $7, $8
WHERE NOT EXISTS (
    SELECT 1 FROM events
    WHERE account_id = $3 AND external_id = $6 AND platform = $4
      AND created_at BETWEEN $9 AND $10
)
ON CONFLICT (id, created_at) DO NOTHING""",
}
_EXEC_INSERT = "EXECUTE lumio_replay_insert (%s, %s, %s, %s, %s, %s, %s, %s)"
_EXEC_INSERT_UNLESS_SEEN = ("EXECUTE lumio_replay_insert_unless_seen "
                            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")

_IDS_PRESENT = "SELECT id FROM events WHERE created_at BETWEEN %s AND %s AND id = ANY(%s)"

_INSERT_CHILDREN = """
INSERT INTO event_children
    (event_id, event_created_at, ordinal, kind, user_id, user_login, payload)
VALUES %s
ON CONFLICT (event_id, ordinal) DO NOTHING
"""

# An event with children in a multi-statement replay query: the row's INSERT
# (lumio_replay_insert, or with an external id lumio_replay_insert_unless_seen's
# probe) as a CTE whose RETURNING (empty when the row is not new: a conflict, or
# the probe found the external id) feeds the children's INSERT.
_INSERT_WITH_CHILDREN_HEAD = """
WITH new_row AS (
INSERT INTO events (id, created_at, account_id, platform, type, external_id, user_id, payload)
SELECT %s::uuid, %s::timestamptz, %s::bigint, %s::text, %s::text, %s::text, %s::text, %s::jsonb"""
_UNLESS_SEEN = """
WHERE NOT EXISTS (
    SELECT 1 FROM events
    WHERE account_id = %s AND external_id = %s AND platform = %s
      AND created_at BETWEEN %s AND %s
)"""
_INSERT_WITH_CHILDREN_TAIL = b"""
ON CONFLICT (id, created_at) DO NOTHING
RETURNING id, created_at)
INSERT INTO event_children
    (event_id, event_created_at, ordinal, kind, user_id, user_login, payload)
SELECT new_row.id, new_row.created_at, c.ordinal, c.kind, c.user_id, c.user_login, c.payload
FROM new_row, (VALUES %CHILDREN%) AS c (ordinal, kind, user_id, user_login, payload)
ON CONFLICT (event_id, ordinal) DO NOTHING"""
_CHILD_VALUES = "(%s::integer, %s::text, %s::text, %s::text, %s::jsonb)"

# SQLSTATE of a unique violation. On this path every insert is idempotent, so
# one that surfaces anyway (TimescaleDB under concurrency, timescaledb#5448)
# means the row is already there: callers report "already stored", never
# "rejected".
UNIQUE_VIOLATION = "23505"


def insert_event(cur: Cursor, ev: PlatformEvent) -> bool:
    """Insert `ev` and its children in the caller's transaction.

    True when a new row was written, False when the event was already stored
    (same id, or same external_id within the dedup window).
    """
    if ev.external_id is not None:
        cur.execute(_LOCK, (ev.account_id, ev.platform, ev.external_id))
        cur.execute(_EXISTS, (ev.account_id, ev.external_id, ev.platform,
                              ev.created_at - DEDUP_WINDOW, ev.created_at + DEDUP_WINDOW))
        row = cur.fetchone()
        if row is not None and row[0]:
            return False
    cur.execute(_INSERT, (ev.id, ev.created_at, ev.account_id, ev.platform, ev.type,
                          ev.external_id, ev.user_id, json.dumps(ev.payload)))
    if cur.rowcount != 1:
        return False
    if ev.children:
        psycopg2.extras.execute_values(cur, _INSERT_CHILDREN, [
            (ev.id, ev.created_at, ordinal, child.kind, child.user_id, child.user_login,
             json.dumps(child.payload))
            for ordinal, child in enumerate(ev.children)
        ])
    return True


def prepare_replay(cur: Cursor) -> None:
    """Prepare the statements of the two functions below on this connection, once.

    Prepared statements outlive transactions (a rollback keeps them) and die
    with the connection; a connection that has them costs one round trip.
    """
    cur.execute("SELECT name FROM pg_prepared_statements WHERE name = ANY(%s)",
                (list(_PREPARED),))
    have = {row[0] for row in cur.fetchall()}
    missing = [sql for name, sql in _PREPARED.items() if name not in have]
    if missing:
        cur.execute("; ".join(missing))


def insert_event_in_savepoint(cur: Cursor, ev: PlatformEvent, savepoint: str,
                              release: str | None = None) -> bool:
    """`insert_event` inside a new SAVEPOINT `savepoint`, in fewer round trips.

    For a transaction that stores many events (the replay of parked ones),
    after `prepare_replay` on its connection. The same statements in the
    same order (the INSERTs prepared): the lock is its own statement, and
    in READ COMMITTED every statement of a multi-statement query takes its
    own snapshot, so the probe still sees whatever the previous holder of the
    lock committed. Only the round trips are merged: RELEASE of the previous
    event's savepoint, this SAVEPOINT, the lock, and the INSERT guarded by the
    same probe (`lumio_replay_insert_unless_seen`) go in one query; the children, if
    any, in a second. After a failure
    the caller rolls back to `savepoint`; if the failure was in the RELEASE or
    the SAVEPOINT itself, that rollback fails too and the caller must treat
    the whole transaction as failed.
    """
    prefix = (f"RELEASE SAVEPOINT {release}; " if release else "") + f"SAVEPOINT {savepoint}; "
    row_params = (ev.id, ev.created_at, ev.account_id, ev.platform, ev.type,
                  ev.external_id, ev.user_id, json.dumps(ev.payload))
    if ev.external_id is not None:
        cur.execute(prefix + _LOCK + "; " + _EXEC_INSERT_UNLESS_SEEN,
                    (ev.account_id, ev.platform, ev.external_id, *row_params,
                     ev.created_at - DEDUP_WINDOW, ev.created_at + DEDUP_WINDOW))
    else:
        cur.execute(prefix + _EXEC_INSERT, row_params)
    if cur.rowcount != 1:
        return False
    if ev.children:
        psycopg2.extras.execute_values(cur, _INSERT_CHILDREN, [
            (ev.id, ev.created_at, ordinal, child.kind, child.user_id, child.user_login,
             json.dumps(child.payload))
            for ordinal, child in enumerate(ev.children)
        ])
    return True


def insert_events_in_savepoints(cur: Cursor, events: Sequence[PlatformEvent],
                                savepoints: Sequence[str], release: str | None = None) -> list[bool]:
    """`insert_event_in_savepoint` for several events, in two round trips.

    The same statements as one event each, in order, with its own SAVEPOINT
    (`savepoints[i]` for `events[i]`, each released by the next), sent as one
    multi-statement query; READ COMMITTED gives each statement its own
    snapshot, so each probe sees the rows of the events before it. An event
    with children is one statement (`_INSERT_WITH_CHILDREN`): the row's insert,
    the same probe and conflict rule, feeds the children's through RETURNING,
    so they are written exactly when the row is new, as `insert_event` does.
    Which rows are new is read around the query: a row with the event's id
    present before is a replay of a stored event; present after and not
    before, new; absent after, a duplicate by external id. When any statement
    fails the rest of the query does not run: the caller rolls back to
    `savepoints[0]` (which fails in turn if that savepoint was never taken)
    and stores the events one at a time.
    """
    if len(events) != len(savepoints):
        raise ValueError("insert_events_in_savepoints: one savepoint per event")
    ids = [ev.id for ev in events]
    # Bounded in time so the probe stays on the chunks around the events.
    window = (min(ev.created_at for ev in events), max(ev.created_at for ev in events), ids)
    cur.execute(_IDS_PRESENT, window)
    before = {str(row[0]) for row in cur.fetchall()}
    parts: list[bytes] = []
    previous = release
    for ev, savepoint in zip(events, savepoints, strict=True):
        head = (f"RELEASE SAVEPOINT {previous}; " if previous else "") + f"SAVEPOINT {savepoint}"
        parts.append(head.encode())
        row_params = (ev.id, ev.created_at, ev.account_id, ev.platform, ev.type,
                      ev.external_id, ev.user_id, json.dumps(ev.payload))
        if ev.external_id is not None:
            parts.append(cur.mogrify(_LOCK, (ev.account_id, ev.platform, ev.external_id)))
        if ev.children:
            parts.append(_insert_with_children(cur, ev, row_params))
        elif ev.external_id is not None:
            parts.append(cur.mogrify(_EXEC_INSERT_UNLESS_SEEN, (
                *row_params, ev.created_at - DEDUP_WINDOW, ev.created_at + DEDUP_WINDOW)))
        else:
            parts.append(cur.mogrify(_EXEC_INSERT, row_params))
        previous = savepoint
    parts.append(cur.mogrify(_IDS_PRESENT, window))
    cur.execute(b"; ".join(parts))
    after = {str(row[0]) for row in cur.fetchall()}
    return [str(ev.id) in after and str(ev.id) not in before for ev in events]


def _insert_with_children(cur: Cursor, ev: PlatformEvent, row_params: tuple[object, ...]) -> bytes:
    """The one statement that inserts `ev` (after its lock, if it has an external id) and its
    children when its row is new."""
    children = b", ".join(
        cur.mogrify(_CHILD_VALUES, (ordinal, child.kind, child.user_id, child.user_login,
                                    json.dumps(child.payload)))
        for ordinal, child in enumerate(ev.children))
    if ev.external_id is not None:
        probe = cur.mogrify(_UNLESS_SEEN, (ev.account_id, ev.external_id, ev.platform,
                                           ev.created_at - DEDUP_WINDOW,
                                           ev.created_at + DEDUP_WINDOW))
    else:
        probe = b""
    return (cur.mogrify(_INSERT_WITH_CHILDREN_HEAD, row_params) + probe
            + _INSERT_WITH_CHILDREN_TAIL.replace(b"%CHILDREN%", children))


def already_stored(exc: BaseException) -> bool:
    """Whether a failed idempotent insert means "the row is there"."""
    return getattr(exc, "pgcode", None) == UNIQUE_VIOLATION
