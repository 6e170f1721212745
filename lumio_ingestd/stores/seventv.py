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

The row's `emotes` is `{emote id: [name, added at (unix ms) or null, actor
id or null, renames (when not 0)]}`, and under the key `~` (no emote id has
it; a reader of the emotes alone skips it, as its value is no list) what the
state knows besides: `removed`, `[[emote id, added at or null], ...]` oldest
first, and `seen`, `{emote id: the time of its last dispatch}`. Both are left
out when empty, so a state without them reads as before.

Durable when `save` returns True: the row, committed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.sources.seventv.protocol import MAX_REMOVED, Emotes, Entry, SetState

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


#: The key of what the state keeps beside the emotes (no emote id has it).
META = "~"


def encode_emotes(emotes: Emotes, removed: Mapping[str, int | None] | None = None) -> str:
    # The rename count only when there is one: a state without renames reads as before.
    obj: dict[str, Any] = {k: [e.name, e.ts, e.actor_id, *([e.renames] if e.renames else [])]
                           for k, e in sorted(emotes.items())}
    meta: dict[str, Any] = {}
    if removed:
        meta["removed"] = [[k, ts] for k, ts in removed.items()]  # a list: jsonb keeps no key order
    seen = {k: e.seen for k, e in sorted(emotes.items()) if e.seen is not None}
    if seen:
        meta["seen"] = seen
    if meta:
        obj[META] = meta
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def decode_emotes(obj: Any) -> tuple[dict[str, Entry], dict[str, int | None]]:
    """(emotes, removed) of a stored `emotes` value; what does not fit is left out."""
    out: dict[str, Entry] = {}
    removed: dict[str, int | None] = {}
    if not isinstance(obj, dict):
        return out, removed
    meta = obj.get(META)
    meta = meta if isinstance(meta, dict) else {}
    seen = meta.get("seen")
    seen = seen if isinstance(seen, dict) else {}
    for emote_id, value in obj.items():
        if isinstance(value, list) and len(value) in (3, 4) and isinstance(value[0], str):
            ts = value[1] if type(value[1]) is int else None
            actor = value[2] if isinstance(value[2], str) else None
            renames = value[3] if len(value) == 4 and type(value[3]) is int and value[3] >= 0 else 0
            t = seen.get(emote_id)
            out[str(emote_id)] = Entry(value[0], ts, actor, renames, t if type(t) is int else None)
    items = meta.get("removed")
    for item in items[-MAX_REMOVED:] if isinstance(items, list) else []:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0] not in out:
            removed[item[0]] = item[1] if type(item[1]) is int else None
    return out, removed


def load(cur: Cursor, account_id: int) -> SetState | None:
    cur.execute(_LOAD, (account_id,))
    row = cur.fetchone()
    if row is None:
        return None
    set_id, user_id, obj, version = row
    emotes, removed = decode_emotes(obj)
    return SetState(str(set_id), emotes, int(version), user_id, removed)


def save(cur: Cursor, account_id: int, state: SetState, expected_version: int | None) -> bool:
    """Write `state` when the stored version is `expected_version` (None: no row yet)."""
    encoded = encode_emotes(state.emotes, state.removed)
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
