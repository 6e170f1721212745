"""Reading chat entries back from Redis fast, without giving up the edge repairs.

`ChatMessage.from_entry` rebuilds every message through `ChatMessage.create`,
which re-checks every string for NUL characters, lone surrogates and lengths.
For the flusher that is most of its Python time, and for entries this daemon
wrote itself the answer is always "nothing to repair". `decode_entry` takes a
shortcut only when it can prove that from the bytes and a few cheap checks:

- the raw entry holds no `\\u0000` and no surrogate escape (this daemon writes
  UTF-8, never escapes a valid pair, and could not have written a lone one);
- it is a version 1 or 2 object whose fields have exactly the types
  `to_entry` writes, every string within its cap, `created_at` in the exact
  form `format_time` writes, and `extras` a JSON object within the caps and
  depth of `clean_json`, without NaN or infinities.

Anything else (another version, a hand-built entry, a value that needs
repair) goes through `ChatMessage.from_entry` unchanged, so the result is
always the one `from_entry` gives (or EntryError where from_entry lets another
exception out for a malformed entry).

`copy_line` is for the entries the flusher would otherwise hand to PostgreSQL
unread (`store.stageable`): with orjson, parsing one in Python and COPYing the
line straight into `chat_messages` costs ~4 us here against ~16 us more of
PostgreSQL's CPU for the jsonb staging (measured per row: 28 against 12), and
two cores are shared by both. It gives the line only where the row is provably
the one the staging would store, else None. Nothing durable lives here.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

from .. import boundedjson, fastjson
from ..model import (
    CHAT_ENTRY_VERSIONS,
    MAX_ENTRY_BYTES,
    MAX_ID,
    MAX_JSON_DEPTH,
    MAX_JSON_STRING,
    MAX_NAME,
    MAX_TEXT,
    ChatMessage,
    EntryError,
)
from .store import NEEDS_REPAIR, encode_fields, encode_row

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
_EXTRAS_KEY = b',"extras":'

_MAX_PLATFORM = 32  # ChatMessage.create caps the platform name at 32
_SHORT_EXTRAS = min(MAX_NAME, MAX_JSON_STRING)
# As store.extras_json writes extras, but refusing NaN and infinities.
_EXTRAS_STRICT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# (field, cap) of the string fields, in the order create() cleans them.
_STRINGS = (("message_id", MAX_ID), ("user_id", MAX_ID), ("user_login", MAX_NAME),
            ("display_name", MAX_NAME), ("text", MAX_TEXT))


def decode_entry(raw: bytes) -> ChatMessage:
    """Exactly `ChatMessage.from_entry(raw)`; raises EntryError like it."""
    clean = _clean_object(raw)
    if clean is not None:
        obj = clean[0]
        return ChatMessage(platform=obj["platform"], account_id=obj["account_id"],
                           message_id=obj["message_id"],
                           created_at=datetime.fromisoformat(obj["created_at"]),
                           user_id=obj.get("user_id", ""), user_login=obj.get("user_login", ""),
                           display_name=obj.get("display_name", ""), text=obj.get("text", ""),
                           extras=obj.get("extras") or {})
    return _from_entry(raw)


def entry_row(raw: bytes) -> tuple[bytes, bool]:
    """(`encode_row(from_entry(raw))`, whether decoding repaired a value).

    Raises EntryError like `from_entry`. The shortcut builds the COPY line
    straight from the parsed entry, without a ChatMessage in between.
    """
    clean = _clean_object(raw)
    if clean is None:
        msg = _from_entry(raw)
        return encode_row(msg), msg.sanitized
    obj, extras = clean
    # "...ffffffZ" (checked by _clean_object) is what isoformat() writes as
    # "...ffffff+00:00": the line is byte for byte the one encode_row makes.
    return encode_fields((
        str(obj["account_id"]), obj["platform"], obj["message_id"], obj["created_at"][:-1] + "+00:00",
        obj.get("user_id", ""), obj.get("user_login", ""), obj.get("display_name", ""),
        obj.get("text", ""), extras,
    )), False


def copy_line(raw: bytes) -> bytes | None:
    """The COPY line of a `stageable` entry, the row exactly as `store.insert_entries`
    would store it; None (PostgreSQL then reads the entry) without orjson, and for any
    entry not in the shape `to_entry` writes.

    `extras` goes in as its own text, sliced from the entry (the last key
    `to_entry` writes): re-encoding it could change a number (0.10, 1e-400,
    an int past 64 bits), which jsonb keeps as written.
    """
    try:
        obj = fastjson.loads_orjson(raw)
        account, created, extras = obj["account_id"], obj["created_at"], obj.get("extras")
        get = obj.get
        values: tuple[Any, ...] = (obj["platform"], obj["message_id"], get("user_id"),
                                   get("user_login"), get("display_name"), get("text"))
    except (ValueError, TypeError, KeyError, AttributeError):  # not JSON, not an object, a key missing
        return None  # PostgreSQL words the refusal (or casts, as jsonb_to_record does)
    if type(account) is not int or type(created) is not str or _TIME.fullmatch(created) is None:
        return None
    if None in values:
        values = tuple("" if v is None else v for v in values)  # the staging's coalesce(..., '')
    if extras is None:
        text = "{}"
    elif type(extras) is dict:
        start = raw.find(_EXTRAS_KEY)
        sliced = raw[start + len(_EXTRAS_KEY):-1]
        # Parses only if it is the top-level value: a key nested deeper would
        # leave its containers' closing brackets unbalanced in the slice.
        if start < 0 or not raw.endswith(b"}") or not _parses(sliced):
            return None
        text = sliced.decode("utf-8")
    else:
        return None
    platform, message_id, user_id, user_login, display_name, body = values
    try:  # a value of another type than str (a number, a list): joining it raises
        return encode_fields((str(account), platform, message_id, created[:-1] + "+00:00", user_id,
                              user_login, display_name, body, text))
    except TypeError:
        return None


def _parses(text: bytes) -> bool:
    try:
        fastjson.loads_orjson(text)
    except ValueError:
        return False
    return True


def _from_entry(raw: bytes) -> ChatMessage:
    """`ChatMessage.from_entry`, with every way a malformed entry can fail made an EntryError.

    from_entry lets a few slip through (a number where a timestamp belongs:
    AttributeError; 1e400 as the account id: OverflowError; absurd nesting:
    RecursionError). One such entry must be quarantined, not block its
    account's flush forever.
    """
    try:
        return ChatMessage.from_entry(raw)
    except (AttributeError, OverflowError, RecursionError, TypeError, ValueError) as exc:
        if isinstance(exc, EntryError):
            raise
        raise EntryError(f"chat entry is malformed: {type(exc).__name__}") from exc


def _clean_object(raw: bytes) -> tuple[dict[str, Any], str] | None:
    """(the parsed entry, its extras as COPY writes them) when from_entry would
    take every value unchanged, else None."""
    if NEEDS_REPAIR.search(raw) is not None:
        return None
    try:
        # Strict UTF-8 first: json.loads(bytes) would let UTF-8-encoded
        # surrogates through ("surrogatepass").
        obj = boundedjson.loads(raw.decode("utf-8"), max_bytes=MAX_ENTRY_BYTES, decode=fastjson.loads)
    except ValueError:  # UnicodeDecodeError and JsonRefused included; from_entry words it
        return None
    if (type(obj) is not dict or type(obj.get("v")) is not int or obj["v"] not in CHAT_ENTRY_VERSIONS
            or "message_id" not in obj):
        return None
    platform = obj.get("platform")
    created = obj.get("created_at")
    if (type(platform) is not str or len(platform) > _MAX_PLATFORM
            or type(obj.get("account_id")) is not int
            or type(created) is not str or _TIME.fullmatch(created) is None):
        return None
    for name, cap in _STRINGS:
        value = obj.get(name, "")
        if type(value) is not str or len(value) > cap:
            return None
    extras = obj.get("extras") or {}
    if type(extras) is not dict:
        return None
    text = "{}"
    if extras:
        try:
            text = _EXTRAS_STRICT.encode(extras)
        except ValueError:  # NaN or an infinity: clean_json makes them null
            return None
        # A short text can hold no over-long key or string and no deep
        # nesting (each level opens a bracket); only a long one is walked.
        short = len(text) <= _SHORT_EXTRAS and text.count("{") + text.count("[") <= MAX_JSON_DEPTH
        if not short and not _clean_json(extras, 0):
            return None
    try:
        datetime.fromisoformat(created)  # a day 31 of February is from_entry's error to word
    except ValueError:
        return None
    return obj, text


def _clean_json(value: Any, depth: int) -> bool:
    """True when `model.clean_json` would return `value` unchanged."""
    kind = type(value)
    if kind is str:
        return len(value) <= MAX_JSON_STRING
    if kind is dict:
        if depth >= MAX_JSON_DEPTH:
            return False
        for key, item in value.items():
            if len(key) > MAX_NAME or not _clean_json(item, depth + 1):
                return False
        return True
    if kind is list:
        if depth >= MAX_JSON_DEPTH:
            return False
        return all(_clean_json(item, depth + 1) for item in value)
    if kind is float:
        return math.isfinite(value)
    return value is None or kind is bool or kind is int
