"""Donor PII: which fields it is, and taking it out of documents and of raw frames.

Donor PII is any key named like an email address, a geolocation or an IP
address (`email`, `geo`, `ipAddress`, `client_ip`, ...; case, `_` and `-`
do not matter), at any depth. StreamElements tips carry it; no other
platform is known to, but every frame goes through the same check.

- `strip_pii(value)`: a decoded document without those keys (what a source
  stores).
- `scrub_frame(raw)`: a refused frame's bytes without them, before the frame
  quarantine keeps it. JSON is decoded, stripped and encoded again, JSON
  inside a string value too (Pusher's `data`, a socket.io `42[...]` frame);
  text that is not JSON and names such a key is withheld entirely (it cannot
  be taken apart safely); email addresses left anywhere are masked.

Pure functions; nothing durable here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from lumio_ingestd import boundedjson

PII_KEYS = frozenset({"email", "emailaddress", "geo", "geolocation", "ip", "ipaddress", "clientip",
                      "remoteip", "remoteaddress", "remoteaddr", "userip"})

#: A quoted key in text that may not be JSON.
_QUOTED_KEY = re.compile(rb'"([A-Za-z_-]{1,40})"\s*:')
_EMAIL = re.compile(rb"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})+")
_EMAIL_TEXT = re.compile(_EMAIL.pattern.decode())
EMAIL_MASK = "[email removed]"
#: A socket.io packet: a packet type (digits), then JSON.
_SOCKETIO = re.compile(rb"\A([0-9]{1,4})(?=[\[{])")


def is_pii_key(key: object) -> bool:
    return isinstance(key, str) and key.lower().replace("_", "").replace("-", "") in PII_KEYS


def strip_pii(value: Any) -> tuple[Any, int]:
    """`value` without donor email, geolocation or IP keys at any depth; and how many went."""
    return _walk(value, _unchanged)


def _walk(value: Any, leaf: Callable[[Any], tuple[Any, int]]) -> tuple[Any, int]:
    """`value` without PII keys at any depth, each value that is no container passed to `leaf`."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        removed = 0
        for key, item in value.items():
            if is_pii_key(key):
                removed += 1
                continue
            out[key], n = _walk(item, leaf)
            removed += n
        return out, removed
    if isinstance(value, list):
        items = []
        removed = 0
        for item in value:
            clean, n = _walk(item, leaf)
            items.append(clean)
            removed += n
        return items, removed
    return leaf(value)


def _unchanged(value: Any) -> tuple[Any, int]:
    return value, 0


def _deep(value: Any) -> tuple[Any, int]:
    """`strip_pii`, also inside string values that hold JSON, and with emails masked."""
    return _walk(value, _deep_leaf)


def _deep_leaf(value: Any) -> tuple[Any, int]:
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("{", "["):
            try:
                inner = boundedjson.loads(text, max_bytes=max(len(text), boundedjson.DEFAULT_MAX_BYTES))
            except ValueError:
                inner = None
            if isinstance(inner, dict | list):
                clean, n = _deep(inner)
                if n:
                    return json.dumps(clean, ensure_ascii=False, separators=(",", ":")), n
        masked, n = _EMAIL_TEXT.subn(EMAIL_MASK, value)
        return masked, n
    return value, 0


def scrub_frame(raw: bytes) -> tuple[bytes | None, int]:
    """`raw` without donor PII, and how many fields went; None: withheld (text that is not JSON
    and names a PII key). Bytes without PII come back unchanged."""
    prefix = b""
    body = raw
    socketio = _SOCKETIO.match(raw)
    if socketio is not None:
        prefix, body = raw[:socketio.end()], raw[socketio.end():]
    try:
        doc = boundedjson.loads(body, max_bytes=max(len(body), boundedjson.DEFAULT_MAX_BYTES))
    except ValueError:
        doc = None
    else:
        if not isinstance(doc, dict | list):
            doc = None
    if doc is not None:
        clean, n = _deep(doc)
        if not n:
            return raw, 0
        return prefix + json.dumps(clean, ensure_ascii=False, separators=(",", ":")).encode(), n
    if any(is_pii_key(m.group(1).decode()) for m in _QUOTED_KEY.finditer(raw)):
        return None, 1
    masked, n = _EMAIL.subn(EMAIL_MASK.encode(), raw)
    return masked, n
