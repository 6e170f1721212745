"""`POST /v1/events/emit`: another Lumio service stores an event, fail-fast.

The request needs `Authorization: Bearer <content of [http] emit_token_file>`
(401 missing or wrong; 403 when no token is configured, naming the key). The
body is one JSON object:

    account_id   integer > 0                                    (required)
    platform     twitch | kick | streamelements | seventv | bluesky (required)
    type         the event type, e.g. channel.cheer              (required)
    payload      object                                          (default {})
    external_id  the platform's id of the event, for dedup       (optional)
    user_id      the platform user the event is about            (optional)
    created_at   RFC 3339, 2000-01-01 .. now + 1 day             (default now)
    children     [{kind, user_id?, user_login?, payload?}, ...]  (optional)

Unknown keys are refused too (a typo must not be dropped silently). A bad
body is 400 with `{"error": ..., "field": NAME}`.

The event goes through `insert_event`, the fail-fast insert (bounded like
the inline one, never parked, never spooled): 201 with the stored row; 200
`{"duplicate": true, ...}` when an event with the same external_id is stored
already (a client's retry after a lost answer); 422 when the database refuses
it for good; 503 with `Retry-After` when the database is unavailable: the
client retries, nothing waits here. A stored event is published as a live
alert like any other.

Durable when 201 or 200 is answered: committed in the database.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from lumio_ingestd import boundedjson
from lumio_ingestd.config import Secret
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import (
    MAX_ID,
    MAX_NAME,
    MAX_TYPE,
    EventChild,
    PersistResult,
    PlatformEvent,
    parse_time,
)
from lumio_ingestd.web.bearer import check_bearer
from lumio_ingestd.web.server import Handler, Request, Response

log = logging.getLogger("lumio_ingestd.emit")

PATH = "/v1/events/emit"
MAX_BODY_BYTES = 256 * 1024
MAX_CHILDREN = 1000
RETRY_AFTER_SECS = 5
PLATFORMS = ("twitch", "kick", "streamelements", "seventv", "bluesky")
TOKEN_KEY = "[http] emit_token_file"

_FIELDS = ("account_id", "platform", "type", "payload", "external_id", "user_id", "created_at",
           "children")
_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


class Alerts(Protocol):
    def publish(self, ev: PlatformEvent) -> None: ...


class EmitInvalid(ValueError):
    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_emit(body: bytes, now: datetime | None = None) -> PlatformEvent:
    """The event a request body describes; raises EmitInvalid naming the field."""
    try:
        obj = boundedjson.loads(body, max_bytes=MAX_BODY_BYTES)
    except boundedjson.JsonRefused as exc:
        if exc.reason in ("too_deep", "too_large"):
            raise EmitInvalid(None, f"the body is refused: {exc}") from None
        raise EmitInvalid(None, "the body is not JSON") from None
    if not isinstance(obj, dict):
        raise EmitInvalid(None, "the body must be a JSON object")
    for key in obj:
        if key not in _FIELDS:
            raise EmitInvalid(key, f"unknown field {key[:64]!r}; known: {', '.join(_FIELDS)}")
    account_id = obj.get("account_id")
    if isinstance(account_id, bool) or not isinstance(account_id, int) or not 0 < account_id < 2**63:
        raise EmitInvalid("account_id", "account_id must be an integer > 0")
    platform = obj.get("platform")
    if platform not in PLATFORMS:
        raise EmitInvalid("platform", f"platform must be one of {', '.join(PLATFORMS)}")
    type_ = obj.get("type")
    if not isinstance(type_, str) or not _TYPE.fullmatch(type_) or len(type_) > MAX_TYPE:
        raise EmitInvalid("type", f"type must be a name like channel.cheer (letters, digits, "
                                  f"_ . : -; at most {MAX_TYPE} characters)")
    payload = obj.get("payload", {})
    if not isinstance(payload, dict):
        raise EmitInvalid("payload", "payload must be a JSON object")
    external_id = _optional_str(obj, "external_id", MAX_ID)
    user_id = _optional_str(obj, "user_id", MAX_ID)
    created_at = _created_at(obj.get("created_at"), now or datetime.now(UTC))
    children = _children(obj.get("children"))
    return PlatformEvent.new(account_id=account_id, platform=str(platform), type=type_,
                             payload=payload, created_at=created_at, external_id=external_id,
                             user_id=user_id, children=children)


def _optional_str(obj: Mapping[str, Any], key: str, limit: int) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > limit:
        raise EmitInvalid(key, f"{key} must be a non-empty string of at most {limit} characters, or null")
    return value


def _created_at(value: object, now: datetime) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise EmitInvalid("created_at", "created_at must be an RFC 3339 time string")
    try:
        ts = parse_time(value)
    except ValueError:
        raise EmitInvalid("created_at", "created_at must be an RFC 3339 time string") from None
    if not _EARLIEST <= ts <= now + timedelta(days=1):
        raise EmitInvalid("created_at", "created_at must be between 2000-01-01 and now + 1 day")
    return ts


def _children(value: object) -> tuple[EventChild, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CHILDREN:
        raise EmitInvalid("children", f"children must be a list of at most {MAX_CHILDREN} objects")
    out = []
    for i, child in enumerate(value):
        where = f"children[{i}]"
        if not isinstance(child, dict):
            raise EmitInvalid(where, f"{where} must be an object")
        kind = child.get("kind")
        if not isinstance(kind, str) or not kind or len(kind) > MAX_TYPE:
            raise EmitInvalid(f"{where}.kind", f"{where}.kind must be a non-empty string")
        for key in child:
            if key not in ("kind", "user_id", "user_login", "payload"):
                raise EmitInvalid(f"{where}.{key}", f"unknown field {key[:64]!r} in {where}")
        payload = child.get("payload", {})
        if not isinstance(payload, dict):
            raise EmitInvalid(f"{where}.payload", f"{where}.payload must be an object")
        out.append(EventChild(kind=kind, user_id=_optional_str(child, "user_id", MAX_ID),
                              user_login=_optional_str(child, "user_login", MAX_NAME),
                              payload=payload))
    return tuple(out)


def _row(ev: PlatformEvent) -> dict[str, Any]:
    row = ev.to_json()
    row.pop("v", None)
    return row


def emit_handler(insert_event: Callable[[PlatformEvent], PersistResult], alerts: Alerts | None,
                 token: Secret | None, metrics: Metrics) -> Handler:
    def handle(request: Request) -> Response:
        response = _handle(request)
        metrics.http_emit_requests.labels(str(response.status)).inc()
        return response

    def _handle(request: Request) -> Response:
        refused = check_bearer(request, token, TOKEN_KEY, f"POST {PATH}")
        if refused is not None:
            return refused
        try:
            ev = parse_emit(request.body)
        except EmitInvalid as exc:
            return Response.json(400, {"error": str(exc), "field": exc.field})
        result = insert_event(ev)
        if result.outcome == "stored":
            if alerts is not None:
                alerts.publish(result.event)
            return Response.json(201, {"event": _row(result.event)})
        if result.outcome == "duplicate":
            return Response.json(200, {"duplicate": True, "external_id": ev.external_id,
                                       "event": _row(result.event)})
        if result.outcome == "rejected":
            log.warning("emit: the database refused an event of account %s (%s, SQLSTATE %s)",
                        ev.account_id, ev.type, result.sqlstate)
            return Response.json(422, {"error": "the database refused the event",
                                       "sqlstate": result.sqlstate})
        log.warning("emit: database unavailable (%s); answered 503", result.error)
        return Response.json(503, {"error": "the database is unavailable; retry later"},
                             {"Retry-After": str(RETRY_AFTER_SECS)})

    return handle
