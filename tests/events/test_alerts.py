"""Live alerts: Redis PUBLISH and Server-Sent Events over real sockets; a stalled client never slows
ingest."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.events.alerts import STREAM_PATH, alerts_channel, stream_handler
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.web.server import Routes
from support import dbname_of
from support import twitch_frames as tf
from support.alerts import Reader, open_stream, stream_routes
from support.harness.servers import PostgresServer, wait_until
from support.http_client import call, serving
from support.twitch import EMIT_TOKEN, TwitchRig, make_rig


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[TwitchRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, None)
    try:
        yield r
    finally:
        r.close()


def event(account: int = 42, n: int = 0, payload_bytes: int = 0) -> PlatformEvent:
    payload = dict(tf.cheer_event(str(n)))
    if payload_bytes:
        payload["padding"] = "x" * payload_bytes
    return PlatformEvent.new(account_id=account, platform="twitch", type="channel.cheer",
                             payload=payload, external_id=f"alert-{account}-{n}-{time.monotonic_ns()}",
                             user_id=str(n))


def test_every_taken_event_is_published_on_redis(rig: TwitchRig) -> None:
    pubsub = rig.redis.pubsub()
    pubsub.subscribe(alerts_channel(42))
    first = pubsub.get_message(timeout=5)
    assert first is not None and first["type"] == "subscribe"
    ev = event()
    assert rig.sink.persist(ev).outcome == "stored"
    assert rig.sink.persist(ev).outcome == "duplicate"  # a redelivery: no second alert
    msg = pubsub.get_message(timeout=5)
    assert msg is not None and msg["channel"] == b"lumio:alerts:{42}"
    assert json.loads(msg["data"]) == json.loads(json.dumps(ev.to_json()))
    assert pubsub.get_message(timeout=0.5) is None
    pubsub.close()


def test_sse_clients_get_their_accounts_alerts(rig: TwitchRig) -> None:
    with serving(stream_routes(rig, rig.cfg.http.emit_token, heartbeat_secs=0.3), rig.metrics) as port:
        reader = Reader(open_stream(port, 42))
        try:
            assert wait_until(lambda: rig.alerts.client_count() == 1, 5)
            mine, other = event(42, 1), event(43, 2)
            rig.sink.persist(other)
            rig.sink.persist(mine)
            assert wait_until(lambda: len(reader.messages()) == 1 and b"keepalive" in reader.data, 5)
            [msg] = reader.messages()
            assert msg["id"] == str(mine.id) and msg["event"] == "alert"
            assert json.loads(msg["data"])["external_id"] == mine.external_id
            assert reader.data.startswith(b"HTTP/1.0 200") and b"text/event-stream" in reader.data
        finally:
            reader.close()
        assert wait_until(lambda: rig.alerts.client_count() == 0, 5)


def test_the_stream_needs_the_bearer_token(rig: TwitchRig) -> None:
    with serving(stream_routes(rig, rig.cfg.http.emit_token)) as port:
        path = "/v1/accounts/42/alerts/stream"
        assert call(port, "GET", path).status == 401
        assert call(port, "GET", path, headers={"Authorization": "Bearer wrong"}).status == 401
    with serving(stream_routes(rig, None)) as port:
        reply = call(port, "GET", path, headers={"Authorization": f"Bearer {EMIT_TOKEN}"})
        assert reply.status == 403 and "[http] emit_token_file" in reply.json()["error"]


def ingest(rig: TwitchRig, n: int, payload_bytes: int) -> float:
    """Persist `n` events through the sink (insert + alert), like a source does; returns seconds."""
    started = time.monotonic()
    for i in range(n):
        assert rig.sink.persist(event(42, i, payload_bytes)).outcome == "stored"
    return time.monotonic() - started


def test_a_stalled_stream_client_is_dropped_and_never_slows_ingest(rig: TwitchRig) -> None:
    n, size = 400, 32 * 1024
    baseline = ingest(rig, n, size)
    with serving(stream_routes(rig, rig.cfg.http.emit_token), rig.metrics) as port:
        stalled = open_stream(port, 42, rcvbuf=4096)  # connects, then never reads a byte
        try:
            assert wait_until(lambda: rig.alerts.client_count() == 1, 5)
            took: list[float] = []
            worker = threading.Thread(target=lambda: took.append(ingest(rig, n, size)))
            worker.start()
            # A publisher that blocked on this client would never finish: it never reads.
            worker.join(60)
            assert not worker.is_alive() and took, "ingest was blocked by a stalled alert client"
            assert rig.value("http_alert_streams_dropped_total") == 1
            assert rig.value("events_alerts_dropped_total", reason="client_slow") >= 1
            assert wait_until(lambda: rig.alerts.client_count() == 0, 5)
        finally:
            stalled.close()
    assert rig.rows("SELECT count(*) FROM events") == [(2 * n,)]
    print(f"\ningest of {n} events with {size // 1024} KiB payloads: {baseline:.2f}s alone, "
          f"{took[0]:.2f}s with a stalled alert-stream client (dropped)")


def test_alert_streams_are_capped_so_webhooks_keep_their_slots(rig: TwitchRig) -> None:
    routes = Routes()
    routes.add("GET", STREAM_PATH, stream_handler(rig.alerts, rig.cfg.http.emit_token, rig.metrics,
                                                  max_streams=1))
    with serving(routes, rig.metrics) as port:
        first = Reader(open_stream(port, 42))
        try:
            assert wait_until(lambda: rig.alerts.client_count() == 1, 5)
            with open_stream(port, 42) as second:
                reply = b""
                while chunk := second.recv(65536):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.0 503") and b"Retry-After: 5" in reply
            assert rig.alerts.client_count() == 1
        finally:
            first.close()


def test_an_alert_published_after_the_publisher_finished_is_counted_dropped(rig: TwitchRig) -> None:
    rig.alerts.final()
    rig.alerts.publish(event(42, 7))
    assert rig.value("events_alerts_dropped_total", reason="shutdown") == 1
