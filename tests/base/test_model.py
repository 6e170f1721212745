"""Chat messages and events: edge sanitizing, timestamps, ids and stored entries."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from lumio_ingestd import fastjson
from lumio_ingestd.model import (
    MAX_TEXT,
    ChatMessage,
    EntryError,
    EventChild,
    PlatformEvent,
    format_time,
    parse_time,
    uuid7,
)
from lumio_ingestd.stores.quarantine import quarantine_entry

T0 = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)


def test_chat_values_the_database_refuses_are_repaired_and_flagged() -> None:
    msg = ChatMessage.create(platform="twitch", account_id=7, message_id="m\x00", created_at=T0,
                             user_login="lo\ud800gin", text="a" * (MAX_TEXT + 50),
                             extras={"badges\x00": ["\udfff", {"k": "v\x00"}]})
    assert msg.sanitized
    assert msg.message_id == "m\ufffd"
    assert msg.user_login == "lo\ufffdgin"
    assert len(msg.text) == MAX_TEXT
    assert msg.extras == {"badges\ufffd": ["\ufffd", {"k": "v\ufffd"}]}
    # The entry encodes to UTF-8 without errors and carries no \u0000 for jsonb.
    raw = msg.to_entry()
    assert b"\\u0000" not in raw
    raw.decode("utf-8")


def test_clean_chat_is_not_flagged() -> None:
    msg = ChatMessage.create(platform="twitch", account_id=7, message_id="m1", created_at=T0,
                             text="hello ✨", extras={"emotes": [1, 2]})
    assert not msg.sanitized


def test_chat_entry_round_trip_keeps_microseconds() -> None:
    msg = ChatMessage.create(platform="kick", account_id=1, message_id="x", created_at=T0,
                             user_id="u", user_login="l", display_name="D", text="t",
                             extras={"reply": {"id": "p"}})
    obj = json.loads(msg.to_entry())
    assert obj["v"] == 2 and obj["created_at"] == "2026-11-29T12:00:00.123456Z"
    assert {"platform", "account_id", "message_id", "created_at"} <= obj.keys()
    back = ChatMessage.from_entry(msg.to_entry())
    assert back == msg and back.created_at == T0
    # What older daemons left in Redis and the spool (version 1) still reads back.
    assert ChatMessage.from_entry(json.dumps({**obj, "v": 1})) == msg
    for version in (0, 3, True, "2", 2.0):
        with pytest.raises(EntryError, match="unknown format version"):
            ChatMessage.from_entry(json.dumps({**obj, "v": version}))


def _entry_the_general_way(msg: ChatMessage) -> bytes:
    """What to_entry wrote before it let orjson format the time: the time as format_time's text."""
    return fastjson.dumps({
        "v": 2, "platform": msg.platform, "account_id": msg.account_id, "message_id": msg.message_id,
        "created_at": format_time(msg.created_at), "user_id": msg.user_id,
        "user_login": msg.user_login, "display_name": msg.display_name, "text": msg.text,
        "extras": msg.extras})


@pytest.mark.parametrize("created_at", [
    T0,
    T0.replace(microsecond=1),
    T0.replace(microsecond=0),  # orjson would leave the fraction out: not its to write
    datetime(999, 1, 2, 3, 4, 5, 600, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    T0.astimezone(timezone(timedelta(hours=2))),  # another zone: written in UTC
    T0.replace(tzinfo=timezone(timedelta(0), "Z")),  # UTC, but not the `UTC` object
])
def test_the_chat_entry_is_byte_for_byte_what_the_general_path_writes(created_at: datetime) -> None:
    msg = ChatMessage.create(platform="twitch", account_id=7, message_id="m1", created_at=created_at,
                             user_id="u", user_login="l", display_name="Dé", text="hi ✨ \"q\"",
                             extras={"badges": [{"id": "1"}], "n": 3, "x": None})
    assert msg.to_entry() == _entry_the_general_way(msg)
    assert ChatMessage.from_entry(msg.to_entry()) == msg


def test_a_chat_entry_orjson_refuses_is_written_or_refused_as_before() -> None:
    big = ChatMessage(platform="twitch", account_id=7, message_id="m", created_at=T0,
                      extras={"n": 2**70})  # past 64 bits: the standard library writes it
    assert big.to_entry() == _entry_the_general_way(big) and b"1180591620717411303424" in big.to_entry()
    lone = ChatMessage(platform="twitch", account_id=7, message_id="m", created_at=T0, text="a\ud800")
    with pytest.raises(UnicodeEncodeError):  # what ingest's _with_entry repairs
        lone.to_entry()


def test_event_entry_round_trip_keeps_id_time_and_children() -> None:
    ev = PlatformEvent.new(account_id=3, platform="twitch", type="channel.subscription.gift",
                           payload={"total": 2}, created_at=T0, external_id="g-1",
                           children=(EventChild("gift_recipient", "11", "ann"),
                                     EventChild("gift_recipient", "12", "bob")))
    obj = json.loads(ev.to_entry())
    assert set(obj) >= {"v", "id", "created_at", "account_id", "platform", "type", "external_id",
                        "payload", "children"}
    back = PlatformEvent.from_entry(ev.to_entry())
    assert back == ev
    assert back.id == ev.id and back.created_at == T0 and len(back.children) == 2


def test_event_gets_its_id_and_time_once() -> None:
    ev = PlatformEvent.new(account_id=1, platform="twitch", type="channel.raid", payload={})
    assert ev.id.version == 7
    assert abs(ev.created_at - datetime.now(UTC)) < timedelta(seconds=5)
    assert PlatformEvent.from_entry(ev.to_entry()).id == ev.id


def test_empty_external_id_becomes_null() -> None:
    assert PlatformEvent.new(account_id=1, platform="twitch", type="x", payload={},
                             external_id="").external_id is None


@pytest.mark.parametrize("raw,reason", [
    (b"not json", "not JSON"),
    (b"[1]", "not a JSON object"),
    (b'{"v": 99}', "unknown format version"),
    (b'{"v": 1, "platform": "twitch"}', "incomplete"),
    (b'{"v": 1, "platform": "twitch", "account_id": 1, "message_id": "m", "id": "x", "type": "t",'
     b' "created_at": 12}', "malformed"),
    (b'{"v": 1, "platform": "twitch", "account_id": 1e400, "message_id": "m",'
     b' "created_at": "2026-01-01T00:00:00Z"}', "malformed"),
    (b'{"v": 1, "extras": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON|malformed"),
])
def test_unreadable_entries_raise_entry_error(raw: bytes, reason: str) -> None:
    with pytest.raises(EntryError, match=reason):
        ChatMessage.from_entry(raw)  # and nothing but EntryError, so a flush can quarantine it
    with pytest.raises(EntryError):
        PlatformEvent.from_entry(raw)


@pytest.mark.parametrize("text,expected", [
    ("2023-01-01T00:00:00Z", datetime(2023, 1, 1, tzinfo=UTC)),
    ("2023-01-01T00:00:00.1Z", datetime(2023, 1, 1, 0, 0, 0, 100000, tzinfo=UTC)),
    ("2023-01-01T00:00:00.123456789Z", datetime(2023, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)),
    ("2023-01-01T11:00:00+11:00", datetime(2023, 1, 1, tzinfo=UTC)),
    ("2023-01-01T00:00:00.12+00:00", datetime(2023, 1, 1, 0, 0, 0, 120000, tzinfo=UTC)),
])
def test_parse_time_is_lenient_about_fractions_and_offsets(text: str, expected: datetime) -> None:
    assert parse_time(text) == expected


def test_parse_time_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time("yesterday")


def test_uuid7_is_time_ordered_and_unique() -> None:
    ids = [uuid7(1_700_000_000_000 + i) for i in range(200)]
    assert ids == sorted(ids, key=lambda u: u.bytes)
    assert len({uuid7() for _ in range(1000)}) == 1000
    assert all(u.variant == uuid.RFC_4122 for u in ids)


def test_quarantine_entry_keeps_the_original_and_the_reason() -> None:
    raw = ChatMessage.create(platform="twitch", account_id=1, message_id="q", created_at=T0).to_entry()
    obj = json.loads(quarantine_entry(raw, "permanent", "22008"))
    assert obj["message_id"] == "q" and obj["reason"] == "permanent" and obj["sqlstate"] == "22008"
    garbage = json.loads(quarantine_entry(b"\xff\xfe{", "undecodable", None))
    assert garbage["raw"] and garbage["reason"] == "undecodable"
    assert format_time(T0) == "2026-11-29T12:00:00.123456Z"


def test_clean_json_fast_path_never_skips_a_repair() -> None:
    from lumio_ingestd.model import MAX_JSON_DEPTH, clean_json

    deep: object = "leaf"
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = [deep]
    cleaned = clean_json(deep)
    depth = 0
    while isinstance(cleaned, list):
        cleaned, depth = cleaned[0], depth + 1
    assert cleaned is None and depth == MAX_JSON_DEPTH  # cut at the cap, not passed through

    assert clean_json({"k\x00": 1}) == {"k\ufffd": 1}
    assert clean_json({"n": float("nan"), "i": float("inf")}) == {"n": None, "i": None}
    assert clean_json({"s": "\udc00"}) == {"s": "\ufffd"}
    assert clean_json({"emoji": "\U0001f600"}) == {"emoji": "\U0001f600"}  # a valid pair stays
    assert clean_json({"t": "x" * 20_000}) == {"t": "x" * 10_000}
    plain = {"badges": [{"set_id": "sub", "id": "12"}], "color": "#FF0000", "n": 1.5, "ok": True}
    assert clean_json(plain) == plain


def test_parse_time_out_of_range_is_a_value_error() -> None:
    # Year 9999 with a negative offset is past datetime's range once in UTC.
    with pytest.raises(ValueError, match="out of range"):
        parse_time("9999-12-31T23:59:59-01:00")
