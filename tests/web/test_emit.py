"""POST /v1/events/emit over real HTTP into real PostgreSQL: 201, 200 duplicate, 4xx, 401, 403, 503."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lumio_ingestd.config import Secret
from lumio_ingestd.model import parse_time
from lumio_ingestd.web.emit import MAX_BODY_BYTES, PATH, emit_handler
from lumio_ingestd.web.server import Routes
from support import dbname_of
from support.harness.servers import PostgresServer, wait_until
from support.http_client import Reply, call, serving
from support.twitch import EMIT_TOKEN, TwitchRig, make_rig

AUTH = {"Authorization": f"Bearer {EMIT_TOKEN}", "Content-Type": "application/json"}


def serve_emit(rig: TwitchRig, token: Secret | None) -> Routes:
    routes = Routes()
    routes.add("POST", PATH, emit_handler(rig.events.insert_event, rig.alerts, token, rig.metrics),
               max_body_bytes=MAX_BODY_BYTES)
    return routes


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[TwitchRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, None)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def port(rig: TwitchRig) -> Iterator[int]:
    with serving(serve_emit(rig, rig.cfg.http.emit_token), rig.metrics) as p:
        yield p


def emit(port: int, obj: object, headers: dict[str, str] | None = None) -> Reply:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return call(port, "POST", PATH, body, AUTH if headers is None else headers)


def good(**changes: object) -> dict[str, object]:
    obj: dict[str, object] = {"account_id": 42, "platform": "twitch", "type": "lumio.test_alert",
                              "payload": {"amount": 5, "text": "hello"}, "user_id": "1234",
                              "created_at": "2026-02-01T12:00:00.123456Z",
                              "children": [{"kind": "recipient", "user_id": "9", "payload": {"n": 1}}]}
    obj.update(changes)
    return obj


def test_201_with_the_stored_row(rig: TwitchRig, port: int) -> None:
    reply = emit(port, good(external_id="ext-1"))
    assert reply.status == 201, reply.body
    row = reply.json()["event"]
    assert (row["account_id"], row["type"], row["external_id"], row["payload"]) == (
        42, "lumio.test_alert", "ext-1", {"amount": 5, "text": "hello"})
    stored = rig.rows("SELECT id::text, created_at, user_id FROM events")
    assert stored == [(row["id"], parse_time(row["created_at"]), "1234")]
    assert stored[0][1] == datetime(2026, 2, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert rig.rows("SELECT kind, user_id FROM event_children") == [("recipient", "9")]
    assert wait_until(lambda: rig.value("events_alerts_published_total", sink="redis") == 1, 5)
    # A client's retry of the same external id: 200, not a second row.
    again = emit(port, good(external_id="ext-1"))
    assert again.status == 200 and again.json()["duplicate"] is True
    assert rig.rows("SELECT count(*) FROM events") == [(1,)]
    # Without created_at: now.
    assert emit(port, {"account_id": 42, "platform": "kick", "type": "x"}).status == 201


@pytest.mark.parametrize(("body", "field"), [
    (b"{not json", None),
    (b"[]", None),
    ({"platform": "twitch", "type": "x"}, "account_id"),
    ({"account_id": True, "platform": "twitch", "type": "x"}, "account_id"),
    ({"account_id": 42, "platform": "myspace", "type": "x"}, "platform"),
    ({"account_id": 42, "platform": "twitch"}, "type"),
    ({"account_id": 42, "platform": "twitch", "type": "has space"}, "type"),
    ({"account_id": 42, "platform": "twitch", "type": "x", "payload": [1]}, "payload"),
    ({"account_id": 42, "platform": "twitch", "type": "x", "external_id": ""}, "external_id"),
    ({"account_id": 42, "platform": "twitch", "type": "x", "created_at": "yesterday"}, "created_at"),
    ({"account_id": 42, "platform": "twitch", "type": "x", "created_at": "1970-01-01T00:00:00Z"},
     "created_at"),
    ({"account_id": 42, "platform": "twitch", "type": "x", "children": [{"user_id": "1"}]},
     "children[0].kind"),
    ({"account_id": 42, "platform": "twitch", "type": "x", "acount": 1}, "acount"),
])
def test_bad_input_is_400_naming_the_field(rig: TwitchRig, port: int, body: object,
                                           field: str | None) -> None:
    reply = emit(port, body)
    assert reply.status == 400, reply.body
    assert reply.json()["field"] == field
    assert rig.rows("SELECT count(*) FROM events") == [(0,)]


def test_missing_or_wrong_token_is_401(rig: TwitchRig, port: int) -> None:
    missing = emit(port, good(), {"Content-Type": "application/json"})
    wrong = emit(port, good(), {"Authorization": "Bearer not-the-token"})
    basic = emit(port, good(), {"Authorization": f"Basic {EMIT_TOKEN}"})
    assert [r.status for r in (missing, wrong, basic)] == [401, 401, 401]
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert EMIT_TOKEN.encode() not in missing.body + wrong.body + basic.body
    assert rig.rows("SELECT count(*) FROM events") == [(0,)]


def test_without_a_configured_token_the_endpoint_is_403_naming_the_key(rig: TwitchRig) -> None:
    with serving(serve_emit(rig, None)) as p:
        reply = emit(p, good())
    assert reply.status == 403
    assert "[http] emit_token_file" in reply.json()["error"]


def test_database_down_is_503_with_retry_after_and_nothing_parked(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str) -> None:
    rig = make_rig(tmp_path, private_pg.url("postgres"), redis_url, None)
    try:
        with serving(serve_emit(rig, rig.cfg.http.emit_token), rig.metrics) as p:
            assert emit(p, good(external_id=str(uuid.uuid4()))).status == 201
            private_pg.stop()
            reply = emit(p, good(external_id="while-down"))
            assert reply.status == 503
            assert reply.headers["retry-after"] == "5"
            assert rig.redis.keys("lumio:events:*") == []  # nothing parked: the client retries
            assert rig.value("events_persist_failures_total", outcome="parked") == 0
            private_pg.start()
            assert wait_until(lambda: emit(p, good(external_id="while-down")).status == 201, 15)
        assert rig.rows("SELECT count(*) FROM events WHERE external_id = 'while-down'") == [(1,)]
    finally:
        rig.close()
