"""Instance heartbeats: what `lumio:instance:INSTANCE` holds, and reading them back.

Every replica refreshes its heartbeat key with a TTL (the chat flusher, the
chat dead-letter drain and the event retry worker all do); while the key
exists, the replica's in-flight lists are left alone. The value is a small
JSON object, `{"pid": N, "host": "...", "at": UNIX_SECONDS}`, so that
`lumio-ingestd status` can say when each replica last beat. Liveness itself
only ever asks whether the key exists; the value is for people.

Nothing durable lives here.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from lumio_ingestd import boundedjson


def heartbeat_value(now: float | None = None) -> bytes:
    """The value a heartbeat SET writes: who beat, and when (wall clock)."""
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "at": round(time.time() if now is None else now, 3)},
                      separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class HeartbeatInfo:
    pid: int | None
    host: str | None
    at: float | None  # Unix seconds of the last beat, when the value says


def parse_heartbeat(raw: bytes | None) -> HeartbeatInfo:
    """Read a heartbeat value; older formats (`pid=N`, a bare Unix time) are understood too."""
    if raw is None:
        return HeartbeatInfo(None, None, None)
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj: Any = boundedjson.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        pid, host, at = obj.get("pid"), obj.get("host"), obj.get("at")
        return HeartbeatInfo(pid if isinstance(pid, int) else None,
                             host if isinstance(host, str) else None,
                             float(at) if isinstance(at, (int, float)) else None)
    if isinstance(obj, (int, float)):
        return HeartbeatInfo(None, None, float(obj))
    if text.startswith("pid=") and text[4:].isdigit():
        return HeartbeatInfo(int(text[4:]), None, None)
    return HeartbeatInfo(None, None, None)
