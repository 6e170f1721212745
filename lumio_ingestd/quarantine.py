"""Quarantine lists: entries that no retry can store, kept with the reason why.

An entry in `lumio:chat:quarantine:{ACCOUNT}` or `lumio:events:quarantine:{ACCOUNT}`
is the original stored entry (a JSON object) plus `reason`, `sqlstate` and
`quarantined_at`; an entry that was not even JSON is kept as `raw`. Nothing
expires here: an operator inspects, repairs and re-queues, or deletes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .model import format_time


def quarantine_entry(raw: bytes, reason: str, sqlstate: str | None) -> bytes:
    """The quarantine form of a stored entry."""
    try:
        obj: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        obj = {"raw": raw.decode("utf-8", "backslashreplace")}
    obj["reason"] = reason
    obj["sqlstate"] = sqlstate
    obj["quarantined_at"] = format_time(datetime.now(UTC))
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
