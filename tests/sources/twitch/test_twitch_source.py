"""The Twitch source against the stand-in Twitch over real sockets, storing into real Redis + PostgreSQL.

Covers the EventSub rules: subscriptions with the documented conditions inside
the 10 s window, chat and events stored, keepalive loss, the session_reconnect
hand-off, revocations, every close code, pings answered, nothing ever sent,
malformed frames refused without taking good data along, gift bombs linked
and counted once, and what a stop hands over.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.twitch import StandinSession, TwitchStandin
from support import dbname_of
from support import twitch_frames as tf
from support.harness.servers import PostgresServer, wait_until
from support.twitch import ACCOUNT, TwitchRig, make_rig

EXPECTED_CONDITIONS = {
    "channel.chat.message": {"broadcaster_user_id": "12826", "user_id": "12826"},
    "channel.chat.notification": {"broadcaster_user_id": "12826", "user_id": "12826"},
    "channel.subscribe": {"broadcaster_user_id": "12826"},
    "channel.subscription.gift": {"broadcaster_user_id": "12826"},
    "channel.subscription.message": {"broadcaster_user_id": "12826"},
    "channel.cheer": {"broadcaster_user_id": "12826"},
    "channel.raid": {"to_broadcaster_user_id": "12826"},
    "channel.follow": {"broadcaster_user_id": "12826", "moderator_user_id": "12826"},
    "channel.channel_points_custom_reward_redemption.add": {"broadcaster_user_id": "12826"},
    "stream.online": {"broadcaster_user_id": "12826"},
    "stream.offline": {"broadcaster_user_id": "12826"},
}
ALL = len(EXPECTED_CONDITIONS)


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1, reconnect_grace_secs=5) as f:
        yield f


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fake: TwitchStandin) -> Iterator[TwitchRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    try:
        yield r
    finally:
        r.close()


def subscribed(fake: TwitchStandin, n: int) -> StandinSession:
    s = fake.wait_session(n)
    assert fake.wait_for(lambda: len(s.subscriptions) == ALL, 10), s.subscriptions.keys()
    return s


def chats(rig: TwitchRig, ids: list[str]) -> bool:
    got = rig.chat_ids()
    return all(got[i] >= 1 for i in ids)


def test_subscribes_in_the_window_with_the_documented_conditions_and_stores(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source()
    src.start()
    s1 = subscribed(fake, 1)
    created = [sub for sub in fake.subscriptions if sub["transport"]["session_id"] == s1.id]
    assert {sub["type"]: sub["condition"] for sub in created} == EXPECTED_CONDITIONS
    assert {sub["type"]: sub["version"] for sub in created}["channel.follow"] == "2"
    assert max(sub["elapsed"] for sub in created) < fake.subscribe_window_secs
    assert s1.keepalive_secs == 10  # asked for in the URL

    chat_ids = [f"chat-{i}" for i in range(5)]
    for mid in chat_ids:
        fake.notify("channel.chat.message", tf.chat_event(mid, f"text {mid}"))
    cheer = fake.notify("channel.cheer", tf.cheer_event("1234", 500))
    fake.notify("channel.follow", tf.follow_event("55"), version="2")
    fake.notify("channel.channel_points_custom_reward_redemption.add", tf.redemption_event("red-77"))
    raid = fake.notify("channel.raid", tf.raid_event("888"))
    fake.notify("channel.chat.notification", tf.notification_event("notice-1"))
    fake.notify("stream.online", tf.online_event("stream-1", "2026-01-05T18:00:00Z"))
    expected_events = {cheer, "red-77", raid, "notice-1", "stream-1"}
    assert wait_until(lambda: chats(rig, chat_ids) and expected_events <= set(rig.event_ids())
                      and len(rig.event_ids()) == 6, 10), (rig.chat_ids(), rig.event_ids())
    row = rig.rows("SELECT message_id, created_at, user_id, text FROM chat_messages "
                   "WHERE message_id = 'chat-0'")[0]
    assert row[2:] == ("4145994", "text chat-0")
    typed = dict(rig.rows("SELECT external_id, type FROM events"))
    assert typed[cheer] == "channel.cheer" and typed["red-77"].endswith("redemption.add")
    assert rig.rows("SELECT user_id FROM events WHERE type = 'channel.raid'") == [("888",)]
    assert wait_until(lambda: rig.rows("SELECT external_id, ended_at FROM stream_sessions") ==
                      [("stream-1", None)], 5)
    fake.notify("stream.offline", tf.offline_event())
    assert wait_until(lambda: rig.rows("SELECT count(*) FROM stream_sessions WHERE ended_at IS NOT NULL")
                      == [(1,)], 5)
    assert fake.inbound == []  # never a data frame from us
    assert len(fake.sessions) == 1 and s1.open


def test_session_reconnect_hands_off_without_loss_duplicates_or_resubscribing(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    fake.reconnect_welcome_delay_secs = 0.5  # the old socket stays live that long after the new one opens
    src = rig.source()
    src.start()
    s1 = subscribed(fake, 1)
    before = [fake.notify("channel.chat.message", tf.chat_event(f"c-{i}")) for i in range(20)]
    events_before = [fake.notify("channel.cheer", tf.cheer_event(str(i))) for i in range(5)]
    fake.reconnect(s1)
    # The new socket is open, its welcome not sent yet: Twitch keeps sending on the old one.
    assert fake.wait_for(lambda: fake.connections == 2, 5)
    during = [fake.notify("channel.chat.message", tf.chat_event(f"c-{i}"), session=s1)
              for i in range(20, 30)]
    events_during = [fake.notify("channel.cheer", tf.cheer_event(str(i)), session=s1) for i in range(5, 8)]
    s2 = fake.wait_session(2)
    assert s2.reconnect_of is s1
    assert fake.wait_for(lambda: not s1.open, 5)
    assert s1.close_code is None, "the old socket was closed by us, not by Twitch (4004)"
    assert s1.closed_at is not None and s2.welcomed_at is not None and s1.closed_at >= s2.welcomed_at
    # After the hand-off, and some repeats across the two sockets (at-least-once delivery).
    after = [fake.notify("channel.chat.message", tf.chat_event(f"c-{i}")) for i in range(30, 40)]
    for mid, i in zip(during[:3], range(20, 23), strict=True):
        fake.notify("channel.chat.message", tf.chat_event(f"c-{i}"), message_id=mid)
    for mid, i in zip(events_during, range(5, 8), strict=True):
        fake.notify("channel.cheer", tf.cheer_event(str(i)), message_id=mid)
    events_after = [fake.notify("channel.cheer", tf.cheer_event(str(i))) for i in range(8, 10)]

    chat_ids = [f"c-{i}" for i in range(40)]
    event_ids = events_before + events_during + events_after
    assert len(before + during + after) == 40
    assert wait_until(lambda: chats(rig, chat_ids) and set(event_ids) <= set(rig.event_ids()), 10)
    assert rig.chat_ids() == {i: 1 for i in chat_ids}
    assert rig.event_ids() == {i: 1 for i in event_ids}
    assert [sub["transport"]["session_id"] for sub in fake.subscriptions] == [s1.id] * ALL  # no resubscribe
    assert rig.value("source_reconnect_handoffs_total", platform="twitch", result="ok") == 1
    assert rig.value("source_disconnects_total", platform="twitch") == 0
    assert rig.value("source_duplicates_total", platform="twitch") == 6
    assert fake.inbound == []


def test_keepalive_loss_is_a_dead_connection_and_nothing_is_lost_or_doubled(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source(keepalive_secs=1, keepalive_margin_secs=0.5)
    src.start()
    s1 = subscribed(fake, 1)
    assert s1.keepalive_secs == 1
    batch_a = [fake.notify("channel.chat.message", tf.chat_event(f"a-{i}")) for i in range(10)]
    events_a = [fake.notify("channel.cheer", tf.cheer_event(str(i))) for i in range(3)]
    assert wait_until(lambda: chats(rig, [f"a-{i}" for i in range(10)]), 10)
    fake.set_keepalive(s1, False)  # a half-dead connection: open, but silent
    s2 = subscribed(fake, 2)
    assert s2.reconnect_of is None  # a new session at the base URL, subscribed again
    assert s1.close_code is None  # we gave up on it; Twitch did not close it
    assert rig.value("source_closes_total", platform="twitch", code="keepalive") == 1
    # Twitch redelivers some of the old ones (at least once), and new ones flow.
    for i, mid in enumerate(batch_a[:4]):
        fake.notify("channel.chat.message", tf.chat_event(f"a-{i}"), message_id=mid)
    fake.notify("channel.cheer", tf.cheer_event("0"), message_id=events_a[0])
    batch_b = [f"b-{i}" for i in range(10)]
    for mid in batch_b:
        fake.notify("channel.chat.message", tf.chat_event(mid))
    events_b = [fake.notify("channel.cheer", tf.cheer_event(str(i))) for i in range(3, 5)]
    all_chat = [f"a-{i}" for i in range(10)] + batch_b
    assert wait_until(lambda: chats(rig, all_chat) and set(events_a + events_b) <= set(rig.event_ids()), 10)
    assert rig.chat_ids() == {i: 1 for i in all_chat}
    assert rig.event_ids() == {i: 1 for i in events_a + events_b}


def test_every_close_code_reconnects_to_the_base_url_and_subscribes_again(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source()
    src.start()
    session = subscribed(fake, 1)
    for n, code in enumerate(range(4000, 4008), start=2):
        fake.close_session(session, code, f"test close {code}")
        session = subscribed(fake, n)
        assert session.reconnect_of is None, f"after {code}: not a fresh session at the base URL"
        assert rig.value("source_closes_total", platform="twitch", code=str(code)) == 1, code
        fake.notify("channel.chat.message", tf.chat_event(f"after-{code}"))
    assert wait_until(lambda: chats(rig, [f"after-{c}" for c in range(4000, 4008)]), 10)
    assert len({s.id for s in fake.sessions}) == 9
    assert fake.inbound == []


def test_a_failed_hand_off_ends_in_4004_and_a_fresh_subscribed_session(
        rig: TwitchRig, fake: TwitchStandin, free_port: object) -> None:
    fake.reconnect_grace_secs = 1.0
    src = rig.source()
    src.start()
    s1 = subscribed(fake, 1)
    fake.reconnect(s1, url=f"{fake.ws_url}?reconnect_id=no-such-session")  # answered with 4007
    s2 = subscribed(fake, 2)
    assert s1.close_code == 4004 and s2.reconnect_of is None
    assert rig.value("source_reconnect_handoffs_total", platform="twitch", result="failed") == 1
    assert rig.value("source_closes_total", platform="twitch", code="4004") == 1


def test_revocation_stops_that_subscription_and_the_rest_keeps_flowing(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source()
    src.start()
    s1 = subscribed(fake, 1)
    fake.revoke(s1, "channel.cheer", "authorization_revoked")
    assert wait_until(lambda: "channel.cheer" not in src.active, 5)
    assert rig.value("source_revocations_total", platform="twitch", status="authorization_revoked") == 1
    fake.notify("channel.chat.message", tf.chat_event("still-flowing"))
    assert wait_until(lambda: chats(rig, ["still-flowing"]), 10)
    assert len(fake.sessions) == 1
    for sub_type in list(s1.subscriptions):
        fake.revoke(s1, sub_type, "user_removed")
    subscribed(fake, 2)  # every subscription gone: a new session asks again


def test_pings_are_answered(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with TwitchStandin(ping_interval_secs=0.2, pong_timeout_secs=1.0) as fake:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
        try:
            rig.source().start()
            s1 = subscribed(fake, 1)
            assert fake.wait_for(lambda: s1.pongs >= 8, 10), s1.pongs
            assert s1.open and s1.close_code is None and len(fake.sessions) == 1
        finally:
            rig.close()


def test_a_slow_helix_misses_the_window_and_the_source_tries_again(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    fake.subscribe_window_secs = 0.5
    fake.helix_delay_secs = 0.7
    src = rig.source()
    src.start()
    assert fake.wait_for(lambda: len(fake.sessions) >= 1 and fake.sessions[0].close_code == 4003, 10)
    # The first subscribe answer comes after the window: the session is gone by then.
    assert fake.wait_for(lambda: (400, "channel.chat.message") in fake.helix_requests, 5)
    fake.helix_delay_secs = 0.0
    fake.subscribe_window_secs = 10.0
    assert fake.wait_for(lambda: any(len(s.subscriptions) == ALL and s.open for s in fake.sessions), 15)
    assert rig.value("source_subscriptions_total", platform="twitch", result="failed") >= 1


def test_malformed_frames_are_refused_counted_and_take_no_good_data_along(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source()
    src.start()
    s1 = subscribed(fake, 1)
    good = []
    bad: list[tuple[str | bytes, bool]] = [
        ("this is not json", True), ('{"metadata": {"message_id": "x"}}', True),
        ('{"metadata": {"message_id": "a\x00"}, "payload": {}}', True),
        (b"\xff\xfe not utf-8", True), (b"\x00\x01 binary", False),
        (tf.frame("channel.chat.message", {"chatter_user_id": "1"}), True),
        (tf.control("brand_new_type", {}), True),
    ]
    for i, (data, text) in enumerate(bad):
        mid = f"good-{i}"
        fake.notify("channel.chat.message", tf.chat_event(mid))
        good.append(mid)
        assert fake.send_raw(s1, data, text=text)
    fake.notify("channel.chat.message", tf.chat_event("good-last", "x\u0000y"))  # escaped NUL: repaired
    good.append("good-last")
    assert wait_until(lambda: chats(rig, good), 10)
    assert rig.chat_ids() == {i: 1 for i in good}
    assert rig.rows("SELECT text FROM chat_messages WHERE message_id = 'good-last'") == [("x\ufffdy",)]
    counts = {r: rig.value("source_bad_frames_total", platform="twitch", reason=r)
              for r in ("json", "shape", "nul", "utf8", "binary", "unsupported")}
    assert counts == {"json": 1, "shape": 2, "nul": 1, "utf8": 1, "binary": 1, "unsupported": 1}
    assert len(fake.sessions) == 1 and s1.open  # no frame took the connection down
    assert rig.value("worker_errors_total", worker=src.name) == 0


def test_gift_bomb_is_one_event_with_its_recipients_linked_and_counted_once(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source(gift_window_secs=5.0)
    src.start()
    subscribed(fake, 1)
    early = fake.notify("channel.subscribe", tf.sub_event("r1", is_gift=True))  # before its gift
    gift = fake.notify("channel.subscription.gift", tf.gift_event(3, gifter="g1"))
    later = [fake.notify("channel.subscribe", tf.sub_event(f"r{i}", is_gift=True)) for i in (2, 3)]
    own = fake.notify("channel.subscribe", tf.sub_event("self", is_gift=False))
    assert wait_until(lambda: set(rig.event_ids()) == {early, gift, own, *later}, 10)
    assert rig.event_ids() == {i: 1 for i in (early, gift, own, *later)}
    [(gift_id,)] = rig.rows("SELECT id::text FROM events WHERE type = 'channel.subscription.gift'")
    children = rig.rows("SELECT ordinal, kind, user_id, payload FROM event_children "
                        "WHERE event_id = %s ORDER BY ordinal", (gift_id,))
    assert [(c[1], c[2]) for c in children] == [("gift_recipient", "r1"), ("gift_recipient", "r2"),
                                                ("gift_recipient", "r3")]
    sub_rows = dict(rig.rows("SELECT external_id, id::text FROM events WHERE type = 'channel.subscribe'"))
    assert [c[3]["event_id"] for c in children] == [sub_rows[early], sub_rows[later[0]], sub_rows[later[1]]]
    assert rig.value("events_gift_bombs_total", platform="twitch") == 1
    assert rig.value("events_gift_recipients_total", platform="twitch", linked="yes") == 3


def test_stop_hands_over_the_held_gift_and_the_chat_queue(rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source(gift_window_secs=60.0)
    src.start()
    subscribed(fake, 1)
    gift = fake.notify("channel.subscription.gift", tf.gift_event(5))
    fake.notify("channel.subscribe", tf.sub_event("r1", is_gift=True))
    fake.notify("channel.chat.message", tf.chat_event("last-words"))
    assert wait_until(lambda: len(src.gifts) == 1 and rig.value("source_frames_total", platform="twitch",
                                                                kind="event") == 2, 10)
    src.request_stop()
    assert src.join(5)
    assert rig.event_ids()[gift] == 1  # persisted by release(), with the recipient it had
    [(gift_id,)] = rig.rows("SELECT id::text FROM events WHERE external_id = %s", (gift,))
    assert rig.rows("SELECT user_id FROM event_children WHERE event_id = %s", (gift_id,)) == [("r1",)]
    assert wait_until(lambda: chats(rig, ["last-words"]), 10)
    assert json.loads(json.dumps(rig.value("chat_persistence_queue_depth"))) == 0
    assert rig.cfg.accounts[0].account_id == ACCOUNT


def test_bulk_frames_encoded_before_the_send_are_stored_once(rig: TwitchRig, fake: TwitchStandin) -> None:
    """The benchmarks' load path: `encode_bulk` ahead, `send_bulk` writes only bytes, in chunks
    (small here, so that frames straddle the writes); every message arrives and is stored once."""
    src = rig.source()
    src.start()
    s1 = subscribed(fake, 1)
    ids = [f"bulk-{i}" for i in range(500)]
    frames = fake.encode_bulk([json.dumps(fake.notification(s1, "channel.chat.message",
                                                            tf.chat_event(mid, f"text {mid}")))
                               for mid in ids])
    assert all(isinstance(f, bytes) for f in frames)
    assert fake.send_bulk(s1, frames, chunk_bytes=4096) == len(ids)
    assert wait_until(lambda: sum(rig.chat_ids().values()) >= len(ids), 15)
    stored = rig.chat_ids()
    assert set(stored) == set(ids) and set(stored.values()) == {1}
