"""Parked records: small rows other than events that wait on the events' park and spool path.

A write that is not an event (a minute of viewer statistics, say) and that
the database refused for now takes the same way back as an event: the
dead-letter list `lumio:events:deadletter:{A}`, else the local spool (kind
"event"), and the retry worker (or the spool replayer, when Redis is down)
stores it later. So it needs no Redis keys, spool kind or worker of its own.

A record entry is an event entry (docs/architecture.rst, "Parked and spooled
entries": `v`, `id`, `created_at`,
`account_id`, `platform`, `type`, `external_id`, `payload`, `children`)
plus `"kind": KIND`; the payload carries the row. Code that stores parked
entries asks `record_kind(raw)` first: None is an event for
`events.store.insert_event`, anything else goes to the `RecordWriter`
registered under that kind in `RecordWriters`. A kind nobody registered is
quarantined as "undecodable" by the retry worker (an operator can requeue it
once a build that knows it runs).

A writer must be idempotent on the entry's `id`: entries are replayed at
least once (a crash between the commit and the removal from the in-flight
list, a spool batch re-delivered after a restart).

Nothing durable here: writers write in the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg2.extensions

from lumio_ingestd import boundedjson
from lumio_ingestd.model import MAX_ENTRY_BYTES, PlatformEvent

Cursor = psycopg2.extensions.cursor

#: Writes one record in the caller's transaction; True when it changed the
#: database, False when that entry (its id) was written before.
RecordWriter = Callable[[Cursor, PlatformEvent], bool]

_MARK = b'"kind"'


#: A write of the same shape as the record's own to its table, on a fresh id; the
#: caller rolls it back. The retry worker's "stuck" test: when the canary fails
#: too, the problem is the table's (a migration not applied), not the entry's.
RecordCanary = Callable[[Cursor, PlatformEvent], None]


class RecordWriters:
    """Kind -> writer, filled by the composition root; shared by the retry worker and the spool."""

    def __init__(self) -> None:
        self._writers: dict[str, RecordWriter] = {}
        self._canaries: dict[str, RecordCanary] = {}

    def register(self, kind: str, writer: RecordWriter, canary: RecordCanary | None = None) -> None:
        if kind in self._writers:
            raise ValueError(f"a record writer for {kind!r} is registered already")
        self._writers[kind] = writer
        if canary is not None:
            self._canaries[kind] = canary

    def get(self, kind: str) -> RecordWriter | None:
        return self._writers.get(kind)

    def canary(self, kind: str) -> RecordCanary | None:
        return self._canaries.get(kind)


def record_entry(kind: str, ev: PlatformEvent) -> bytes:
    """The parked entry of a record: the event entry of `ev` marked with its kind."""
    obj = ev.to_json()
    obj["kind"] = kind
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def record_kind(raw: bytes | str) -> str | None:
    """The record kind of a parked entry, or None for a plain event (or what cannot be read)."""
    data = raw.encode() if isinstance(raw, str) else raw
    if _MARK not in data:  # the common case, an event, without a second JSON parse
        return None
    try:
        # Bounded: a poison entry must not raise RecursionError in the retry worker.
        obj = boundedjson.loads(data, max_bytes=MAX_ENTRY_BYTES)
    except ValueError:
        return None
    kind = obj.get("kind") if isinstance(obj, dict) else None
    # Children carry a "kind" too; only a top-level string marks a record.
    return kind if isinstance(kind, str) and kind else None
