"""Conformance: every Kick frame and webhook body of the shared corpus, and Kick's real signature.

The corpus (written outside this project) is read at test time from
`../shared/corpus` next to the repository; it is never copied in. Where it is
missing, the project's own frames of every kind take its place
(`support.corpus`), with a delivery signed by the stand-in's key instead of
Kick's real one. Every Pusher frame must become
chat, an event, a control message or an explicit "unsupported" (counted) -
through the parser and through the live source, which must not crash; every
webhook body must map to rows; the real signed delivery must verify against
the key shipped with the package (the same bytes as the corpus's PEM), and
fail for any change to its id, timestamp or body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.devkit.standins.kick import KickStandin
from lumio_ingestd.sources.kick.mapping import WEBHOOK_TYPES, interpret, map_webhook
from lumio_ingestd.sources.kick.signature import packaged_key, parse_public_key_pem, signed_bytes, verify
from support import dbname_of
from support.corpus import CORPUS
from support.harness.servers import PostgresServer, wait_until
from support.kick import CHAT_CHANNEL, CHATROOM, EVENT_CHANNEL, KickRig, make_rig

RECEIVED = datetime(2026, 1, 5, 18, 0, tzinfo=UTC)


def lines() -> list[dict[str, Any]]:
    return CORPUS.lines("kick.jsonl")


def pusher_text(line: dict[str, Any]) -> str:
    """The frame as the socket sends it; a line holding only the decoded `data` is wrapped back."""
    frame = line["frame"]
    if "event" not in frame:
        return json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": "chatrooms.668.v2",
                           "data": json.dumps(frame)})
    try:
        json.loads(line["raw"])
        return str(line["raw"])
    except (ValueError, KeyError):
        return json.dumps(frame)


def test_every_pusher_frame_parses_into_chat_an_event_control_or_unsupported() -> None:
    kinds: dict[str, str] = {}
    for n, line in enumerate(lines()):
        if line.get("transport") != "pusher-websocket":
            continue
        it = interpret(42, pusher_text(line), RECEIVED)
        kinds[line["kind"]] = it.kind
        if it.kind == "chat":
            msg = it.items[0].chat
            assert msg is not None and msg.message_id and msg.user_id and msg.created_at.microsecond == 0, n
        elif it.kind == "event":
            ev = it.items[0].event
            assert ev is not None and ev.external_id and ev.platform == "kick", n
    assert sorted(set(kinds.values())) == ["chat", "control", "event", "unsupported"], kinds
    [legacy] = [k for k in kinds if "LEGACY" in k]
    assert kinds[legacy] == "unsupported"
    assert sum(1 for k in kinds.values() if k == "chat") == sum(
        1 for k in kinds if "ChatMessageEvent" in k) == 4


def test_the_same_gift_on_the_channel_and_its_chatroom_is_one_external_id() -> None:
    lucky = next(x for x in lines() if "LuckyUsers" in x["kind"])
    it = interpret(42, pusher_text(lucky), RECEIVED)
    ev = it.items[0].event
    assert ev is not None and ev.type == "channel.subscription.gifts"
    data = json.loads(lucky["frame"]["data"])
    again = json.dumps({"event": "GiftedSubscriptionsEvent", "channel": CHAT_CHANNEL, "data": json.dumps({
        "chatroom_id": 1, "gifted_usernames": list(reversed(data["usernames"])),
        "gifter_username": data["gifter_username"].upper(), "gifter_total": 9})})
    other = interpret(42, again, RECEIVED).items[0].event
    assert other is not None and other.external_id == ev.external_id
    assert [c.user_login for c in ev.children] == data["usernames"]


def test_every_webhook_body_maps_to_rows() -> None:
    seen: set[str] = set()
    for n, line in enumerate(lines()):
        if line.get("transport") != "webhook":
            continue
        event_type = line["headers"]["Kick-Event-Type"]
        items = map_webhook(42, event_type, line["frame"], f"delivery-{n}", RECEIVED)
        assert items, (n, line["kind"])
        seen.add(event_type)
        item = items[0]
        if event_type == "chat.message.sent":
            assert item.chat is not None and item.chat.message_id == line["frame"]["message_id"]
        else:
            assert item.event is not None and item.event.type == event_type and item.event.external_id
    assert seen == WEBHOOK_TYPES


def test_the_real_signed_delivery_verifies_against_the_shipped_key() -> None:
    key = parse_public_key_pem(CORPUS.kick_key_pem())
    if CORPUS.recorded:  # Kick's published key: the same as the one the package ships
        assert key == packaged_key()
    signed = [x for x in lines() if x.get("verify")]
    assert signed, "the corpus has no signed Kick delivery"
    for line in signed:
        h, raw = line["headers"], line["raw"].encode()
        mid, ts = h["Kick-Event-Message-Id"], h["Kick-Event-Message-Timestamp"]
        sig = h["Kick-Event-Signature"]
        assert verify(key, signed_bytes(mid, ts, raw), sig) is line["verify"]["signature_valid"]
        assert not verify(key, signed_bytes(mid, ts, raw + b"\n"), sig)
        assert not verify(key, signed_bytes(mid[:-1] + "0", ts, raw), sig)
        assert not verify(key, signed_bytes(mid, ts.replace("19Z", "20Z"), raw), sig)
        assert not verify(key, signed_bytes(mid, ts, raw.replace(b"true", b"false", 1)), sig)


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


def as_ours(text: str) -> str:
    """A captured frame as if it came for the test account: its channel and `data.chatroom_id`
    made the account's (the captures are other chatrooms', which the source refuses)."""
    frame = json.loads(text)
    channel = frame.get("channel")
    if isinstance(channel, str):
        frame["channel"] = EVENT_CHANNEL if channel.startswith("channel") else CHAT_CHANNEL
    if isinstance(frame.get("data"), str) and frame["data"].startswith("{"):
        data = json.loads(frame["data"])
        if isinstance(data, dict) and "chatroom_id" in data:
            data["chatroom_id"] = CHATROOM
        frame["data"] = json.dumps(data)
    return json.dumps(frame)


def test_every_pusher_frame_through_the_live_source_is_stored_or_skipped(rig: KickRig,
                                                                        fake: KickStandin) -> None:
    corpus = [x for x in lines() if x.get("transport") == "pusher-websocket"]
    src = rig.source()
    src.start()
    pc = fake.wait_subscribed(CHAT_CHANNEL)
    assert fake.wait_for(lambda: EVENT_CHANNEL in pc.channels, 5)
    # As captured: other chatrooms' chat and events, refused, none stored.
    foreign = 0
    for line in corpus:
        assert fake.send_raw(pc, pusher_text(line))
        kind = interpret(1, pusher_text(line), RECEIVED).kind
        foreign += kind in ("chat", "event")
    assert wait_until(lambda: rig.value("source_bad_frames_total", platform="kick",
                                        reason="foreign_channel") == foreign, 10)
    assert foreign >= 4 and rig.chat_ids() == {} and rig.event_types() == {}
    # As if they were the account's: stored or skipped.
    for line in corpus:
        assert fake.send_raw(pc, as_ours(pusher_text(line)))
    chat_ids = {json.loads(json.loads(pusher_text(x))["data"])["id"]
                for x in corpus if "ChatMessageEvent" in pusher_text(x)}
    assert wait_until(lambda: set(rig.chat_ids()) == chat_ids, 10), rig.chat_ids()
    assert wait_until(lambda: sum(rig.event_types().values()) == 2, 10), rig.event_types()
    assert rig.value("source_bad_frames_total", platform="kick", reason="unsupported") == 2
    for reason in ("json", "shape", "time", "utf8", "nul"):
        assert rig.value("source_bad_frames_total", platform="kick", reason=reason) == 0, reason
    assert src.alive and pc.open and len(fake.connections) == 1
