"""POST /webhooks/twitch over real HTTP into real Redis + PostgreSQL: signed, fresh, once."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lumio_ingestd.sources.twitch.webhook import MAX_BODY_BYTES, PATH, TwitchWebhook, signature
from lumio_ingestd.stores.seen import SeenDeliveries
from lumio_ingestd.web.server import Routes
from support import dbname_of
from support import twitch_frames as tf
from support.harness.servers import PostgresServer, wait_until
from support.http_client import Reply, call, serving
from support.twitch import WEBHOOK_SECRET, TwitchRig, make_rig


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[TwitchRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, None)
    try:
        yield r
    finally:
        r.close()


def receiver(rig: TwitchRig, **kwargs: object) -> TwitchWebhook:
    return TwitchWebhook(rig.cfg.twitch.webhook_secret, {"12826": 42}, rig.sink, rig.chat.buffer_or_persist,
                         SeenDeliveries(rig.redis, "twitch"), rig.metrics, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def port(rig: TwitchRig) -> Iterator[int]:
    routes = Routes()
    routes.add("POST", PATH, receiver(rig, gift_wait_secs=3.0).handle, max_body_bytes=MAX_BODY_BYTES)
    with serving(routes, rig.metrics) as p:
        yield p


def ts(delta: timedelta = timedelta()) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def deliver(port: int, sub_type: str, event: dict[str, object] | None = None, *,
            message_type: str = "notification", message_id: str | None = None, timestamp: str | None = None,
            secret: str = WEBHOOK_SECRET, body: bytes | None = None, version: str = "1") -> tuple[Reply, str]:
    message_id = message_id or str(uuid.uuid4())
    timestamp = timestamp or ts()
    if body is None:
        sub = tf.subscription(sub_type, version, {"method": "webhook", "callback": "https://x/webhooks/twitch"})
        obj: dict[str, object] = {"subscription": sub}
        if event is not None:
            obj["event"] = event
        body = json.dumps(obj).encode()
    headers = {"Twitch-Eventsub-Message-Id": message_id, "Twitch-Eventsub-Message-Retry": "0",
               "Twitch-Eventsub-Message-Type": message_type,
               "Twitch-Eventsub-Message-Signature": signature(secret, message_id, timestamp, body),
               "Twitch-Eventsub-Message-Timestamp": timestamp,
               "Twitch-Eventsub-Subscription-Type": sub_type,
               "Twitch-Eventsub-Subscription-Version": version, "Content-Type": "application/json"}
    return call(port, "POST", PATH, body, headers), message_id


def result(rig: TwitchRig, name: str) -> float:
    return rig.value("http_webhook_requests_total", platform="twitch", result=name)


def test_a_valid_notification_is_stored_once_and_announced(rig: TwitchRig, port: int) -> None:
    reply, mid = deliver(port, "channel.cheer", tf.cheer_event("1234", 300))
    assert reply.status == 204
    rows = rig.rows("SELECT external_id, type, user_id, account_id, payload FROM events")
    assert rows == [(mid, "channel.cheer", "1234", 42, tf.cheer_event("1234", 300))]
    assert wait_until(lambda: rig.value("events_alerts_published_total", sink="redis") == 1, 5)
    redemption, _ = deliver(port, "channel.channel_points_custom_reward_redemption.add",
                            tf.redemption_event("red-9"))
    assert redemption.status == 204 and rig.event_ids()["red-9"] == 1  # the platform's own id


def test_forged_stale_and_malformed_deliveries_are_refused_before_anything_is_stored(
        rig: TwitchRig, port: int) -> None:
    forged, _ = deliver(port, "channel.cheer", tf.cheer_event(), secret="not-the-secret-at-all")
    stale, _ = deliver(port, "channel.cheer", tf.cheer_event(), timestamp=ts(-timedelta(minutes=11)))
    future, _ = deliver(port, "channel.cheer", tf.cheer_event(), timestamp=ts(timedelta(minutes=11)))
    body = json.dumps({"subscription": tf.subscription("channel.cheer"), "event": tf.cheer_event()}).encode()
    tampered_headers = {"Twitch-Eventsub-Message-Id": "m-1", "Twitch-Eventsub-Message-Type": "notification",
                        "Twitch-Eventsub-Message-Timestamp": ts(),
                        "Twitch-Eventsub-Message-Signature": signature(WEBHOOK_SECRET, "m-1", ts(), b"{}")}
    tampered = call(port, "POST", PATH, body, tampered_headers)
    unsigned = call(port, "POST", PATH, body, {"Twitch-Eventsub-Message-Id": "m-2"})
    not_json, _ = deliver(port, "channel.cheer", body=b"{not json")
    assert [r.status for r in (forged, stale, future, tampered, unsigned, not_json)] == \
        [403, 403, 403, 403, 400, 400]
    assert b"Traceback" not in forged.body + stale.body + not_json.body
    assert rig.rows("SELECT count(*) FROM events") == [(0,)]
    assert (result(rig, "forged"), result(rig, "stale"), result(rig, "bad_request")) == (2, 2, 2)


def test_a_replayed_delivery_id_gets_2xx_and_is_not_stored_again(rig: TwitchRig, port: int) -> None:
    first, mid = deliver(port, "channel.follow", tf.follow_event("55"), version="2")
    assert first.status == 204
    again, _ = deliver(port, "channel.follow", tf.follow_event("55"), version="2", message_id=mid)
    assert again.status == 200 and again.json() == {"duplicate": True}
    # Another replica (fresh memory) sees it in Redis.
    routes = Routes()
    routes.add("POST", PATH, receiver(rig).handle)
    with serving(routes) as other:
        third, _ = deliver(other, "channel.follow", tf.follow_event("55"), version="2", message_id=mid)
    assert third.status == 200
    assert list(rig.event_ids().values()) == [1] and next(iter(rig.event_ids())).startswith("follow:55:")
    assert result(rig, "replayed") == 2


def test_the_verification_challenge_is_answered_as_plain_text(rig: TwitchRig, port: int) -> None:
    body = json.dumps({"challenge": "pogchamp-kappa-360noscope-vohiyo",
                       "subscription": tf.subscription("channel.cheer")}).encode()
    reply, _ = deliver(port, "channel.cheer", message_type="webhook_callback_verification", body=body)
    assert reply.status == 200
    assert reply.body == b"pogchamp-kappa-360noscope-vohiyo"
    assert reply.headers["content-type"].startswith("text/plain")
    assert reply.headers["content-length"] == str(len(reply.body))


def test_revocations_are_logged_counted_and_acknowledged(
        rig: TwitchRig, port: int, caplog: pytest.LogCaptureFixture) -> None:
    sub = tf.subscription("channel.cheer")
    sub["status"] = "notification_failures_exceeded"
    reply, _ = deliver(port, "channel.cheer", message_type="revocation",
                       body=json.dumps({"subscription": sub}).encode())
    assert reply.status == 204
    assert rig.value("source_revocations_total", platform="twitch",
                     status="notification_failures_exceeded") == 1
    assert "notification_failures_exceeded" in caplog.text and "channel.cheer" in caplog.text


def test_bodies_over_the_limit_are_refused(rig: TwitchRig, port: int) -> None:
    reply, _ = deliver(port, "channel.cheer", body=b"{" + b" " * MAX_BODY_BYTES + b"}")
    assert reply.status == 413
    assert rig.rows("SELECT count(*) FROM events") == [(0,)]


def test_chat_stream_sessions_and_unknown_channels(rig: TwitchRig, port: int) -> None:
    chat, _ = deliver(port, "channel.chat.message", tf.chat_event("hook-chat-1"))
    online, _ = deliver(port, "stream.online", tf.online_event("s-77", "2026-01-05T18:00:00Z"))
    other = tf.cheer_event()
    sub = tf.subscription("channel.cheer", transport={"method": "webhook"})
    sub["condition"] = {"broadcaster_user_id": "999999"}
    unknown, _ = deliver(port, "channel.cheer",
                         body=json.dumps({"subscription": sub, "event": other}).encode())
    assert (chat.status, online.status, unknown.status) == (204, 204, 200)
    assert wait_until(lambda: rig.chat_ids() == {"hook-chat-1": 1}, 10)
    assert rig.rows("SELECT external_id, ended_at FROM stream_sessions") == [("s-77", None)]
    assert rig.event_ids() == {"s-77": 1}  # nothing for the unknown channel
    assert result(rig, "unknown_account") == 1


def test_a_gift_bomb_request_waits_for_its_gifted_subs_and_links_them(rig: TwitchRig, port: int) -> None:
    replies: list[Reply] = []

    def bomb() -> None:
        replies.append(deliver(port, "channel.subscription.gift", tf.gift_event(2, gifter="g9"))[0])

    thread = threading.Thread(target=bomb)
    thread.start()
    assert wait_until(lambda: rig.value("source_frames_total", platform="twitch", kind="event") == 1, 5)
    subs = [deliver(port, "channel.subscribe", tf.sub_event(f"w{i}", is_gift=True))[0] for i in range(2)]
    thread.join(10)
    assert [r.status for r in replies + subs] == [204, 204, 204]
    [(gift_id,)] = rig.rows("SELECT id::text FROM events WHERE type = 'channel.subscription.gift'")
    children = rig.rows("SELECT user_id FROM event_children WHERE event_id = %s ORDER BY ordinal", (gift_id,))
    assert children == [("w0",), ("w1",)]
    assert rig.value("events_gift_bombs_total", platform="twitch") == 1


def test_the_unsigned_type_header_cannot_change_how_a_signed_body_is_read(
        rig: TwitchRig, port: int) -> None:
    """The subscription type header is not covered by the HMAC: a delivery whose header
    disagrees with its signed body is refused, and nothing is stored under either type."""
    body = json.dumps({"subscription": tf.subscription("channel.cheer", "1", {"method": "webhook"}),
                       "event": tf.cheer_event("1234", 50)}).encode()
    mid, stamp = str(uuid.uuid4()), ts()
    headers = {"Twitch-Eventsub-Message-Id": mid, "Twitch-Eventsub-Message-Type": "notification",
               "Twitch-Eventsub-Message-Timestamp": stamp,
               "Twitch-Eventsub-Message-Signature": signature(WEBHOOK_SECRET, mid, stamp, body),
               "Twitch-Eventsub-Subscription-Type": "channel.raid",
               "Twitch-Eventsub-Subscription-Version": "1", "Content-Type": "application/json"}
    reply = call(port, "POST", PATH, body, headers)
    assert reply.status == 400
    assert rig.rows("SELECT type FROM events") == []


def test_a_flood_of_forged_deliveries_logs_one_warning(
        rig: TwitchRig, port: int, caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(5):
        forged, _ = deliver(port, "channel.cheer", tf.cheer_event(), secret="not-the-secret-at-all")
        assert forged.status == 403
    warnings = [r for r in caplog.records if "signature mismatch" in r.getMessage()]
    assert len(warnings) == 1
    assert result(rig, "forged") == 5  # the metric still counts every one
