"""Chat messages and platform events, sanitized at the edge, and their stored form.

Every value that reaches a batch here is one the database accepts: NUL
characters and lone surrogates are replaced with U+FFFD and lengths are capped
when a message or event is built, so one bad frame cannot poison a batch.

The entries kept in Redis and the spool are JSON objects with a format version
`v`; `from_entry` reads every version this code has ever written, so a newer
daemon still drains what an older one left behind. Chat entries are version 2
(`CHAT_ENTRY_VERSION`): the fields of version 1, with the promise that every
value is as `ChatMessage.create` leaves it (no NUL, no lone surrogate, within
its cap), which lets the flusher hand them to PostgreSQL unread
(chat/store.py). Version 1 chat entries, written by older daemons, are read
and repaired field by field as before.

Below the messages and events: the types that cross the line between a
source and the runtime (docs/architecture.rst, "The layering rule"), so that
neither side imports the other: what became of an event (`PersistResult`),
a stream going online or offline (`StreamChange`, `OpenSession`), and the
verdict on a failed database write (`Kind`, `Classified`, made by
`db.errors.classify`). Nothing durable lives here.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Literal

from lumio_ingestd import boundedjson, fastjson

ENTRY_VERSION = 1
#: The version `ChatMessage.to_entry` writes (see the module docstring).
CHAT_ENTRY_VERSION = 2
#: The chat entry versions `ChatMessage.from_entry` reads.
CHAT_ENTRY_VERSIONS = (ENTRY_VERSION, CHAT_ENTRY_VERSION)
#: A stored entry larger than this is refused unread (this daemon writes far
#: smaller ones: its inputs are capped at 512 KiB a frame).
MAX_ENTRY_BYTES = 4 * 1024 * 1024

MAX_ID = 256
MAX_NAME = 256
MAX_TEXT = 10_000
MAX_TYPE = 128
MAX_JSON_STRING = 10_000
MAX_JSON_DEPTH = 32

_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")

# Escapes that decode to a character the repair walk would replace: \u0000 or a
# surrogate. A high+low pair is fine (one character); anything else is not.
_RISKY_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_PAIR_OR_RISKY = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
                            r"|\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


class EntryError(ValueError):
    """A stored entry that this code cannot read back."""


# What a malformed entry can raise while it is turned back into a model: a
# missing key, a number where text belongs (AttributeError), an id past any
# integer type (OverflowError), absurd nesting (RecursionError).
_DECODE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def clean_text(value: object, limit: int) -> str:
    """A string the database accepts: no NUL, no lone surrogate, at most `limit` chars."""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    # Most chat is ASCII, where only NUL can be wrong: a C-speed check first.
    if text.isascii():
        if "\x00" in text:
            text = text.replace("\x00", "\ufffd")
    elif _BAD_CHARS.search(text):
        text = _BAD_CHARS.sub("\ufffd", text)
    if len(text) > limit:
        text = text[:limit]
    return text


def frame_is_clean(text: str, max_string: int = MAX_NAME) -> bool:
    """Whether every string `json.loads(text)` yields is one the repair walk leaves as it is.

    A check on the raw text, so a clean frame (nearly all of them) skips
    `clean_json`'s walk and copy: no NUL (raw or `\\u0000`), no surrogate
    (raw, or an escape that is not half of a valid pair), no string longer
    than `max_string` characters (so no field, key or text needs its cap; the
    default is the smallest cap, `MAX_NAME`), no nesting deeper than
    `MAX_JSON_DEPTH`. Numbers are left to the decoder (`fastjson.loads_finite`
    refuses the ones the walk would replace). It may say False for a clean
    frame (then the walk runs, as before); it never says True for one the
    walk would change.
    """
    if "\x00" in text:
        return False
    if not text.isascii() and _BAD_CHARS.search(text):
        return False
    probe = text
    if "\\" in text:
        if "\\\\" in text:
            # An escaped backslash makes the scan ambiguous ("\\\\u0000" is no
            # NUL, "\\\\"" ends a string): rare in chat, so not told apart.
            return False
        if "\\u" in text and _RISKY_ESCAPE.search(text):
            for match in _PAIR_OR_RISKY.finditer(text):
                if len(match.group()) != 12:
                    return False
        if '\\"' in text:
            # An escaped quote counted as the one character it decodes to.
            probe = text.replace('\\"', "'")
    # Every string starts at a quote and runs to the next one (other escapes
    # only make the run longer than the string it decodes to).
    if len(probe) > max_string and _has_long_run(probe, max_string):
        return False
    return not boundedjson.depth_exceeds(text, MAX_JSON_DEPTH)


def _has_long_run(probe: str, limit: int) -> bool:
    """Whether a quote in `probe` is followed by more than `limit` characters that are not one.

    First at C speed over the UTF-8 bytes: no run of `limit + 1` bytes without
    a quote anywhere means no such run of characters (a character is at least
    a byte); only a frame with a run that long is asked the exact question.
    """
    if _byte_run(limit) not in probe.encode("utf-8", "surrogatepass").translate(_QUOTE_OR_OTHER):
        return False
    return _long_run(limit).search(probe) is not None


_QUOTE_OR_OTHER = bytes(0x22 if c == 0x22 else 0x2E for c in range(256))


@functools.lru_cache(maxsize=8)
def _byte_run(limit: int) -> bytes:
    return b"." * (limit + 1)


@functools.lru_cache(maxsize=8)
def _long_run(limit: int) -> re.Pattern[str]:
    return re.compile(f'"[^"]{{{limit + 1}}}')


def clean_json(value: Any, depth: int = 0) -> Any:
    """A JSON value the jsonb type accepts (no \\u0000, no lone surrogate), bounded.

    On the hot path of every chat message: exact type checks first, so the
    common shapes (str, dict, list, small ints) cost one comparison each.
    """
    kind = type(value)
    if kind is str:
        return _clean_string(value, MAX_JSON_STRING)
    if kind is dict or kind is list or kind is tuple or isinstance(value, Mapping):
        if depth >= MAX_JSON_DEPTH:
            return None
        if kind is list or kind is tuple:
            return [clean_json(v, depth + 1) for v in value]
        return {_clean_string(k, MAX_NAME) if type(k) is str else clean_text(k, MAX_NAME):
                clean_json(v, depth + 1) for k, v in value.items()}
    if value is None or kind is bool or kind is int:
        return value
    if kind is float:
        return value if value == value and value not in (_INF, -_INF) else None
    if isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return clean_json(float(value), depth)
    return clean_text(value, MAX_JSON_STRING)


_INF = float("inf")


def _clean_string(text: str, limit: int) -> str:
    if len(text) <= limit and text.isascii() and "\x00" not in text:
        return text
    return clean_text(text, limit)


def utc(ts: datetime) -> datetime:
    """An aware UTC datetime (naive input is taken as UTC)."""
    if ts.tzinfo is UTC:
        return ts
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def parse_time(text: str) -> datetime:
    """RFC 3339 with 0 to 9 fractional digits; microseconds are kept, the rest dropped."""
    # Twitch's own shape, 2023-07-19T14:56:51.634234626Z, without the regex:
    # every separator and the nanosecond digits checked here, the rest by
    # fromisoformat (digits only); anything else takes the general path.
    if (len(text) == 30 and text[29] == "Z" and text[19] == "." and text[10] == "T"
            and text[4] == "-" and text[7] == "-" and text[13] == ":" and text[16] == ":"
            and text.isascii() and text[20:29].isdigit()):
        try:
            return datetime.fromisoformat(text[:26] + "+00:00")
        except ValueError:
            pass
    return _parse_time_general(text)


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d:?\d\d)?")


def _parse_time_general(text: str) -> datetime:
    match = _RFC3339.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not an RFC 3339 timestamp: {text[:64]!r}")
    day, clock, frac, zone = match.groups()
    micros = (frac or "")[:6].ljust(6, "0")
    if zone in (None, "Z", "z"):
        zone = "+00:00"
    elif ":" not in zone:
        zone = zone[:3] + ":" + zone[3:]
    try:
        return utc(datetime.fromisoformat(f"{day}T{clock}.{micros}{zone}"))
    except OverflowError:  # year 9999 with a negative offset: past datetime's range in UTC
        raise ValueError(f"timestamp out of range: {text[:64]!r}") from None


def format_time(ts: datetime) -> str:
    if ts.tzinfo is UTC:  # what `utc` and `parse_time` give: "...+00:00" is its fixed end
        return ts.isoformat(timespec="microseconds")[:-6] + "Z"
    return utc(ts).isoformat(timespec="microseconds").replace("+00:00", "Z")


def uuid7(now_ms: int | None = None) -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7): 48 bits of Unix milliseconds, then random."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def _dumps(obj: Mapping[str, Any]) -> bytes:
    return fastjson.dumps(obj)


def _loads(raw: bytes | str, versions: tuple[int, ...] = (ENTRY_VERSION,)) -> dict[str, Any]:
    try:
        obj = boundedjson.loads(raw, max_bytes=MAX_ENTRY_BYTES, decode=fastjson.loads)
    except ValueError as exc:
        raise EntryError(f"entry is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise EntryError("entry is not a JSON object")
    version = obj.get("v")
    if type(version) is not int or version not in versions:
        raise EntryError(f"entry has unknown format version {version!r}")
    return obj


@dataclass(frozen=True, slots=True)
class ChatMessage:
    platform: str
    account_id: int
    message_id: str
    created_at: datetime
    user_id: str = ""
    user_login: str = ""
    display_name: str = ""
    text: str = ""
    extras: Mapping[str, Any] = field(default_factory=dict)
    # True when building it had to repair a value (counted by the caller).
    sanitized: bool = field(default=False, compare=False)

    @classmethod
    def create(cls, *, platform: str, account_id: int, message_id: str, created_at: datetime,
               user_id: object = "", user_login: object = "", display_name: object = "",
               text: object = "", extras: Mapping[str, Any] | None = None,
               known_clean: bool = False) -> ChatMessage:
        """Sanitize and build; `known_clean` = the extras come from a frame that passed
        `frame_is_clean`, so their walk is skipped (the fields are still checked)."""
        if (type(platform) is str and type(message_id) is str and type(user_id) is str
                and type(user_login) is str and type(display_name) is str and type(text) is str
                and len(platform) <= 32 and len(message_id) <= MAX_ID and len(user_id) <= MAX_ID
                and len(user_login) <= MAX_NAME and len(display_name) <= MAX_NAME
                and len(text) <= MAX_TEXT):
            # Nearly every message: its text fields need no repair when none of them holds a
            # NUL or a surrogate, which one check of them joined tells (joining never pairs
            # two lone surrogates into one character).
            joined = platform + message_id + user_id + user_login + display_name + text
            if "\x00" not in joined if joined.isascii() else not _BAD_CHARS.search(joined):
                if known_clean:
                    return _new_chat(platform, int(account_id), message_id, utc(created_at),
                                     user_id, user_login, display_name, text,
                                     dict(extras) if extras else {}, False)
                given = dict(extras) if extras else {}
                cleaned = clean_json(given)
                return _new_chat(platform, int(account_id), message_id, utc(created_at),
                                 user_id, user_login, display_name, text, cleaned, cleaned != given)
        raw = (message_id, user_id, user_login, display_name, text)
        clean = (clean_text(message_id, MAX_ID), clean_text(user_id, MAX_ID),
                 clean_text(user_login, MAX_NAME), clean_text(display_name, MAX_NAME),
                 clean_text(text, MAX_TEXT))
        if known_clean:
            return cls(platform=clean_text(platform, 32), account_id=int(account_id),
                       message_id=clean[0], created_at=utc(created_at), user_id=clean[1],
                       user_login=clean[2], display_name=clean[3], text=clean[4],
                       extras=dict(extras or {}),
                       sanitized=any(a != b for a, b in zip(raw, clean, strict=True)))
        cleaned_extras = clean_json(dict(extras or {}))
        return cls(platform=clean_text(platform, 32), account_id=int(account_id),
                   message_id=clean[0], created_at=utc(created_at), user_id=clean[1],
                   user_login=clean[2], display_name=clean[3], text=clean[4],
                   extras=cleaned_extras,
                   sanitized=any(a != b for a, b in zip(raw, clean, strict=True))
                   or cleaned_extras != dict(extras or {}))

    def to_entry(self) -> bytes:
        created = self.created_at
        if created.tzinfo is UTC and created.microsecond and fastjson.USING_ORJSON:
            # Nearly every message: orjson writes such a time exactly as `format_time` does
            # (`YYYY-MM-DDTHH:MM:SS.ffffffZ`; only a zero fraction would be left out), for a
            # fraction of its cost. Where orjson refuses the entry, the general path decides.
            try:
                return fastjson.dumps_utc_z(self._entry(created))
            except TypeError:
                pass
        return _dumps(self._entry(format_time(created)))

    def _entry(self, created_at: str | datetime) -> dict[str, Any]:
        return {
            "v": CHAT_ENTRY_VERSION, "platform": self.platform, "account_id": self.account_id,
            "message_id": self.message_id, "created_at": created_at,
            "user_id": self.user_id, "user_login": self.user_login,
            "display_name": self.display_name, "text": self.text, "extras": self.extras,
        }

    @classmethod
    def from_entry(cls, raw: bytes | str) -> ChatMessage:
        obj = _loads(raw, CHAT_ENTRY_VERSIONS)
        try:
            return cls.create(
                platform=obj["platform"], account_id=obj["account_id"],
                message_id=obj["message_id"], created_at=parse_time(obj["created_at"]),
                user_id=obj.get("user_id", ""), user_login=obj.get("user_login", ""),
                display_name=obj.get("display_name", ""), text=obj.get("text", ""),
                extras=obj.get("extras") or {},
            )
        except _DECODE_ERRORS as exc:
            raise EntryError(f"chat entry is incomplete or malformed: {exc!r}"[:300]) from exc

    def row(self) -> tuple[Any, ...]:
        """Values in the column order of `CHAT_COLUMNS`."""
        return (self.account_id, self.platform, self.message_id, self.created_at, self.user_id,
                self.user_login, self.display_name, self.text, json.dumps(self.extras))


CHAT_COLUMNS = ("account_id", "platform", "message_id", "created_at", "user_id", "user_login",
                "display_name", "text", "extras")


def slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Any, ...]:
    """The slot descriptors' setters of a frozen dataclass, for a builder that skips its
    `__init__` (which sets each field through `object.__setattr__`, the slow way round
    the frozen `__setattr__`); `names` must be every field, in order."""
    if tuple(f.name for f in fields(cls)) != names:
        raise AssertionError(f"{cls.__name__}'s fields changed: update its builder")
    return tuple(getattr(cls, name).__set__ for name in names)


(_set_platform, _set_account_id, _set_message_id, _set_created_at, _set_user_id, _set_user_login,
 _set_display_name, _set_text, _set_extras, _set_sanitized) = slot_setters(
    ChatMessage, ("platform", "account_id", "message_id", "created_at", "user_id", "user_login",
                  "display_name", "text", "extras", "sanitized"))


def _new_chat(platform: str, account_id: int, message_id: str, created_at: datetime, user_id: str,
              user_login: str, display_name: str, text: str, extras: Mapping[str, Any],
              sanitized: bool) -> ChatMessage:
    """`ChatMessage(...)` with these values, as its `__init__` would build it, in a third of the time."""
    msg: ChatMessage = object.__new__(ChatMessage)
    _set_platform(msg, platform)
    _set_account_id(msg, account_id)
    _set_message_id(msg, message_id)
    _set_created_at(msg, created_at)
    _set_user_id(msg, user_id)
    _set_user_login(msg, user_login)
    _set_display_name(msg, display_name)
    _set_text(msg, text)
    _set_extras(msg, extras)
    _set_sanitized(msg, sanitized)
    return msg


@dataclass(frozen=True, slots=True)
class EventChild:
    """A row that belongs to an event: one recipient of a gift bundle."""

    kind: str
    user_id: str | None = None
    user_login: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "user_id": self.user_id, "user_login": self.user_login,
                "payload": self.payload}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EventChild:
        return cls(kind=clean_text(obj["kind"], MAX_TYPE),
                   user_id=_opt(obj.get("user_id"), MAX_ID),
                   user_login=_opt(obj.get("user_login"), MAX_NAME),
                   payload=clean_json(dict(obj.get("payload") or {})))


def _opt(value: object, limit: int) -> str | None:
    if value is None:
        return None
    text = clean_text(value, limit)
    return text or None


@dataclass(frozen=True, slots=True)
class PlatformEvent:
    id: uuid.UUID
    created_at: datetime
    account_id: int
    platform: str
    type: str
    external_id: str | None
    payload: Mapping[str, Any]
    user_id: str | None = None
    children: tuple[EventChild, ...] = ()

    @classmethod
    def new(cls, *, account_id: int, platform: str, type: str, payload: Mapping[str, Any],
            created_at: datetime | None = None, external_id: object = None,
            user_id: object = None, children: tuple[EventChild, ...] = (),
            id: uuid.UUID | None = None, known_clean: bool = False) -> PlatformEvent:
        """Build an event; its id and created_at are fixed here, once, before any insert.

        `known_clean`: the payload is made of values from a frame or body that passed
        `frame_is_clean`, so its repair walk is skipped (the fields and the children
        are still cleaned)."""
        return cls(
            id=id or uuid7(), created_at=utc(created_at or datetime.now(UTC)),
            account_id=int(account_id), platform=clean_text(platform, 32),
            type=clean_text(type, MAX_TYPE), external_id=_opt(external_id, MAX_ID),
            payload=dict(payload) if known_clean else clean_json(dict(payload)),
            user_id=_opt(user_id, MAX_ID),
            children=tuple(EventChild.from_json(c.to_json()) for c in children),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "v": ENTRY_VERSION, "id": str(self.id), "created_at": format_time(self.created_at),
            "account_id": self.account_id, "platform": self.platform, "type": self.type,
            "external_id": self.external_id, "user_id": self.user_id, "payload": self.payload,
            "children": [c.to_json() for c in self.children],
        }

    def to_entry(self) -> bytes:
        return _dumps(self.to_json())

    @classmethod
    def from_entry(cls, raw: bytes | str) -> PlatformEvent:
        obj = _loads(raw)
        try:
            return cls.new(
                id=uuid.UUID(obj["id"]), created_at=parse_time(obj["created_at"]),
                account_id=obj["account_id"], platform=obj["platform"], type=obj["type"],
                external_id=obj.get("external_id"), user_id=obj.get("user_id"),
                payload=obj.get("payload") or {},
                children=tuple(EventChild.from_json(c) for c in obj.get("children") or ()),
            )
        except _DECODE_ERRORS as exc:
            raise EntryError(f"event entry is incomplete or malformed: {exc!r}"[:300]) from exc



# --------------------------------------------------------------------------- handed over

@dataclass(frozen=True, slots=True)
class StreamChange:
    """A stream went online (with the platform's stream id, when it has one) or offline."""

    kind: Literal["online", "offline"]
    stream_id: str | None
    at: datetime
    platform: str


def offline_external_id(stream_id: str) -> str:
    """The `external_id` of the `stream.offline` that ends stream `stream_id` (every path)."""
    return f"offline:{stream_id}"


@dataclass(frozen=True, slots=True)
class OpenSession:
    """An open `stream_sessions` row: its stream id (None when it has none) and start."""

    stream_id: str | None
    started_at: datetime


Outcome = Literal["stored", "duplicate", "parked", "spooled", "rejected", "lost", "unavailable"]


@dataclass(frozen=True, slots=True)
class PersistResult:
    """What became of one event.

    `outcome`: "stored" (a new row), "duplicate" (already stored), "parked"
    (in Redis, the retry worker stores it), "spooled" (in the local spool),
    "rejected" (the database refuses it; nothing kept), "lost" (every tier
    refused), "unavailable" (fail-fast `insert_event` only: retry later).
    `event` is the row it is or will be stored as. `error` and `sqlstate`
    describe the database failure, if there was one.
    """

    outcome: Outcome
    event: PlatformEvent
    error: str | None = None
    sqlstate: str | None = None

    @property
    def durable(self) -> bool:
        """The event is stored, or waits in a durable tier to be stored."""
        return self.outcome in ("stored", "duplicate", "parked", "spooled")

    @property
    def broadcast(self) -> bool:
        """Send the live alert: the event is new and durable. A duplicate's went out before."""
        return self.outcome in ("stored", "parked", "spooled")


class Kind(enum.Enum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    ENVIRONMENTAL = "environmental"

    @property
    def retryable(self) -> bool:
        return self is not Kind.PERMANENT


@dataclass(frozen=True, slots=True)
class Classified:
    kind: Kind
    sqlstate: str | None
    reason: str

    @property
    def retryable(self) -> bool:
        return self.kind.retryable


# -- gaps -----------------------------------------------------------------------------------

#: How a source's gaps end: healed from a history API, healed by the source's own mechanism
#: (7TV's REST diff, Jetstream's cursor rewind), or not healable (chat: no history to read).
GapMode = Literal["heal", "healed", "not_healable"]
#: A ledger row's status (`source_gaps.status`); `open` while healing runs.
GapStatus = Literal["open", "healed", "partial", "not_healable"]


@dataclass(frozen=True, slots=True)
class GapKey:
    """One path of one account that records "connected" (`lumio:sourceseen:{A}` field
    `platform:source`) and whose gaps go to the ledger. `healer` reads the platform's
    history back for a gap (mode "heal"); it takes no part in equality."""

    account_id: int
    platform: str
    source: str
    mode: GapMode = "not_healable"
    healer: Any = field(default=None, compare=False, hash=False)

    @property
    def field(self) -> str:
        return f"{self.platform}:{self.source}"


@dataclass(frozen=True, slots=True)
class Gap:
    """A stretch in which `key` was not connected and subscribed: epoch milliseconds."""

    key: GapKey
    started_ms: int
    ended_ms: int

    @property
    def seconds(self) -> float:
        return max(0, self.ended_ms - self.started_ms) / 1000.0


@dataclass(frozen=True, slots=True)
class HealWindow:
    """What one healing attempt reads: [since_ms, until_ms] in epoch milliseconds."""

    gap: Gap
    since_ms: int
    until_ms: int


@dataclass(frozen=True, slots=True)
class HealOutcome:
    """What a healer did: `rows` stored that the live path had not (taken now), `seen` the
    documents read, `requests` the HTTP requests made."""

    rows: int
    seen: int
    requests: int


class HealRetry(Exception):
    """A healing attempt failed in a way a later try may not (5xx, timeout, garbage, 429):
    `after_secs` is the wait the platform asked for, if any. `rows`/`requests`: what the
    attempt did before it failed."""

    def __init__(self, message: str, *, after_secs: float | None = None, rows: int = 0,
                 requests: int = 0) -> None:
        super().__init__(message)
        self.after_secs = after_secs
        self.rows = rows
        self.requests = requests


class HealFailed(Exception):
    """A healing attempt failed for good (a refused token after one renewal, a 4xx)."""

    def __init__(self, message: str, *, rows: int = 0, requests: int = 0) -> None:
        super().__init__(message)
        self.rows = rows
        self.requests = requests
