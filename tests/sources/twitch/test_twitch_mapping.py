"""Twitch frames into chat, events and control messages: ids, times, users, refusals, gift linking."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

import pytest

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.recent import RecentIds
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.twitch.eventsub import connect_url
from lumio_ingestd.sources.twitch.gifts import CHILD_KIND, GiftLinker
from lumio_ingestd.sources.twitch.mapping import Gift, Notification, interpret, map_notification
from support import twitch_frames as tf

DELIVERY = datetime(2026, 1, 5, 18, 1, 2, 345678, tzinfo=UTC)


def one(sub_type: str, event: dict[str, Any], message_id: str = "delivery-1") -> Notification:
    items = map_notification(42, sub_type, {"subscription": tf.subscription(sub_type), "event": event},
                             message_id, DELIVERY)
    assert len(items) == 1
    return items[0]


def test_chat_message_uses_the_event_message_id_and_the_delivery_time() -> None:
    it = interpret(42, tf.frame("channel.chat.message", tf.chat_event("chat-abc", "hello"),
                                message_id="delivery-xyz"))
    assert it.kind == "chat"
    chat = it.items[0].chat
    assert chat is not None
    assert chat.message_id == "chat-abc"  # not the delivery id
    assert chat.created_at == DELIVERY  # metadata.message_timestamp, nanoseconds cut to µs
    assert (chat.user_id, chat.user_login, chat.text, chat.platform, chat.account_id) == (
        "4145994", "viewer4145994", "hello", "twitch", 42)
    assert chat.extras["badges"] == [{"set_id": "subscriber", "id": "6", "info": "9"}]


@pytest.mark.parametrize(("sub_type", "event", "external_id", "created_at", "user_id"), [
    ("channel.cheer", tf.cheer_event("1234"), "delivery-1", DELIVERY, "1234"),
    # A follow has no id of its own: its key comes from its content (the Helix path's too).
    ("channel.follow", tf.follow_event("55"),
     f"follow:55:{int(datetime(2026, 1, 5, 18, 16, 11, tzinfo=UTC).timestamp())}",
     datetime(2026, 1, 5, 18, 16, 11, 171067, tzinfo=UTC), "55"),
    ("channel.channel_points_custom_reward_redemption.add", tf.redemption_event("red-1", "9"), "red-1",
     datetime(2026, 1, 5, 18, 30, tzinfo=UTC), "9"),
    ("channel.raid", tf.raid_event("888"), "delivery-1", DELIVERY, "888"),
    ("stream.online", tf.online_event("9001", "2026-01-05T18:00:00Z"), "9001",
     datetime(2026, 1, 5, 18, 0, tzinfo=UTC), None),
    ("stream.offline", tf.offline_event(), "delivery-1", DELIVERY, None),
    ("channel.chat.notification", tf.notification_event("notice-7"), "notice-7", DELIVERY, "777"),
    ("channel.subscription.gift", tf.gift_event(5, gifter=None), "delivery-1", DELIVERY, None),
])
def test_event_ids_times_and_users(sub_type: str, event: dict[str, Any], external_id: str,
                                   created_at: datetime, user_id: str | None) -> None:
    note = one(sub_type, event)
    ev = note.event
    assert ev is not None and note.chat is None
    assert (ev.type, ev.external_id, ev.created_at, ev.user_id) == (
        sub_type, external_id, created_at, user_id)
    assert ev.payload == event  # the event object as Twitch sent it


def test_redemption_update_repeats_the_id_so_it_keys_on_the_delivery() -> None:
    ev = one("channel.channel_points_custom_reward_redemption.update", tf.redemption_event("red-1")).event
    assert ev is not None and ev.external_id == "delivery-1"
    assert ev.created_at == DELIVERY


def test_own_time_field_that_is_absent_or_absurd_falls_back_to_the_delivery_time() -> None:
    event = tf.follow_event()
    del event["followed_at"]
    assert event_of(one("channel.follow", event)).created_at == DELIVERY
    event["followed_at"] = "1970-01-01T00:00:00Z"
    assert event_of(one("channel.follow", event)).created_at == DELIVERY


def event_of(note: Notification) -> PlatformEvent:
    assert note.event is not None
    return note.event


def test_gift_and_stream_notes() -> None:
    assert one("channel.subscription.gift", tf.gift_event(3)).gift == tf_gift("bomb", 3)
    assert one("channel.subscribe", tf.sub_event("1", is_gift=True)).gift == tf_gift("recipient", 0)
    assert one("channel.subscribe", tf.sub_event("1", is_gift=False)).gift is None
    online = one("stream.online", tf.online_event("9001", "2026-01-05T18:00:00Z")).stream
    assert online is not None and (online.kind, online.stream_id) == ("online", "9001")
    offline = one("stream.offline", tf.offline_event()).stream
    assert offline is not None and (offline.kind, offline.at) == ("offline", DELIVERY)


def tf_gift(role: Literal["bomb", "recipient"], total: int) -> Gift:
    return Gift(role, "1000", total)


def test_batched_notifications_become_one_event_each() -> None:
    body = {"subscription": tf.subscription("channel.cheer"),
            "events": [{"id": "b1", "data": tf.cheer_event("1")}, {"id": "b2", "data": tf.cheer_event("2")}]}
    items = map_notification(42, "channel.cheer", body, "delivery-1", DELIVERY)
    assert [event_of(i).external_id for i in items] == ["b1", "b2"]


@pytest.mark.parametrize(("data", "reason"), [
    (b"not json at all", "json"),
    (b"[1, 2]", "json"),
    (b"\xff\xfe{}", "utf8"),
    (b'{"metadata": {"message_id": "a\x00b"}}', "nul"),
    (b'{"payload": {}}', "shape"),
    (json.dumps({"metadata": {"message_type": "notification", "message_timestamp": "2026-01-05T18:00:00Z"},
                 "payload": {}}).encode(), "shape"),
    (tf.control("session_keepalive", {}, timestamp="yesterday").encode(), "time"),
    (tf.control("session_keepalive", {}, timestamp="1969-12-31T23:59:59Z").encode(), "time"),
    (tf.frame("channel.chat.message", {"chatter_user_id": "1"}).encode(), "shape"),
    (json.dumps({"metadata": {"message_id": "x", "message_type": "notification",
                              "message_timestamp": "2026-01-05T18:00:00Z",
                              "subscription_type": "channel.cheer"},
                 "payload": {"subscription": {}, "event": "not an object"}}).encode(), "shape"),
    (b"{" + b" " * (600 * 1024) + b"}", "too_large"),
])
def test_malformed_frames_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(BadFrame) as caught:
        interpret(42, data)
    assert caught.value.reason == reason
    assert str(caught.value)  # a message that says why


def test_an_escaped_nul_inside_a_value_is_repaired_not_refused() -> None:
    it = interpret(42, tf.frame("channel.chat.message", tf.chat_event("m1", "a\u0000b")))
    chat = it.items[0].chat
    assert chat is not None and chat.text == "a\ufffdb" and chat.sanitized


def test_control_and_unsupported_message_types() -> None:
    assert interpret(42, tf.control("session_keepalive", {})).kind == "control"
    assert interpret(42, tf.control("session_welcome", {"session": {"id": "s"}})).kind == "control"
    assert interpret(42, tf.control("something_new", {})).kind == "unsupported"


def test_recent_ids_forget_the_oldest_first() -> None:
    recent = RecentIds(3)
    for i in range(5):
        recent.add(str(i))
    assert "0" not in recent and "1" not in recent and all(str(i) in recent for i in (2, 3, 4))


def test_connect_url_asks_for_the_keepalive() -> None:
    assert connect_url("wss://eventsub.wss.twitch.tv/ws", 30) == \
        "wss://eventsub.wss.twitch.tv/ws?keepalive_timeout_seconds=30"
    assert connect_url("ws://h:1/ws?x=1&keepalive_timeout_seconds=9", 12) == \
        "ws://h:1/ws?x=1&keepalive_timeout_seconds=12"


# -- gift linking --------------------------------------------------------------------------


def _gift(total: int, tier: str = "1000") -> tuple[PlatformEvent, Gift]:
    note = one("channel.subscription.gift", tf.gift_event(total, tier=tier))
    assert note.gift is not None
    return event_of(note), note.gift


def _sub(user: str, tier: str = "1000") -> tuple[PlatformEvent, Gift]:
    note = one("channel.subscribe", tf.sub_event(user, is_gift=True, tier=tier), message_id=f"d-{user}")
    assert note.gift is not None
    return event_of(note), note.gift


def test_gift_is_held_until_its_subs_arrive_and_comes_back_with_them() -> None:
    metrics = Metrics()
    linker = GiftLinker(3.0, metrics, clock=lambda: 0.0)
    gift, gift_note = _gift(2)
    assert linker.hold(gift, gift_note, now=0.0) == []
    a, a_note = _sub("a")
    b, b_note = _sub("b")
    assert linker.link(a, a_note, now=0.1)
    assert linker.due(now=0.2) == []  # one of two so far
    assert linker.link(b, b_note, now=0.3)
    [done] = linker.due(now=0.4)
    assert done.id == gift.id and done.created_at == gift.created_at
    assert [(c.kind, c.user_id) for c in done.children] == [(CHILD_KIND, "a"), (CHILD_KIND, "b")]
    assert done.children[0].payload["event_id"] == str(a.id)
    assert metrics.events_gift_recipients.labels("twitch", "yes")._value.get() == 2


def test_subs_that_arrive_before_their_gift_are_claimed_and_late_ones_stay_unlinked() -> None:
    metrics = Metrics()
    linker = GiftLinker(1.0, metrics, clock=lambda: 0.0)
    early, early_note = _sub("early")
    assert not linker.link(early, early_note, now=0.0)  # no gift yet: an orphan
    gift, gift_note = _gift(2)
    assert linker.hold(gift, gift_note, now=0.5) == []
    other, other_note = _sub("t3", tier="3000")
    assert not linker.link(other, other_note, now=0.6)
    [done] = linker.due(now=1.6)  # the window ended with one of two
    assert [c.user_id for c in done.children] == ["early"]
    assert linker.due(now=5.0) == []
    assert metrics.events_gift_recipients.labels("twitch", "no")._value.get() == 1  # the tier-3000 one


def test_a_gift_with_nothing_to_wait_for_is_released_at_once() -> None:
    linker = GiftLinker(1.0, Metrics())
    gift, gift_note = _gift(0)
    [done] = linker.hold(gift, gift_note)
    assert done.id == gift.id and done.children == ()
