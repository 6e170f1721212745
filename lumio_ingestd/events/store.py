"""The SQL of storing one platform event (and its child rows) idempotently.

Every writer of `events` goes through `insert_event`: the inline path, the
replay of parked events, the spool replay and the fail-fast REST emit. They
must all take the same advisory lock, or the dedup below stops holding.

- With an `external_id` (the platform's own id of the event): in the caller's
  READ COMMITTED transaction, `pg_advisory_xact_lock` on a hash of
  (account_id, platform, external_id), then the INSERT guarded by a `NOT EXISTS`
  probe on events_dedup_idx bounded to `DEDUP_WINDOW` on either side of
  `created_at` (two statements, sent as one query: `_statements`). A
  hypertable cannot carry a unique index on (account_id, external_id) without
  the time column, hence the lock. READ COMMITTED matters: in REPEATABLE READ
  the snapshot is taken by the lock statement itself, before the lock is
  granted, and EXISTS would miss the previous holder's row (docs/architecture.rst,
  2.6). The pool sets READ COMMITTED on every connection.
- Without one: `ON CONFLICT (id, created_at) DO NOTHING`; the id and
  created_at are fixed once, before the first attempt, so a replay conflicts
  with the stored row.

Child rows (gift-bundle recipients) are written in the same transaction, only
when the event row itself is new (a duplicate's children were written with
the row that is already stored).

Nothing is durable when `insert_event` returns: the caller's transaction
commits it. `insert_event_committed` (the inline insert) is its own
transaction: committed when it returns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import timedelta

import psycopg2.extensions

from lumio_ingestd.model import PlatformEvent

Connection = psycopg2.extensions.connection
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

# The row's INSERT, in pieces every writer assembles the same way: with an
# external id `_ROW + _UNLESS_SEEN + _ON_CONFLICT` (the dedup probe folded into
# the INSERT: it runs on the snapshot the INSERT takes when it starts, after the
# lock statement before it returned, READ COMMITTED), without one
# `_ROW + _ON_CONFLICT`. An event with children puts the same INSERT in a CTE
# (`_INSERT_WITH_CHILDREN`).
_ROW = """
INSERT INTO events (id, created_at, account_id, platform, type, external_id, user_id, payload)
SELECT %s::uuid, %s::timestamptz, %s::bigint, %s::text, %s::text, %s::text, %s::text, %s::jsonb"""
_UNLESS_SEEN = """
WHERE NOT EXISTS (
    SELECT 1 FROM events
    WHERE account_id = %s::bigint AND external_id = %s::text AND platform = %s::text
      AND created_at BETWEEN %s::timestamptz AND %s::timestamptz
)"""
_ON_CONFLICT = """
ON CONFLICT (id, created_at) DO NOTHING"""


def _numbered(sql: str) -> str:
    """`sql` with its `%s` placeholders as `$1`, `$2`, ... for PREPARE."""
    count = iter(range(1, sql.count("%s") + 1))
    return re.sub(r"%s", lambda _: f"${next(count)}", sql)


# The replay's statements, prepared once per connection (`prepare_replay`),
# so a replay of many events parses them once instead of per event: the very
# text the other writers send, with its placeholders numbered.
_PREPARED = {
    "lumio_replay_insert": "PREPARE lumio_replay_insert AS " + _numbered(_ROW + _ON_CONFLICT),
    "lumio_replay_insert_unless_seen": ("PREPARE lumio_replay_insert_unless_seen AS "
                                        + _numbered(_ROW + _UNLESS_SEEN + _ON_CONFLICT)),
}
_EXEC_INSERT = "EXECUTE lumio_replay_insert (%s, %s, %s, %s, %s, %s, %s, %s)"

# The replay's group (`insert_events_in_one_savepoint`): the same lock key,
# probe and conflict rule as above, over arrays, one element per event. The
# lock is the `_LOCK` expression per element, in the arrays' order.
_MANY_LOCK = """
SELECT pg_advisory_xact_lock(hashtextextended(l.account_id::text || ':' || l.platform || ':'
                                              || l.external_id, 0))
FROM unnest($1::bigint[], $2::text[], $3::text[]) AS l (account_id, platform, external_id)"""
_MANY_ROWS = """
INSERT INTO events (id, created_at, account_id, platform, type, external_id, user_id, payload)
SELECT r.id, r.created_at, r.account_id, r.platform, r.type, r.external_id, r.user_id,
       r.payload::jsonb
FROM unnest($1::uuid[], $2::timestamptz[], $3::bigint[], $4::text[], $5::text[], $6::text[],
            $7::text[], $8::text[])
    AS r (id, created_at, account_id, platform, type, external_id, user_id, payload)
WHERE r.external_id IS NULL OR NOT EXISTS (
    SELECT 1 FROM events
    WHERE account_id = r.account_id AND external_id = r.external_id AND platform = r.platform
      AND created_at BETWEEN r.created_at - $9::interval AND r.created_at + $9::interval
)
ON CONFLICT (id, created_at) DO NOTHING
RETURNING id, created_at, id::text AS text_id"""
_MANY_WITH_CHILDREN = f"""
WITH new_rows AS ({_MANY_ROWS}
), new_children AS (
    INSERT INTO event_children
        (event_id, event_created_at, ordinal, kind, user_id, user_login, payload)
    SELECT new_rows.id, new_rows.created_at, c.ordinal, c.kind, c.user_id, c.user_login,
           c.payload::jsonb
    FROM new_rows
    JOIN unnest($10::uuid[], $11::integer[], $12::text[], $13::text[], $14::text[],
                $15::text[]) AS c (event_id, ordinal, kind, user_id, user_login, payload)
        ON c.event_id = new_rows.id
    ON CONFLICT (event_id, ordinal) DO NOTHING
)
SELECT id::text FROM new_rows"""
_PREPARED.update({
    "lumio_replay_many_lock": "PREPARE lumio_replay_many_lock AS " + _MANY_LOCK,
    "lumio_replay_many": "PREPARE lumio_replay_many AS " + _MANY_ROWS,
    "lumio_replay_many_with_children": ("PREPARE lumio_replay_many_with_children AS "
                                        + _MANY_WITH_CHILDREN),
})
_EXEC_MANY_LOCK = "EXECUTE lumio_replay_many_lock (%s, %s, %s)"
_EXEC_MANY = "EXECUTE lumio_replay_many (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_EXEC_MANY_WITH_CHILDREN = ("EXECUTE lumio_replay_many_with_children "
                            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")

_EXEC_INSERT_UNLESS_SEEN = ("EXECUTE lumio_replay_insert_unless_seen "
                            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")


# An event with children: the row's INSERT (with an external id, its probe) as
# a CTE whose RETURNING (empty when the row is not new: a conflict, or the probe
# found the external id) feeds the children's INSERT, so the children are
# written exactly when the row is. Its row count is the children written: more
# than none exactly when the row is new (children are only ever written with
# their row, under a fresh event id).
_WITH_CHILDREN_HEAD = "WITH new_row AS ("
_WITH_CHILDREN_TAIL = b"""
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
    """Insert `ev` and its children in the caller's transaction, in one round trip.

    True when a new row was written, False when the event was already stored
    (same id, or same external_id within the dedup window). The lock and
    the INSERT (probe and children folded in, `_statements`) go as one
    multi-statement query: they stay two statements, and in READ COMMITTED
    each takes its own snapshot when it starts, so the probe's is taken after
    the lock is granted.
    """
    cur.execute(_statements(cur, ev, prepared=False))
    return _is_new(cur, ev)


def insert_event_committed(conn: Connection, ev: PlatformEvent) -> bool:
    """`insert_event` as a transaction of its own, committed in the same round trip.

    For a connection of nobody's transaction (the inline insert): the query
    goes in autocommit mode, where PostgreSQL runs a multi-statement query as
    one implicit transaction (all of it or nothing, the advisory lock held to
    its end) and commits it before it answers; a commit that fails is the
    query's error. So no BEGIN and no COMMIT round trip. Durable when it
    returns True or False; on an exception nothing of it is.
    """
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            return insert_event(cur, ev)
    finally:
        # Client-side only (psycopg2 sends nothing); a broken connection is
        # closed by the pool anyway.
        if not conn.closed:
            conn.autocommit = False


def insert_canary(conn: Connection, ev: PlatformEvent) -> None:
    """Insert `ev` the way every writer does and roll it back: whether `events` takes a write
    now (reachable, not locked, granted), leaving nothing behind. Raises what the insert raised."""
    try:
        with conn.cursor() as cur:
            insert_event(cur, ev)
    finally:
        if not conn.closed:
            conn.rollback()


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
    """`insert_event` inside a new SAVEPOINT `savepoint`, in one round trip.

    For a transaction that stores many events (the replay of parked ones),
    after `prepare_replay` on its connection. The same statements as
    `insert_event` (the INSERT without children prepared), preceded in the
    same query by RELEASE of the previous event's savepoint and this
    SAVEPOINT. After a failure the caller rolls back to `savepoint`; if the
    failure was in the RELEASE or the SAVEPOINT itself, that rollback fails
    too and the caller must treat the whole transaction as failed.
    """
    prefix = (f"RELEASE SAVEPOINT {release}; " if release else "") + f"SAVEPOINT {savepoint}; "
    cur.execute(prefix.encode() + _statements(cur, ev, prepared=True))
    return _is_new(cur, ev)


def insert_events_in_one_savepoint(cur: Cursor, events: Sequence[PlatformEvent], savepoint: str,
                                   release: str | None = None) -> list[bool]:
    """Several events in one new SAVEPOINT `savepoint`, in one round trip and
    three statements whatever their number (the replay's group).

    The same rules as `insert_event`, set-wise (`_MANY_*`, prepared by
    `prepare_replay`): the advisory locks of the events with an external id,
    in their order, in one statement; then one INSERT of every row, the
    dedup probe and the conflict rule per row, on a snapshot taken after the
    locks were granted; the children, if any, fed by its RETURNING. That
    snapshot does not see the rows of the same INSERT: the caller must not
    put two events with the same (platform, external id) in one group.

    One subtransaction per group instead of per event lets a transaction hold
    more events than the backend's cache of 64 subtransactions (beyond it every
    other session's snapshots look into pg_subtrans). A failure anywhere undoes
    the whole statement: the caller rolls back to `savepoint` (failing in turn
    if the savepoint was never taken) and stores the events one at a time, each
    in a savepoint of its own, so a bad event is still rolled back alone.

    Returns, per event, whether its row is new; an id twice in `events` (an
    entry parked twice) is one row, new at most for its first.
    """
    if not events:
        raise ValueError("insert_events_in_one_savepoint: no events")
    head = (f"RELEASE SAVEPOINT {release}; " if release else "") + f"SAVEPOINT {savepoint}"
    parts: list[bytes] = [head.encode()]
    locking = [ev for ev in events if ev.external_id is not None]
    if locking:
        parts.append(cur.mogrify(_EXEC_MANY_LOCK, (
            [ev.account_id for ev in locking], [ev.platform for ev in locking],
            [ev.external_id for ev in locking])))
    rows = ([ev.id for ev in events], [ev.created_at for ev in events],
            [ev.account_id for ev in events], [ev.platform for ev in events],
            [ev.type for ev in events], [ev.external_id for ev in events],
            [ev.user_id for ev in events], [json.dumps(ev.payload) for ev in events],
            DEDUP_WINDOW)
    kids = [(ev.id, ordinal, child) for ev in events for ordinal, child in enumerate(ev.children)]
    if kids:
        parts.append(cur.mogrify(_EXEC_MANY_WITH_CHILDREN, rows + (
            [event_id for event_id, _, _ in kids], [ordinal for _, ordinal, _ in kids],
            [child.kind for _, _, child in kids], [child.user_id for _, _, child in kids],
            [child.user_login for _, _, child in kids],
            [json.dumps(child.payload) for _, _, child in kids])))
    else:
        parts.append(cur.mogrify(_EXEC_MANY, rows))
    cur.execute(b"; ".join(parts))
    # As text: parsing each returned uuid would cost more than formatting ours.
    new = {row[-1] for row in cur.fetchall()}
    out = []
    for ev in events:
        text_id = str(ev.id)
        out.append(text_id in new)
        new.discard(text_id)
    return out


def _statements(cur: Cursor, ev: PlatformEvent, *, prepared: bool) -> bytes:
    """What every writer sends to store `ev`: the dedup (see the module
    docstring) and the conflict rule in the least statements that keep them.

    With an external id, the lock first, as a statement of its own: its
    snapshot is taken before the lock is granted, so the probe must be in a
    later statement (docs/architecture.rst, "Event deduplication"). Then one INSERT with the probe
    folded in and the children, if any, fed by its RETURNING. `prepared`:
    an INSERT without children as the EXECUTE of its `prepare_replay`
    statement (the same text).
    """
    row = (ev.id, ev.created_at, ev.account_id, ev.platform, ev.type,
           ev.external_id, ev.user_id, json.dumps(ev.payload))
    parts: list[bytes] = []
    probe: tuple[object, ...] = ()
    if ev.external_id is not None:
        parts.append(cur.mogrify(_LOCK, (ev.account_id, ev.platform, ev.external_id)))
        probe = (ev.account_id, ev.external_id, ev.platform,
                 ev.created_at - DEDUP_WINDOW, ev.created_at + DEDUP_WINDOW)
    unless_seen = _UNLESS_SEEN if probe else ""
    if ev.children:
        children = b", ".join(
            cur.mogrify(_CHILD_VALUES, (ordinal, child.kind, child.user_id, child.user_login,
                                        json.dumps(child.payload)))
            for ordinal, child in enumerate(ev.children))
        parts.append(cur.mogrify(_WITH_CHILDREN_HEAD + _ROW + unless_seen + _ON_CONFLICT,
                                 row + probe)
                     + _WITH_CHILDREN_TAIL.replace(b"%CHILDREN%", children))
    elif prepared:
        parts.append(cur.mogrify(_EXEC_INSERT_UNLESS_SEEN if probe else _EXEC_INSERT,
                                 row + probe))
    else:
        parts.append(cur.mogrify(_ROW + unless_seen + _ON_CONFLICT, row + probe))
    return b"; ".join(parts)


def _is_new(cur: Cursor, ev: PlatformEvent) -> bool:
    """Whether the query of `_statements(ev)` just run wrote the row: its last
    statement's row count (the row's, or its children's)."""
    return cur.rowcount > 0 if ev.children else cur.rowcount == 1


def already_stored(exc: BaseException) -> bool:
    """Whether a failed idempotent insert means "the row is there"."""
    return getattr(exc, "pgcode", None) == UNIQUE_VIOLATION
