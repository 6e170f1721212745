"""The StreamElements Astro gateway: frames, requests, tokens, and tips/activities into events.

Pure functions, no I/O (docs/platforms.rst, "The Astro protocol"). The source reads and writes the
socket; everything that decides what a frame means lives here, so the
conformance test and the mapping tests run it without a socket.

Mapping (docs/platforms.rst, "What is stored"), one `events` row
per document, `platform` = `streamelements`, `created_at` = the document's
`createdAt` (the frame's `ts` only when that is missing):

- `channel.tips`, `status` "success" (or none) -> type `tip`, `external_id` = `_id`.
- `channel.tips` with any other status (a failed or refunded tip) -> type
  `tip.<status>`, `external_id` = `<_id>:<status>`: stored as it arrives,
  never an update of the `tip` row, and never swallowed by it as a duplicate.
- `channel.tips.moderation` -> type `tip.moderation`, `external_id` =
  `<_id>:moderation:<approved>:<updatedAt>` (each moderation step is a row).
- `channel.activities` -> type `activity.<data.type>`, `external_id` = `_id`;
  except an activity of type `tip` that names its tip (`data.tipId`): that is
  the tip itself, seen on the other topic, so it maps to type `tip` with
  `external_id` = the tip's `_id` (= `tipId`) and is stored once whichever
  topic delivers it first (the dedup key is (account, external_id)). An
  activity tip without `tipId` cannot be matched and stays `activity.tip`,
  its own row: never a second `tip` row.

A `tip` row's payload carries the same normalized fields whichever topic it
came from (`amount`, `currency`, `message`, `username`, `provider`,
`status`, `topic`, `tip_id`) plus the document as sent (`document`).

Donor PII: `strip_pii` (lumio_ingestd/pii.py) removes every key named like an email address, a
geolocation or an IP address, at any depth, before the event is built, so
it never reaches Redis, the spool, the database or an alert, unless
`[streamelements] keep_donor_pii = true`.

A frame that cannot be used raises `BadFrame` with a short `reason` (a label
of `source_bad_frames`): "utf8", "json", "shape", "time", "too_large",
"binary", "room", "unsupported" (a topic this daemon does not store).

Nothing durable here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lumio_ingestd import boundedjson
from lumio_ingestd.model import PlatformEvent, parse_time
from lumio_ingestd.pii import strip_pii
from lumio_ingestd.sources.base import BadFrame

PLATFORM = "streamelements"
MAX_FRAME_BYTES = 512 * 1024

TIPS = "channel.tips"
ACTIVITIES = "channel.activities"
TIP_MODERATION = "channel.tips.moderation"
STORED_TOPICS = frozenset({TIPS, ACTIVITIES, TIP_MODERATION})

TIP_TYPE = "tip"
TOKEN_TYPES = ("jwt", "oauth2", "apikey")

#: Response errors, and what the source does about them.
RETRY_ERRORS = frozenset({"err_deadline_exceeded", "err_internal_error"})  # backoff, retry
CONFIG_ERRORS = frozenset({"err_unauthorized", "err_bad_request", "invalid_message_type"})  # slow
RATE_LIMITED = "rate_limit_exceeded"
KNOWN_ERRORS = RETRY_ERRORS | CONFIG_ERRORS | {RATE_LIMITED}

# Key names (lower case, without "_" and "-") that hold donor PII.
_TYPE_OK = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_NOT_WORD = re.compile(r"[^A-Za-z0-9_.:-]+")



@dataclass(frozen=True)
class Frame:
    """One server frame: `type` is welcome, response, message or reconnect (others are kept
    as they are, for the caller to count)."""

    type: str
    id: str | None
    ts: str | None
    nonce: str | None
    error: str | None
    topic: str | None
    room: str | None
    data: Mapping[str, Any]


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) else None


def parse_frame(raw: bytes) -> Frame:
    if len(raw) > MAX_FRAME_BYTES:
        raise BadFrame("too_large", f"a frame of {len(raw)} bytes (at most {MAX_FRAME_BYTES})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadFrame("utf8", f"not UTF-8: {exc}") from None
    try:
        obj = boundedjson.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadFrame("json", f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise BadFrame("shape", f"a JSON {type(obj).__name__}, not an object")
    kind = obj.get("type")
    if not isinstance(kind, str) or not kind:
        raise BadFrame("shape", "a frame without a string `type`")
    data = obj.get("data")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadFrame("shape", f"{kind[:32]} frame whose `data` is a {type(data).__name__}")
    return Frame(type=kind, id=_opt_str(obj, "id"), ts=_opt_str(obj, "ts"), nonce=_opt_str(obj, "nonce"),
                 error=_opt_str(obj, "error"), topic=_opt_str(obj, "topic"), room=_opt_str(obj, "room"),
                 data=data)


def subscribe_request(topic: str, room: str, token: str, token_type: str, nonce: str) -> str:
    return json.dumps({"type": "subscribe", "nonce": nonce,
                       "data": {"topic": topic, "room": room, "token": token, "token_type": token_type}},
                      separators=(",", ":"))


# -- tokens -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    token: str
    token_type: str

    def __repr__(self) -> str:  # never the secret itself, in a log or a traceback
        return f"Token(token_type={self.token_type!r}, token=<{len(self.token)} chars>)"


def parse_token(text: str, where: str) -> Token:
    """The token file's content: JSON {"token", "token_type"} or the bare JWT. Errors name
    the file and what is wrong, never the content."""
    body = text.strip()
    if not body:
        raise ValueError(f"{where}: the token file is empty")
    if body.startswith("{"):
        try:
            obj = boundedjson.loads(body)
        except ValueError:
            raise ValueError(f"{where}: the token file starts with '{{' but is not valid JSON") from None
        token = obj.get("token") if isinstance(obj, dict) else None
        if not isinstance(token, str) or not token.strip():
            raise ValueError(f"{where}: the token file has no non-empty string \"token\"")
        token_type = obj.get("token_type", "jwt")
        if token_type not in TOKEN_TYPES:
            raise ValueError(f"{where}: \"token_type\" must be one of {', '.join(TOKEN_TYPES)}")
        return Token(token.strip(), str(token_type))
    if any(c.isspace() for c in body):
        raise ValueError(f"{where}: a bare token must be one word (a JWT); use the JSON form for more")
    return Token(body, "jwt")


# -- PII --------------------------------------------------------------------------------------


# -- mapping ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mapped:
    event: PlatformEvent
    pii_removed: int


def _time(value: object, fallback: str | None, what: str) -> datetime:
    text = value if isinstance(value, str) else fallback
    if text is None:
        return datetime.now(UTC)
    try:
        at = parse_time(text)
    except ValueError:
        raise BadFrame("time", f"{what}: {str(text)[:40]!r} is not an RFC 3339 time") from None
    if not datetime(2000, 1, 1, tzinfo=UTC) <= at <= datetime.now(UTC) + timedelta(days=1):
        raise BadFrame("time", f"{what}: {text[:40]!r} is outside 2000 .. now + 1 day")
    return at


def _doc_id(data: Mapping[str, Any], topic: str) -> str:
    doc_id = data.get("_id")
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise BadFrame("shape", f"{topic} message without a string data._id")
    return doc_id.strip()


def _label(value: object, what: str) -> str:
    """A type suffix: a word as sent, or made one (a tip must not be lost to an odd status)."""
    if not isinstance(value, str) or not value.strip():
        raise BadFrame("shape", f"{what} {str(value)[:40]!r} is not a non-empty string")
    if _TYPE_OK.fullmatch(value):
        return value
    return _NOT_WORD.sub("_", value.strip())[:64]


def _number(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _tip_fields(donation: Mapping[str, Any], *, provider: object, status: object, topic: str,
                tip_id: str) -> dict[str, Any]:
    user = donation.get("user")
    username = user.get("username") if isinstance(user, dict) else donation.get("username")
    return {
        "topic": topic, "tip_id": tip_id, "amount": _number(donation.get("amount")),
        "currency": donation.get("currency") if isinstance(donation.get("currency"), str) else None,
        "message": donation.get("message") if isinstance(donation.get("message"), str) else None,
        "username": username if isinstance(username, str) else None,
        "provider": provider if isinstance(provider, str) else None,
        "status": status if isinstance(status, str) else None,
    }


def map_message(account_id: int, frame: Frame, *, keep_pii: bool) -> Mapped:
    """One `message` frame as an event; raises BadFrame (reason "unsupported" for a topic this
    daemon does not store)."""
    topic = frame.topic
    if topic not in STORED_TOPICS:
        raise BadFrame("unsupported", f"a message on topic {str(topic)[:64]!r}, which is not stored")
    removed = 0
    data: Mapping[str, Any] = frame.data
    if not keep_pii:
        data, removed = strip_pii(dict(frame.data))
    doc_id = _doc_id(data, topic)
    created_at = _time(data.get("createdAt"), frame.ts, f"{topic} {doc_id[:32]} createdAt")
    if topic == ACTIVITIES:
        ev = _activity(account_id, data, doc_id, created_at)
    else:
        ev = _tip(account_id, topic, data, doc_id, created_at)
    return Mapped(ev, removed)


def _tip(account_id: int, topic: str, data: Mapping[str, Any], doc_id: str,
         created_at: datetime) -> PlatformEvent:
    donation = data.get("donation")
    if not isinstance(donation, dict):
        raise BadFrame("shape", f"{topic} message {doc_id[:32]} without a data.donation object")
    status = data.get("status")
    payload = _tip_fields(donation, provider=data.get("provider"), status=status, topic=topic,
                          tip_id=doc_id)
    payload["approved"] = data.get("approved") if isinstance(data.get("approved"), str) else None
    payload["document"] = dict(data)
    if topic == TIP_MODERATION:
        approved = _label(data.get("approved") or "unknown", "approved")
        raw_updated = data.get("updatedAt")
        updated = raw_updated if isinstance(raw_updated, str) else ""
        ev_type, external_id = "tip.moderation", f"{doc_id}:moderation:{approved}:{updated[:40]}"
    elif status in ("success", None):  # a document without a status is taken as the plain tip
        ev_type, external_id = TIP_TYPE, doc_id
    else:
        label = _label(status, "status")
        ev_type, external_id = f"{TIP_TYPE}.{label}", f"{doc_id}:{label}"
    return PlatformEvent.new(account_id=account_id, platform=PLATFORM, type=ev_type,
                             external_id=external_id, created_at=created_at, payload=payload)


def _activity(account_id: int, data: Mapping[str, Any], doc_id: str,
              created_at: datetime) -> PlatformEvent:
    kind = _label(data.get("type"), "activity type")
    inner = data.get("data")
    inner = inner if isinstance(inner, dict) else {}
    provider_id = inner.get("providerId")
    user_id = provider_id if isinstance(provider_id, (str, int)) and not isinstance(provider_id, bool) \
        else None
    tip_id = inner.get("tipId")
    if kind == TIP_TYPE and isinstance(tip_id, str) and tip_id.strip():
        payload = _tip_fields(inner, provider=data.get("provider"), status=inner.get("status"),
                              topic=ACTIVITIES, tip_id=tip_id.strip())
        payload["activity_id"] = doc_id
        payload["document"] = dict(data)
        return PlatformEvent.new(account_id=account_id, platform=PLATFORM, type=TIP_TYPE,
                                 external_id=tip_id.strip(), created_at=created_at, payload=payload,
                                 user_id=user_id)
    payload = dict(data)
    payload["topic"] = ACTIVITIES
    return PlatformEvent.new(account_id=account_id, platform=PLATFORM, type=f"activity.{kind}",
                             external_id=doc_id, created_at=created_at, payload=payload, user_id=user_id)
