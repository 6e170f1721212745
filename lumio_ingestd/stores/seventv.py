"""The last known state of each account's 7TV emote set: table `seventv_emote_sets`.

`SetStateStore` is what the 7TV source is given (it never sees the pool):
`load(account_id)` and `save(account_id, state, expected_version)`, each one
bounded transaction. A save is a compare-and-set on `version`: it writes only
when the stored row still has the version the caller's changes were computed
against (or there is no row and none was expected), so a second writer of
the same account (two replicas during a shard hand-over) cannot move the
state back; the loser is told (`False`) and re-reads.

The source saves a state only after every event of the change set that led
to it was durably taken (stored, parked or spooled), so the stored state
never runs ahead of an event; a crash between the two leaves the old state,
and the next REST diff computes the same events again (same external ids:
one row each).

Durable when `save` returns True: the row, committed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.sources.seventv.protocol import Emotes, Entry, SetState

_LOAD = """
SELECT emote_set_id, seventv_user_id, emotes, version FROM seventv_emote_sets WHERE account_id = %s
"""

_INSERT = """
INSERT INTO seventv_emote_sets (account_id, emote_set_id, seventv_user_id, emotes, version)
VALUES (%s, %s, %s, %s::jsonb, %s)
ON CONFLICT (account_id) DO NOTHING
"""

_UPDATE = """
UPDATE seventv_emote_sets
   SET emote_set_id = %s, seventv_user_id = %s, emotes = %s::jsonb, version = %s, updated_at = now()
 WHERE account_id = %s AND version = %s
"""


def encode_emotes(emotes: Emotes) -> str:
    # The rename count only when there is one: a state without renames reads as before.
    return json.dumps({k: [e.name, e.ts, e.actor_id, *([e.renames] if e.renames else [])]
                       for k, e in sorted(emotes.items())}, ensure_ascii=False, separators=(",", ":"))


def decode_emotes(obj: Any) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    if not isinstance(obj, dict):
        return out
    for emote_id, value in obj.items():
        if isinstance(value, list) and len(value) in (3, 4) and isinstance(value[0], str):
            ts = value[1] if type(value[1]) is int else None
            actor = value[2] if isinstance(value[2], str) else None
            renames = value[3] if len(value) == 4 and type(value[3]) is int and value[3] >= 0 else 0
            out[str(emote_id)] = Entry(value[0], ts, actor, renames)
    return out


def load(cur: Cursor, account_id: int) -> SetState | None:
    cur.execute(_LOAD, (account_id,))
    row = cur.fetchone()
    if row is None:
        return None
    set_id, user_id, emotes, version = row
    return SetState(str(set_id), decode_emotes(emotes), int(version), user_id)


def save(cur: Cursor, account_id: int, state: SetState, expected_version: int | None) -> bool:
    """Write `state` when the stored version is `expected_version` (None: no row yet)."""
    encoded = encode_emotes(state.emotes)
    if expected_version is None:
        cur.execute(_INSERT, (account_id, state.set_id, state.user_id, encoded, state.version))
    else:
        cur.execute(_UPDATE, (state.set_id, state.user_id, encoded, state.version, account_id,
                              expected_version))
    return bool(cur.rowcount == 1)


class SetStateStore:
    """The source's handle on the table: one bounded transaction per call."""

    def __init__(self, pool: Pool, *, timeout_secs: float = 3.0) -> None:
        # 3 s: a stopping source's call in flight ends inside the sources' 5 s.
        self._pool = pool
        self._timeout = timeout_secs

    def load(self, account_id: int) -> SetState | None:
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            return load(cur, account_id)

    def save(self, account_id: int, state: SetState, expected_version: int | None) -> bool:
        with self._pool.transaction(deadline=time.monotonic() + self._timeout) as cur:
            return save(cur, account_id, state, expected_version)
