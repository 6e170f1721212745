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
unread (`store.stageable`): COPYing the line straight into `chat_messages`
costs PostgreSQL ~16 us less CPU per row than the jsonb staging (measured per
row: 12 against 28), and two cores are shared by both. It gives the line only
where the row is provably the one the staging would store, else None. An
entry exactly as `to_entry` writes it without a `\\u` escape (nearly every
message) is matched by one regular expression and its line joined from the
matched bytes, without a parse (~3 us against ~7 with orjson); with orjson,
the other stageable entries are parsed. Nothing durable lives here.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

from lumio_ingestd import boundedjson, fastjson
from lumio_ingestd.chat.store import NEEDS_REPAIR, encode_fields, encode_row, stageable
from lumio_ingestd.model import (
    CHAT_ENTRY_VERSION,
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

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
_EXTRAS_KEY = b',"extras":'
# A JSON string without a `\u` escape. Its bytes are then the value as a COPY
# text field too: COPY reads `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r` and `\t`
# exactly as JSON does (a backslash before a character it gives no meaning to
# stands for that character), and neither allows a raw control character.
_ESCAPED = rb'"([^"\\\x00-\x1f]*(?:\\["\\/bfnrt][^"\\\x00-\x1f]*)*)"'
_PLAIN = rb'"([^"\\\x00-\x1f]*)"'  # the same without any escape: a third faster to match


def _canonical(string: bytes) -> re.Pattern[bytes]:
    """Everything `to_entry` writes, in its order, byte for byte: a match is the
    document's structure (`string` is JSON's string), so each group is one value
    as PostgreSQL would read it from the jsonb. `extras` may hold anything but a
    control character (a tab there is JSON whitespace but a COPY delimiter);
    whether it is one JSON value is checked apart. An account id of up to 18
    digits always fits PostgreSQL's bigint."""
    return re.compile(
        rb'\{"v":%d,"platform":%s,"account_id":(0|-?[1-9][0-9]{0,17}),"message_id":%s,'
        rb'"created_at":"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6})Z",'
        rb'"user_id":%s,"user_login":%s,"display_name":%s,"text":%s,"extras":(\{[^\x00-\x1f]*\})\}'
        % ((CHAT_ENTRY_VERSION,) + (string,) * 6))


_CANONICAL_PLAIN = _canonical(_PLAIN)
_CANONICAL_ESCAPED = _canonical(_ESCAPED)

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
    """The COPY line of an entry, the row exactly as `store.insert_entries` would store
    it; None (PostgreSQL then reads the entry, or it is not `stageable`) for any entry
    not in the shape `to_entry` writes, and without orjson for any but `canonical_line`'s.

    `extras` goes in as its own text, sliced from the entry (the last key
    `to_entry` writes): re-encoding it could change a number (0.10, 1e-400,
    an int past 64 bits), which jsonb keeps as written.
    """
    line = canonical_line(raw)
    if line is not None or not stageable(raw):
        return line
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


def canonical_line(raw: bytes) -> bytes | None:
    """`copy_line` for an entry in exactly `to_entry`'s bytes and without a `\\u` escape
    (nearly every one), joined from the matched bytes without a parse; None for any other."""
    if len(raw) > MAX_ENTRY_BYTES:
        return None  # before the match: a failing match costs ~80 ms per MB of escapes
    if b"\\" not in raw:
        match = _CANONICAL_PLAIN.fullmatch(raw)
    elif b"\\u" in raw:
        return None  # COPY would read `\u0041` as "u0041"; and a NUL or surrogate needs repair
    else:
        match = _CANONICAL_ESCAPED.fullmatch(raw)
    if match is None:
        return None
    platform, account, message_id, created, user_id, user_login, display_name, text, extras = (
        match.groups())
    if not _parses(extras):
        return None  # `{"a":1},"b":{}` matches: a key after extras; PostgreSQL judges it
    if b"\\" in extras:
        extras = extras.replace(b"\\", b"\\\\")  # jsonb reads the JSON's own escapes
    return b"\t".join((account, platform, message_id, created + b"+00:00", user_id, user_login,
                       display_name, text, extras)) + b"\n"


def _parses(text: bytes) -> bool:
    """Whether `text` is one JSON value (orjson's parse where there is one)."""
    try:
        fastjson.loads_orjson(text)
    except ValueError:
        if fastjson.USING_ORJSON:
            return False
        try:
            json.loads(text)
        except ValueError:  # UnicodeDecodeError included
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
