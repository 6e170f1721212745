"""The Jetstream v1 wire protocol: decoding server frames, building the subscribe URL.

`decode()` turns one WebSocket message into a `Commit`, `Identity`, `Account`
or `Heartbeat`, or raises `BadFrame` with a short reason (a fixed label set,
used as a metric label) and a detail for the log. It accepts only the current
schema (`kind` + `commit.operation`); the pre-release schema (`type` com/id/acc,
`commit.type` c/u/d) and anything else unknown is refused as unsupported, never
guessed at. Every string that reaches the database is checked here (key
syntax and length, so one frame cannot break an index) and records are
sanitized with `model.clean_json` (no NUL, no lone surrogate).

`time_us` must look like unix microseconds (1e15 <= t < 1e17): a value in
milliseconds or a v2 sequence number would turn into a cursor that asks the
server for the wrong thing, so such a frame is refused rather than trusted.

Nothing here is durable; these are pure functions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lumio_ingestd import boundedjson
from lumio_ingestd.model import clean_json
from lumio_ingestd.sources import base

OPERATIONS: Final = ("create", "update", "delete")
KINDS: Final = ("commit", "identity", "account")

#: Reasons a frame is refused (the `reason` label of the bad-frame metric).
BAD_FRAME_REASONS: Final = (
    "binary",                 # a binary message: zstd-compressed frames are not asked for
    "not_utf8",               # a text message that is not valid UTF-8
    "not_json",
    "not_object",             # JSON, but not an object
    "unsupported_schema",     # the pre-release schema (`type` com/id/acc) or a client message
    "unsupported_kind",       # a `kind` we do not know
    "unsupported_operation",  # a commit whose operation is not create/update/delete
    "malformed",              # a known kind with a missing or invalid field
    "too_large",              # a frame above MAX_FRAME_BYTES
)

#: One frame carries one record. Bluesky's own records are a few KiB (a post's
#: text is capped at 3,000 bytes; the PDS refuses record blocks over 1 MiB),
#: so a larger frame is refused unparsed: decoding it would cost memory and
#: time for a record no atproto server accepts.
MAX_FRAME_BYTES: Final = 1024 * 1024

#: Jetstream's limit on wantedDids (a longer list is refused by the server).
MAX_DIDS: Final = 10_000
#: Above this URL length the filters go in an options_update message instead:
#: HTTP servers commonly refuse request lines over 8 KiB.
MAX_URL_CHARS: Final = 4000

MIN_TIME_US: Final = 10**15   # 2001-09-09 in microseconds; below this it is not a v1 time_us
MAX_TIME_US: Final = 10**17   # year 5138

# atproto syntax limits (did: 2 KiB, NSID: 317, record key: 512); they also keep
# the primary key well below PostgreSQL's btree row limit.
_DID = re.compile(r"did:[a-z]+:[a-zA-Z0-9._:%-]{1,2040}")
_NSID = re.compile(r"[a-zA-Z][a-zA-Z0-9-]*(?:\.[a-zA-Z0-9][a-zA-Z0-9-]*)+")
_MAX_NSID = 317
_RKEY = re.compile(r"[a-zA-Z0-9._:~-]{1,512}")
# A repo revision is a TID (13 base32-sortable characters); accept a little
# more, but nothing that would compare oddly.
_REV = re.compile(r"[a-zA-Z0-9._:~-]{1,64}")
_MAX_CID = 256
_MAX_HANDLE = 253
_MAX_STATUS = 64


class BadFrame(base.BadFrame):
    """The shared `BadFrame`, with the commit's DID and time when known; `reason` is one of
    BAD_FRAME_REASONS."""

    def __init__(self, reason: str, detail: str, *, did: str | None = None,
                 time_us: int | None = None) -> None:
        super().__init__(reason, detail, message=f"{reason}: {detail}")
        assert reason in BAD_FRAME_REASONS, reason
        self.did = did
        self.time_us = time_us


@dataclass(frozen=True, slots=True)
class Commit:
    """A create, update or delete of one record; record and cid are None on delete."""

    did: str
    time_us: int
    operation: str
    collection: str
    rkey: str
    rev: str
    cid: str | None
    record: dict[str, Any] | None

    kind = "commit"

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.did, self.collection, self.rkey)

    @property
    def uri(self) -> str:
        return f"at://{self.did}/{self.collection}/{self.rkey}"


@dataclass(frozen=True, slots=True)
class Identity:
    did: str
    time_us: int
    handle: str | None
    seq: int | None

    kind = "identity"


@dataclass(frozen=True, slots=True)
class Account:
    did: str
    time_us: int
    active: bool
    status: str | None
    seq: int | None

    kind = "account"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The server's answer to a client heartbeat: liveness only, no cursor."""


Event = Commit | Identity | Account
Frame = Event | Heartbeat


def decode(data: str | bytes, *, binary: bool = False) -> Frame:
    """One WebSocket message -> a frame, or BadFrame."""
    if binary:
        raise BadFrame("binary", f"binary message of {len(data)} bytes (compression is not asked for)")
    if len(data) > MAX_FRAME_BYTES:
        raise BadFrame("too_large", f"a frame of {len(data)} bytes (limit {MAX_FRAME_BYTES})")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadFrame("not_utf8", f"invalid UTF-8 at byte {exc.start}") from None
    else:
        text = data
    try:
        # Deep nesting is refused before the parser recurses (a "not_json" like
        # any other document the parser would not take).
        obj = boundedjson.loads(text, max_bytes=MAX_FRAME_BYTES)
    except boundedjson.JsonRefused as exc:
        raise BadFrame("too_large" if exc.reason == "too_large" else "not_json",
                       str(exc)[:200]) from None
    if not isinstance(obj, dict):
        raise BadFrame("not_object", f"a JSON {type(obj).__name__}, not an object")
    return decode_object(obj)


def decode_object(obj: dict[str, Any]) -> Frame:
    kind = obj.get("kind")
    if kind is None:
        if "type" in obj:
            # {"type":"com"|"id"|"acc"} is the pre-release schema; options_update
            # and heartbeat are messages a client sends, never a server.
            raise BadFrame("unsupported_schema", f"no `kind`, `type` is {_show(obj.get('type'))}",
                           did=_opt_did(obj), time_us=_opt_time(obj))
        raise BadFrame("malformed", "no `kind`", did=_opt_did(obj), time_us=_opt_time(obj))
    if kind == "heartbeat":
        return Heartbeat()
    if kind not in KINDS:
        raise BadFrame("unsupported_kind", f"kind {_show(kind)}", did=_opt_did(obj), time_us=_opt_time(obj))
    did = _did(obj.get("did"), "did")
    time_us = _time_us(obj.get("time_us"), did)
    body = obj.get(kind)
    if not isinstance(body, dict):
        raise BadFrame("malformed", f"`{kind}` is {_type(body)}, not an object", did=did, time_us=time_us)
    try:
        if kind == "commit":
            return _commit(did, time_us, body)
        if kind == "identity":
            return Identity(did, time_us, _opt_str(body, "handle", _MAX_HANDLE), _opt_int(body, "seq"))
        active = body.get("active")
        if not isinstance(active, bool):
            raise _Field(f"account.active is {_type(active)}, not a boolean")
        return Account(did, time_us, active, _opt_str(body, "status", _MAX_STATUS), _opt_int(body, "seq"))
    except _Field as exc:
        raise BadFrame("malformed", str(exc), did=did, time_us=time_us) from None


class _Field(ValueError):
    pass


def _commit(did: str, time_us: int, body: dict[str, Any]) -> Commit:
    op = body.get("operation")
    if op is None and "type" in body:
        raise BadFrame("unsupported_schema", f"commit has `type` {_show(body.get('type'))}, no `operation`",
                       did=did, time_us=time_us)
    if op not in OPERATIONS:
        raise BadFrame("unsupported_operation", f"commit operation {_show(op)}", did=did, time_us=time_us)
    collection = body.get("collection")
    if not (isinstance(collection, str) and len(collection) <= _MAX_NSID and _NSID.fullmatch(collection)):
        raise _Field(f"commit.collection is not an NSID: {_show(collection)}")
    rkey = body.get("rkey")
    if not (isinstance(rkey, str) and _RKEY.fullmatch(rkey) and rkey not in (".", "..")):
        raise _Field(f"commit.rkey is not a record key: {_show(rkey)}")
    rev = body.get("rev")
    if not (isinstance(rev, str) and _REV.fullmatch(rev)):
        raise _Field(f"commit.rev is not a revision: {_show(rev)}")
    if op == "delete":
        return Commit(did, time_us, op, collection, rkey, rev, None, None)
    record = body.get("record")
    if not isinstance(record, dict):
        raise _Field(f"commit.record of a {op} is {_type(record)}, not an object")
    cid = _opt_str(body, "cid", _MAX_CID)
    return Commit(did, time_us, op, collection, rkey, rev, cid, clean_json(record))


def _did(value: object, what: str) -> str:
    if isinstance(value, str) and _DID.fullmatch(value):
        return value
    raise BadFrame("malformed", f"{what} is not a DID: {_show(value)}")


def _time_us(value: object, did: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadFrame("malformed", f"time_us is {_type(value)}, not an integer", did=did)
    if not MIN_TIME_US <= value < MAX_TIME_US:
        raise BadFrame("malformed", f"time_us {value} is not unix microseconds", did=did)
    return value


def _opt_str(body: dict[str, Any], key: str, limit: int) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise _Field(f"{key} is not a string of at most {limit} characters: {_show(value)}")
    return value


def _opt_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Field(f"{key} is {_type(value)}, not an integer")
    return value


def _opt_did(obj: dict[str, Any]) -> str | None:
    value = obj.get("did")
    return value if isinstance(value, str) and _DID.fullmatch(value) else None


def _opt_time(obj: dict[str, Any]) -> int | None:
    value = obj.get("time_us")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _type(value: object) -> str:
    return "missing" if value is None else type(value).__name__


def _show(value: object) -> str:
    """A short, log-safe rendering of a field (never a whole record)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- asking -------------------------------------------------------------------


def resume_cursor(saved_us: int | None, rewind_secs: float) -> int | None:
    """The cursor to ask for: the saved one minus the rewind, clamped at 0; None = live."""
    if saved_us is None:
        return None
    return max(0, saved_us - round(rewind_secs * 1_000_000))


def subscribe_url(base: str, *, collections: tuple[str, ...], dids: tuple[str, ...],
                  cursor: int | None, require_hello: bool = False) -> str:
    """`base` with wantedCollections, wantedDids and cursor added (repeated parameters).

    With `require_hello` the filters are left out and `requireHello=true` is
    asked for: the server then sends nothing until the client's
    `options_update` (see `options_update()`) sets them.
    """
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k not in ("wantedCollections", "wantedDids", "cursor", "requireHello")]
    if require_hello:
        query.append(("requireHello", "true"))
    else:
        query += [("wantedCollections", c) for c in collections]
        query += [("wantedDids", d) for d in dids]
    if cursor is not None:
        query.append(("cursor", str(cursor)))
    return urlunsplit(parts._replace(query=urlencode(query)))


def options_update(collections: tuple[str, ...], dids: tuple[str, ...]) -> str:
    """The subscriber message that sets the filters (for lists too long for a URL)."""
    return json.dumps({"type": "options_update", "payload": {
        "wantedCollections": list(collections), "wantedDids": list(dids), "maxMessageSizeBytes": 0}},
        separators=(",", ":"))


def collection_wanted(collection: str, wanted: tuple[str, ...]) -> bool:
    """Jetstream's filter: an exact NSID or a prefix `a.b.*`; empty = all."""
    if not wanted:
        return True
    for item in wanted:
        if item.endswith(".*"):
            if collection.startswith(item[:-1]):
                return True
        elif collection == item:
            return True
    return False


@dataclass(slots=True)
class ApplyResult:
    #: Commits that changed the stored state, in batch order.
    written: list[Commit] = field(default_factory=list)
    #: Commits that changed nothing: superseded within the batch, or not newer than the stored rev.
    stale: int = 0
    #: Commits the database refused for good (only from `apply(isolate=True)`), with the reason.
    refused: list[tuple[Commit, str]] = field(default_factory=list)
    #: The stored cursor after the batch (None when no cursor was given and none is stored).
    cursor: int | None = None
