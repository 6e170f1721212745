"""Quarantine lists: entries that no retry can store, kept with the reason why.

An entry in `lumio:chat:quarantine:{ACCOUNT}` or `lumio:events:quarantine:{ACCOUNT}`
is the original stored entry (a JSON object) plus `reason`, `sqlstate` and
`quarantined_at`; an entry that was not even JSON is kept as `raw`. Nothing
expires here: an operator inspects, repairs and re-queues, or deletes
(`lumio-ingestd quarantine`, see `admin/quarantine.py`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from lumio_ingestd import boundedjson
from lumio_ingestd.model import MAX_ENTRY_BYTES, format_time


def quarantine_entry(raw: bytes, reason: str, sqlstate: str | None) -> bytes:
    """The quarantine form of a stored entry."""
    try:
        # Bounded: a poison entry nested 50,000 deep must become `raw`, not a
        # RecursionError that fails the flush of its whole account every turn.
        obj: Any = boundedjson.loads(raw, max_bytes=MAX_ENTRY_BYTES)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        obj = {"raw": raw.decode("utf-8", "backslashreplace")}
    obj["reason"] = reason
    obj["sqlstate"] = sqlstate
    obj["quarantined_at"] = format_time(datetime.now(UTC))
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


#: The keys `quarantine_entry` adds; `original_entry` takes them off again.
WRAPPER_KEYS = ("reason", "sqlstate", "quarantined_at")


def parse_quarantined(raw: bytes) -> dict[str, Any] | None:
    """The quarantine entry as a JSON object, or None when it is not one."""
    try:
        obj: Any = boundedjson.loads(raw, max_bytes=1 << 30)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def original_entry(obj: dict[str, Any]) -> bytes | None:
    """The entry as it was stored before `quarantine_entry` wrapped it; None for a `raw` one.

    Stored entries are compact JSON with their keys in the order they were
    written, and `quarantine_entry` only appends its keys, so taking them off
    again and encoding the same way gives the original bytes back. An entry
    that was not even JSON was kept as text in `raw`; its bytes cannot be told
    apart from their escaped form any more, so it has no original to restore.
    """
    if "raw" in obj and set(obj) <= {"raw", *WRAPPER_KEYS}:
        return None
    stripped = {k: v for k, v in obj.items() if k not in WRAPPER_KEYS}
    return json.dumps(stripped, ensure_ascii=False, separators=(",", ":")).encode()


def entry_ident(obj: dict[str, Any] | None, raw: bytes) -> str:
    """What `--id` matches: an event's `id`, a chat message's `message_id`, else a digest.

    The digest (`sha256:` and 16 hex digits of the quarantine entry's bytes)
    names entries that carry no id of their own, such as undecodable ones.
    """
    if obj is not None:
        for key in ("id", "message_id"):
            value = obj.get(key)
            if isinstance(value, str) and value:
                return value
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]
