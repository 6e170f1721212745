"""The Kick Pusher source against the stand-in Kick over real sockets, into real Redis + PostgreSQL.

Covers the Pusher socket as docs/platforms.rst describes it: subscriptions within 5 s of
`connection_established` (and again after every reconnect), chat and events
stored with the documented types, the same gift seen on two channels counted
once, stream sessions opened and closed, ping/pong both ways, a dead
connection found and replaced, every close-code class, exactly-once chat
across a forced disconnect, and malformed frames refused without taking good
data along.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.kick import KickStandin, PusherConnection, pusher_chat
from support import dbname_of
from support.harness.servers import PostgresServer, wait_until
from support.kick import ACCOUNT, CHAT_CHANNEL, CHATROOM, EVENT_CHANNEL, KickRig, make_rig


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


def chat(fake: KickStandin, message_id: str | None = None, text: str = "hi") -> tuple[str, int]:
    mid = message_id or str(uuid.uuid4())
    return mid, fake.publish(CHAT_CHANNEL, "ChatMessageEvent", pusher_chat(CHATROOM, mid, text))


def connected(fake: KickStandin, n: int = 1) -> PusherConnection:
    pc = fake.wait_subscribed(CHAT_CHANNEL, n)
    assert fake.wait_for(lambda: EVENT_CHANNEL in pc.channels, 5)
    return pc


def test_subscribes_within_5s_and_stores_chat_and_events_with_their_types(
        rig: KickRig, fake: KickStandin) -> None:
    src = rig.source()
    src.start()
    pc = connected(fake)
    assert max(pc.channels.values()) < 5.0, pc.channels
    assert pc.inbound[0] == {"event": "pusher:subscribe", "data": {"auth": "", "channel": CHAT_CHANNEL}}
    assert wait_until(lambda: src.subscribed == {CHAT_CHANNEL, EVENT_CHANNEL}, 5)

    ids = [chat(fake, text=f"m{i}")[0] for i in range(3)]
    for name, months in (("Loyal", 6), ("Loyal", 6), ("newbie", 1)):  # the repeat is one row
        fake.publish(CHAT_CHANNEL, "SubscriptionEvent", {"chatroom_id": CHATROOM, "username": name,
                                                         "months": months})
    # The gift, then the same gift seen on the channel: one event, two recipients.
    fake.publish(CHAT_CHANNEL, "GiftedSubscriptionsEvent", {
        "chatroom_id": CHATROOM, "gifted_usernames": ["alice", "Bob"], "gifter_username": "Big_Gifter",
        "gifter_total": 150}, namespace="")
    fake.publish(EVENT_CHANNEL, "LuckyUsersWhoGotGiftSubscriptionsEvent", {
        "channel": {"id": 1, "chatroom": {"id": CHATROOM}}, "usernames": ["bob", "alice"],
        "gifter_username": "big_gifter"})
    fake.publish(CHAT_CHANNEL, "StreamHostEvent", {"chatroom_id": CHATROOM, "optional_message": None,
                                                   "number_viewers": 42, "host_username": "raider"})
    fake.publish(CHAT_CHANNEL, "RewardRedeemedEvent", {"reward_title": "Hydrate", "user_id": 77,
                                                       "channel_id": 1, "username": "fan", "user_input": ""},
                 namespace="")
    fake.publish(EVENT_CHANNEL, "StreamerIsLive", {"livestream": {
        "id": 991, "channel_id": 1, "session_title": "live!", "created_at": "2026-01-05T20:00:00Z"}})
    fake.publish(CHAT_CHANNEL, "UserBannedEvent", {"id": str(uuid.uuid4()),
                                                   "user": {"id": 5, "username": "troll"},
                                                   "banned_by": {"id": 6, "username": "mod"}})
    fake.publish(CHAT_CHANNEL, "MessageDeletedEvent", {"id": "del-1", "message": {"id": ids[0]}})
    fake.publish(CHAT_CHANNEL, "PinnedMessageCreatedEvent", {"message": {}})  # known, not stored
    assert wait_until(lambda: sum(rig.event_types().values()) == 8, 10), rig.event_types()
    fake.publish(EVENT_CHANNEL, "StopStreamBroadcast", {"livestream": {"id": 991, "channel": {"id": 1}}})

    assert wait_until(lambda: sorted(rig.chat_ids()) == sorted(ids), 10)
    assert wait_until(lambda: sum(rig.event_types().values()) == 9, 10)
    assert rig.event_types() == {
        "channel.subscription.renewal": 1, "channel.subscription.new": 1, "channel.subscription.gifts": 1,
        "StreamHostEvent": 1, "channel.reward.redemption.updated": 1, "livestream.status.updated": 2,
        "moderation.banned": 1, "MessageDeletedEvent": 1}
    gift_children = rig.rows("SELECT c.user_login FROM event_children c JOIN events e ON e.id = c.event_id "
                             "WHERE e.type = 'channel.subscription.gifts' ORDER BY 1")
    assert gift_children == [("Bob",), ("alice",)]
    row = rig.rows("SELECT account_id, platform, user_id, user_login, display_name, text, extras "
                   "FROM chat_messages WHERE message_id = %s", (ids[1],))
    assert row[0][:6] == (ACCOUNT, "kick", "1001", "chatfan", "ChatFan", "m1")
    assert row[0][6]["color"] == "#B9D6F6"
    assert wait_until(lambda: rig.rows("SELECT ended_at IS NOT NULL FROM stream_sessions "
                                       "WHERE platform = 'kick'") == [(True,)], 5)
    assert rig.value("source_bad_frames_total", platform="kick", reason="unsupported") == 1


def test_pings_both_ways_keep_the_connection(rig: KickRig, fake: KickStandin) -> None:
    fake.activity_timeout = 1  # the server's value wins when it is below ours
    src = rig.source()
    src.start()
    pc = connected(fake)
    # Client side: a pusher:ping after 1 s of silence, answered.
    assert fake.wait_for(lambda: pc.pings >= 2, 5), pc.pings
    # The source counts a ping after sending it: the server may have it first.
    assert src.activity_timeout == 1 and wait_until(lambda: src.pings_sent >= 2, 5)
    # Server side: its pusher:ping is answered with pusher:pong (traffic that also keeps ours quiet).
    fake.pong_timeout_secs = 2.0
    fake.server_ping_after_secs = 0.3
    assert fake.wait_for(lambda: pc.pongs >= 2, 5), pc.pongs
    assert wait_until(lambda: src.pongs_sent >= 2, 5)
    time.sleep(2.5)  # longer than the server's pong timeout: the answers keep it open
    assert pc.open and len(fake.connections) == 1


def test_a_dead_connection_is_found_and_replaced_in_time(rig: KickRig, fake: KickStandin) -> None:
    fake.activity_timeout = 1
    fake.answer_pings = False  # a half-dead server: the socket stays up, nothing comes back
    src = rig.source(pong_timeout_secs=1.0)
    src.start()
    first = connected(fake)
    started = time.monotonic()
    second = connected(fake, 2)
    # Found within activity timeout + pong timeout (+ margin), then subscribed again.
    assert time.monotonic() - started < 1 + 1 + 2.0
    assert rig.value("source_closes_total", platform="kick", code="keepalive") >= 1
    assert fake.wait_for(lambda: not first.open, 5)
    fake.answer_pings = True
    mid, n = chat(fake)
    assert n == 1 and second.open
    assert wait_until(lambda: rig.chat_ids() == {mid: 1}, 10)


def _reconnect_gap(fake: KickStandin, n: int, close: Callable[[PusherConnection], object]) -> float:
    """Seconds from closing connection `n` (as `close` does) to connection n + 1 subscribed."""
    pc = connected(fake, n)
    t0 = time.monotonic()
    close(pc)
    connected(fake, n + 1)
    return time.monotonic() - t0


def test_close_code_classes(rig: KickRig, fake: KickStandin, caplog: pytest.LogCaptureFixture) -> None:
    src = rig.source(config_backoff_secs=2.5)
    src.reconnect_min_secs = 0.05
    src.start()
    # 4200-4299: at once (even with a long usual backoff).
    src.reconnect_min_secs = src.reconnect_max_secs = 5.0
    assert _reconnect_gap(fake, 1, lambda pc: fake.close_connection(pc, 4200, "generic")) < 1.0
    # ... also when it comes as pusher:error.
    assert _reconnect_gap(fake, 2, lambda pc: fake.send_error(pc, 4201, "pong not received")) < 1.0
    # 4100-4199: back off, at least 1 s.
    src.reconnect_min_secs, src.reconnect_max_secs = 0.05, 0.3
    gap = _reconnect_gap(fake, 3, lambda pc: fake.close_connection(pc, 4100, "over capacity"))
    assert 1.0 <= gap < 4.0
    # 4000-4099: a configuration problem: a long backoff, logged as an error.
    with caplog.at_level(logging.ERROR, logger="lumio_ingestd.sources.kick.source"):
        gap = _reconnect_gap(fake, 4, lambda pc: fake.close_connection(pc, 4001, "App does not exist"))
    assert 2.5 <= gap < 6.0
    assert any("4001" in r.getMessage() and "pusher_url" in r.getMessage() for r in caplog.records)
    for label in ("retry", "backoff", "config"):
        assert rig.value("source_closes_total", platform="kick", code=label) >= 1, label
    # Every reconnect subscribed again.
    assert len(fake.subscribed(CHAT_CHANNEL)) == 1


def test_chat_is_stored_exactly_once_across_a_forced_disconnect(rig: KickRig, fake: KickStandin) -> None:
    src = rig.source()
    src.start()
    delivered: list[str] = []
    sent = 0
    conn_no = 1
    connected(fake, conn_no)
    deadline = time.monotonic() + 20
    while sent < 600 and time.monotonic() < deadline:
        mid, n = chat(fake, text=f"n{sent}")
        sent += 1
        if n:
            delivered.append(mid)
        if sent % 200 == 100:
            fake.close_all(4200 if conn_no % 2 else 4100, "forced")
            conn_no += 1
            connected(fake, conn_no)
    assert sent == 600 and len(delivered) >= 590
    assert wait_until(lambda: sum(rig.chat_ids().values()) >= len(delivered), 15)
    ids = rig.chat_ids()
    assert set(ids) == set(delivered) and set(ids.values()) == {1}


def test_malformed_frames_are_refused_without_taking_good_data(rig: KickRig, fake: KickStandin) -> None:
    src = rig.source()
    src.start()
    pc = connected(fake)
    good_before, _ = chat(fake)
    event = "App\\Events\\ChatMessageEvent"
    for raw in ("not json", "[1,2]", '{"data":"{}"}',
                json.dumps({"event": event, "channel": CHAT_CHANNEL, "data": "{broken"}),
                json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": CHAT_CHANNEL,
                            "data": json.dumps({"content": "no id"})}),
                json.dumps({"event": "App\\Events\\GiftedSubscriptionsEvent", "channel": CHAT_CHANNEL,
                            "data": json.dumps({"gifted_usernames": "alice"})})):
        assert fake.send_raw(pc, raw)
    good_after, _ = chat(fake)
    assert wait_until(lambda: rig.chat_ids() == {good_before: 1, good_after: 1}, 10)
    assert rig.value("source_bad_frames_total", platform="kick", reason="json") == 3
    assert rig.value("source_bad_frames_total", platform="kick", reason="shape") == 3
    assert src.alive and len(fake.connections) == 1


def test_a_stop_hands_the_queued_chat_over(rig: KickRig, fake: KickStandin) -> None:
    src = rig.source()
    src.start()
    connected(fake)
    ids = [chat(fake)[0] for _ in range(50)]
    assert wait_until(lambda: rig.value("source_frames_total", platform="kick", kind="chat") == 50, 10)
    src.request_stop()
    assert src.join(10)
    assert wait_until(lambda: sorted(rig.chat_ids()) == sorted(ids), 10)


def test_bulk_frames_encoded_before_the_send_are_stored_once(rig: KickRig, fake: KickStandin) -> None:
    """The benchmarks' load path: `encode_bulk` ahead, `send_bulk` writes only bytes, in chunks
    (small here, so that frames straddle the writes); every message arrives and is stored once."""
    src = rig.source()
    src.start()
    pc = connected(fake)
    ids = [str(uuid.uuid4()) for _ in range(500)]
    frames = fake.encode_bulk([json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": CHAT_CHANNEL,
                                           "data": json.dumps(pusher_chat(CHATROOM, mid, f"bulk {i}"))})
                               for i, mid in enumerate(ids)])
    assert all(isinstance(f, bytes) for f in frames)
    assert fake.send_bulk(pc, frames, chunk_bytes=4096) == len(ids)
    assert wait_until(lambda: sum(rig.chat_ids().values()) >= len(ids), 15)
    stored = rig.chat_ids()
    assert set(stored) == set(ids) and set(stored.values()) == {1}
