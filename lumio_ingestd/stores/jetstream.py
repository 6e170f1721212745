"""The SQL of Jetstream: records in `bsky_records`, the cursor in `jetstream_cursor`.

`apply()` writes one batch of commits and moves the cursor in the caller's
transaction, so the cursor is durable exactly when the records up to it are.
`JetstreamStore` runs those in transactions of their own for the source
(which never touches the pool itself). The rules, in order:

1. In-batch dedup first. A rewind replays seconds of events, so one batch can
   hold several operations on one key, and PostgreSQL refuses to update one
   row twice in one `ON CONFLICT DO UPDATE` (SQLSTATE 21000). Per key we keep
   the operation with the highest `rev`, the later one on a tie; within one
   Jetstream stream a repo's commits arrive in rev order, so that is the last
   operation by arrival.
2. Newest revision wins. A repo revision (`rev`) is a TID, which sorts as a
   byte string; the comparison is `COLLATE "C"` so a database locale cannot
   change it. An operation whose rev is not greater than the stored one
   changes nothing (a replay of the same commit included).
3. A delete leaves a tombstone: the row keeps the delete's rev and time_us
   with `record` and `cid` NULL. Without it, a create replayed after a newer
   delete (a rewind that cuts between them, or another instance replaying
   older events) would bring a deleted record back, and fire its alert again.
   Readers treat `record IS NULL` as deleted.
4. The cursor only moves forward: `GREATEST(stored, new)`.

`apply()` returns the commits that changed the stored state (for the live
alert, which must not fire again on a replay) and how many were stale.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import psycopg2
import psycopg2.extras

from lumio_ingestd.db.errors import classify
from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.model import Classified
from lumio_ingestd.sources.jetstream.protocol import ApplyResult, Commit

_UPSERT = """
INSERT INTO bsky_records AS r (did, collection, rkey, rev, cid, record, time_us)
VALUES %s
ON CONFLICT (did, collection, rkey) DO UPDATE
   SET rev = EXCLUDED.rev, cid = EXCLUDED.cid, record = EXCLUDED.record, time_us = EXCLUDED.time_us
 WHERE r.rev COLLATE "C" < EXCLUDED.rev COLLATE "C"
RETURNING did, collection, rkey
"""
_TEMPLATE = "(%s, %s, %s, %s, %s, %s::jsonb, %s)"

_SAVE_CURSOR = """
INSERT INTO jetstream_cursor AS c (name, time_us) VALUES (%s, %s)
ON CONFLICT (name) DO UPDATE
   SET time_us = GREATEST(c.time_us, EXCLUDED.time_us), updated_at = now()
RETURNING time_us
"""




class JetstreamStore:
    """The Jetstream source's handle on the database: each call one transaction, bounded by
    `timeout` (pool wait, statements and commit). Durable when `apply` returns: the batch and
    the cursor, together."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def load_cursor(self, name: str, *, timeout: float) -> int | None:
        with self.pool.transaction(deadline=time.monotonic() + timeout) as cur:
            return load_cursor(cur, name)

    def apply(self, commits: Sequence[Commit], *, cursor_name: str, cursor_us: int | None,
              isolate: bool, timeout: float) -> ApplyResult:
        with self.pool.transaction(deadline=time.monotonic() + timeout) as cur:
            return apply(cur, commits, cursor_name=cursor_name, cursor_us=cursor_us, isolate=isolate)

    def classify(self, exc: BaseException) -> Classified:
        return classify(exc)


def load_cursor(cur: Cursor, name: str) -> int | None:
    cur.execute("SELECT time_us FROM jetstream_cursor WHERE name = %s", (name,))
    row = cur.fetchone()
    return None if row is None else int(row[0])


def dedupe(commits: Sequence[Commit]) -> list[Commit]:
    """One commit per key: the highest rev, the later on a tie; in first-seen key order."""
    best: dict[tuple[str, str, str], Commit] = {}
    for commit in commits:
        prev = best.get(commit.key)
        if prev is None or commit.rev >= prev.rev:  # str order is code-point order, like COLLATE "C"
            best[commit.key] = commit
    return list(best.values())


def apply(cur: Cursor, commits: Sequence[Commit], *, cursor_name: str, cursor_us: int | None,
          isolate: bool = False) -> ApplyResult:
    """Write `commits` and move the cursor to `cursor_us`, in the caller's transaction.

    With `isolate`, every commit runs under its own savepoint and one that
    fails with a permanent error (a value the database refuses) is set aside
    in `refused` instead of failing the batch; the caller uses it after the
    plain call failed permanently. Retryable errors always propagate.
    """
    result = ApplyResult()
    unique = dedupe(commits)
    result.stale = len(commits) - len(unique)
    if unique:
        written_keys = _apply_isolated(cur, unique, result) if isolate else _upsert(cur, unique)
        result.written = [c for c in unique if c.key in written_keys]
        result.stale += len(unique) - len(result.written) - len(result.refused)
    if cursor_us is not None:
        cur.execute(_SAVE_CURSOR, (cursor_name, cursor_us))
        row = cur.fetchone()
        assert row is not None
        result.cursor = int(row[0])
    else:
        result.cursor = load_cursor(cur, cursor_name)
    return result


def _row(c: Commit) -> tuple[object, ...]:
    record = None if c.record is None else json.dumps(c.record, ensure_ascii=False, allow_nan=False)
    return (c.did, c.collection, c.rkey, c.rev, c.cid, record, c.time_us)


def _upsert(cur: Cursor, commits: Sequence[Commit]) -> set[tuple[str, str, str]]:
    rows = psycopg2.extras.execute_values(
        cur, _UPSERT, [_row(c) for c in commits], template=_TEMPLATE,
        page_size=max(1, len(commits)), fetch=True)
    return {(r[0], r[1], r[2]) for r in rows}


def _apply_isolated(cur: Cursor, commits: Sequence[Commit], result: ApplyResult) -> set[tuple[str, str, str]]:
    written: set[tuple[str, str, str]] = set()
    for commit in commits:
        cur.execute("SAVEPOINT jetstream_one")
        try:
            written |= _upsert(cur, [commit])
        except (psycopg2.Error, ValueError) as exc:  # ValueError: a value the driver refuses
            why = classify(exc)
            if why.retryable:
                raise
            cur.execute("ROLLBACK TO SAVEPOINT jetstream_one")
            result.refused.append((commit, why.reason))
        else:
            cur.execute("RELEASE SAVEPOINT jetstream_one")
    return written
