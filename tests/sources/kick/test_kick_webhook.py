"""POST /webhooks/kick over real HTTP into real Redis + PostgreSQL: signed (RSA), fresh, once.

The stand-in Kick signs with its own test key pair (the rig configures its
public key); Kick's published key is checked against the real corpus delivery
in test_corpus_kick.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.chat.deadletter import ChatDeadLetterDrain
from lumio_ingestd.devkit.standins.kick import KickStandin, pusher_chat, user, webhook_chat
from lumio_ingestd.events import EventRetryWorker
from support import dbname_of
from support.harness.servers import PostgresServer, wait_until
from support.kick import ACCOUNT, BROADCASTER, CHAT_CHANNEL, CHATROOM, EVENT_CHANNEL, KickRig, make_rig


@pytest.fixture
def fake() -> Iterator[KickStandin]:
    with KickStandin() as f:
        yield f


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fake: KickStandin) -> Iterator[KickRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    try:
        yield r
    finally:
        r.close()


def stamp(delta: timedelta = timedelta()) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def sub_body(username: str = "loyal", duration: int = 6) -> dict[str, Any]:
    return {"broadcaster": user(*BROADCASTER), "subscriber": user(555, username), "duration": duration,
            "created_at": stamp(), "expires_at": stamp(timedelta(days=30))}


def everything_stored(rig: KickRig) -> int:
    return sum(rig.event_types().values()) + sum(rig.chat_ids().values())


def result(rig: KickRig, name: str) -> float:
    return rig.value("http_webhook_requests_total", platform="kick", result=name)


def test_a_valid_delivery_is_stored_once_and_a_replayed_id_is_not_stored_again(
        rig: KickRig, fake: KickStandin) -> None:
    with rig.serving_webhooks():
        status, mid = fake.send_webhook("channel.subscription.renewal", sub_body())
        assert status == 200
        rows = rig.rows("SELECT type, account_id, user_id, platform FROM events")
        assert rows == [("channel.subscription.renewal", ACCOUNT, "555", "kick")]
        assert wait_until(lambda: rig.value("events_alerts_published_total", sink="redis") == 1, 5)
        # The same delivery again (Kick retries with the same message id): 2xx, nothing new.
        again, _ = fake.send_webhook("channel.subscription.renewal", sub_body(), message_id=mid)
        assert again == 200
        assert result(rig, "replayed") == 1
        assert rig.rows("SELECT count(*) FROM events") == [(1,)]
        assert rig.redis.exists(f"lumio:webhooks:kick:seen:{mid}") == 1


def test_forged_other_body_missing_header_stale_and_future_deliveries_are_refused(
        rig: KickRig, fake: KickStandin) -> None:
    body = json.dumps(sub_body()).encode()
    other = json.dumps(sub_body("someone_else")).encode()
    with rig.serving_webhooks():
        ts = stamp()
        good_sig = fake.key.sign(b"m1." + ts.encode() + b"." + body)
        assert fake.send_webhook("channel.subscription.new", other, message_id="m1", timestamp=ts,
                                 signature=good_sig)[0] == 403  # a signature of another body
        assert fake.send_webhook("channel.subscription.new", body, message_id="m2", timestamp=ts,
                                 signature=good_sig)[0] == 403  # ... of another message id
        assert fake.send_webhook("channel.subscription.new", body, signature="AAAA" * 86)[0] == 403
        assert fake.send_webhook("channel.subscription.new", body, signature="not base64!")[0] == 403
        for header in ("Kick-Event-Message-Id", "Kick-Event-Message-Timestamp", "Kick-Event-Signature",
                       "Kick-Event-Type"):
            assert fake.send_webhook("channel.subscription.new", body, drop_headers=[header])[0] == 400
        assert fake.send_webhook("channel.subscription.new", body,
                                 timestamp=stamp(timedelta(minutes=-11)))[0] == 403
        assert fake.send_webhook("channel.subscription.new", body,
                                 timestamp=stamp(timedelta(minutes=11)))[0] == 403
        assert fake.send_webhook("channel.subscription.new", body, timestamp="yesterday")[0] == 400
        assert fake.send_webhook("channel.subscription.new", b"{not json")[0] == 400
        assert fake.send_webhook("channel.subscription.new", {"broadcaster": user(*BROADCASTER)})[0] == 400
    assert everything_stored(rig) == 0
    assert rig.redis.keys("lumio:events:*") == [] and rig.redis.keys("lumio:chat:*") == []
    assert result(rig, "forged") == 4 and result(rig, "stale") == 2 and result(rig, "bad_request") == 7


def test_all_ten_documented_event_types_are_mapped(rig: KickRig, fake: KickStandin) -> None:
    b = user(*BROADCASTER)
    bodies: dict[str, dict[str, Any]] = {
        "chat.message.sent": webhook_chat(BROADCASTER, str(uuid.uuid4()), "hello [emote:1:wave]"),
        "channel.followed": {"broadcaster": b, "follower": user(10, "follower")},
        "channel.subscription.new": sub_body("newbie", 1),
        "channel.subscription.renewal": sub_body("loyal", 7),
        "channel.subscription.gifts": {"broadcaster": b, "gifter": user(11, "gifter"),
                                       "giftees": [user(12, "lucky"), user(13, "luckier")],
                                       "created_at": stamp(), "expires_at": stamp()},
        "channel.reward.redemption.updated": {
            "id": "01KBHE78QE4HZY1617DK5FC7YD", "user_input": "", "status": "accepted",
            "redeemed_at": stamp(),
            "reward": {"id": "r1", "title": "Hydrate", "cost": 100, "description": ""},
            "redeemer": {"user_id": 14, "username": "fan"}, "broadcaster": b},
        "livestream.status.updated": {"broadcaster": b, "is_live": True, "title": "t",
                                      "started_at": stamp(), "ended_at": None},
        "livestream.metadata.updated": {"broadcaster": b, "metadata": {"title": "t", "language": "en",
                                                                       "has_mature_content": False}},
        "moderation.banned": {"broadcaster": b, "moderator": user(15, "mod"),
                              "banned_user": user(16, "troll"),
                              "metadata": {"reason": "spam", "created_at": stamp(), "expires_at": None}},
        "kicks.gifted": {"broadcaster": b, "sender": user(17, "tipper"),
                         "gift": {"amount": 100, "name": "Full Send", "type": "BASIC", "tier": "BASIC",
                                  "message": "gg", "pinned_time_seconds": 0}, "created_at": stamp()},
    }
    with rig.serving_webhooks():
        for event_type, body in bodies.items():
            assert fake.send_webhook(event_type, body)[0] == 200, event_type
        assert fake.send_webhook("channel.something.new", {"broadcaster": b})[0] == 200  # acknowledged
        other = {"broadcaster": user(999, "not_ours"), "follower": user(10, "f")}
        assert fake.send_webhook("channel.followed", other)[0] == 200
    assert wait_until(lambda: len(rig.chat_ids()) == 1, 5)
    types = rig.event_types()
    assert set(types) == set(bodies) - {"chat.message.sent"} and set(types.values()) == {1}
    assert rig.rows("SELECT count(*) FROM event_children") == [(2,)]
    assert rig.rows("SELECT count(*) FROM stream_sessions WHERE ended_at IS NULL") == [(1,)]
    assert result(rig, "unsupported") == 1 and result(rig, "unknown_account") == 1


def test_chat_and_events_seen_on_the_socket_and_a_webhook_are_one_row(
        rig: KickRig, fake: KickStandin) -> None:
    src = rig.source()
    src.start()
    fake.wait_subscribed(EVENT_CHANNEL)
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    mid = str(uuid.uuid4())
    now = stamp()
    with rig.serving_webhooks():
        fake.publish(CHAT_CHANNEL, "ChatMessageEvent",
                     pusher_chat(CHATROOM, mid, "both ways", created_at=now.replace("Z", "+00:00")))
        fake.publish(CHAT_CHANNEL, "SubscriptionEvent",
                     {"chatroom_id": CHATROOM, "username": "Loyal", "months": 6})
        fake.publish(CHAT_CHANNEL, "GiftedSubscriptionsEvent", {
            "chatroom_id": CHATROOM, "gifted_usernames": ["lucky", "luckier"], "gifter_username": "gifter",
            "gifter_total": 3})
        fake.publish(EVENT_CHANNEL, "StreamerIsLive", {"livestream": {
            "id": 5, "channel_id": 1, "session_title": "t", "created_at": started.isoformat()}})
        assert wait_until(lambda: sum(rig.event_types().values()) == 3 and len(rig.chat_ids()) == 1, 10)
        b = user(*BROADCASTER)
        assert fake.send_webhook("chat.message.sent", webhook_chat(BROADCASTER, mid, "both ways",
                                                                   created_at=now))[0] == 200
        assert fake.send_webhook("channel.subscription.renewal", sub_body("loyal", 6))[0] == 200
        assert fake.send_webhook("channel.subscription.gifts", {
            "broadcaster": b, "gifter": user(11, "Gifter"),
            "giftees": [user(13, "luckier"), user(12, "Lucky")],
            "created_at": stamp(), "expires_at": stamp()})[0] == 200
        assert fake.send_webhook("livestream.status.updated", {
            "broadcaster": b, "is_live": True, "title": "t",
            "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ended_at": None})[0] == 200
    time.sleep(0.5)  # the chat flusher's interval is 0.2 s: a second row would show by now
    assert rig.chat_ids() == {mid: 1}
    assert rig.event_types() == {"channel.subscription.renewal": 1, "channel.subscription.gifts": 1,
                                 "livestream.status.updated": 1}
    assert rig.rows("SELECT count(*) FROM stream_sessions") == [(1,)]
    assert rig.value("events_persist_failures_total", outcome="rejected") == 0


def test_a_6s_database_outage_during_deliveries_parks_replays_and_stores_once(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str, fake: KickStandin) -> None:
    rig = make_rig(tmp_path, private_pg.url("postgres"), redis_url, fake,
                   extra={"chat": {"deadletter_drain_interval_secs": 0.5}})
    # The daemon's recovery workers: parked events replayed, dead-lettered chat drained.
    retry = EventRetryWorker(rig.redis, rig.pool, rig.metrics, rig.cfg, lease_ttl_secs=2.0)
    drain = ChatDeadLetterDrain(rig.redis, rig.pool, rig.metrics, rig.cfg, lease_ttl_secs=2.0)
    retry.start()
    drain.start()
    sent_events: list[str] = []
    sent_chat: list[str] = []
    statuses: list[int] = []
    try:
        with rig.serving_webhooks():
            stop = threading.Event()

            def deliver() -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    mid = str(uuid.uuid4())
                    statuses.append(fake.send_webhook("chat.message.sent",
                                                      webhook_chat(BROADCASTER, mid, f"c{n}"))[0])
                    sent_chat.append(mid)
                    status, _ = fake.send_webhook("channel.followed", {
                        "broadcaster": user(*BROADCASTER), "follower": user(n, f"f{n}")})
                    statuses.append(status)
                    sent_events.append(f"f{n}")
                    stop.wait(0.1)

            sender = threading.Thread(target=deliver, name="kick-test-deliver")
            sender.start()
            try:
                time.sleep(1.0)
                private_pg.stop()
                time.sleep(6.0)
                private_pg.start()
                time.sleep(1.0)
            finally:
                stop.set()
                sender.join(30)
        assert set(statuses) == {200}, statuses
        assert rig.value("events_persist_failures_total", outcome="parked") >= 1

        def stored() -> bool:
            return sum(rig.chat_ids().values()) == len(sent_chat) and \
                sum(rig.event_types().values()) == len(sent_events)
        assert wait_until(stored, 30), (len(rig.chat_ids()), len(sent_chat), rig.event_types())
        assert set(rig.chat_ids()) == set(sent_chat) and set(rig.chat_ids().values()) == {1}
        followers = rig.rows("SELECT payload->'follower'->>'username' FROM events")
        assert sorted(f for (f,) in followers) == sorted(sent_events)
        assert rig.value("events_persist_failures_total", outcome="rejected") == 0
        assert rig.value("events_persist_failures_total", outcome="lost") == 0
    finally:
        for worker in (retry, drain):
            worker.request_stop()
        for worker in (retry, drain):
            worker.join(10)
        rig.close()
