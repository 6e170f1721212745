"""The pure StreamElements pieces: token file, PII removal, frame parsing and the event mapping rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lumio_ingestd.devkit.standins.streamelements import activity_doc, tip_activity_doc, tip_doc
from lumio_ingestd.pii import strip_pii
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.streamelements.protocol import (
    ACTIVITIES,
    TIP_MODERATION,
    TIPS,
    map_message,
    parse_frame,
    parse_token,
    subscribe_request,
)

SECRET = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.c2ln"


def message(topic: str, data: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"id": "01X", "ts": "2026-01-05T19:07:17Z", "type": "message", "topic": topic,
                       "room": "r", "data": data, **extra}).encode()


def mapped(topic: str, data: dict[str, Any], keep_pii: bool = False) -> Any:
    return map_message(7, parse_frame(message(topic, data)), keep_pii=keep_pii)


def test_token_file_json_or_bare_jwt_and_errors_never_show_the_token() -> None:
    assert parse_token(json.dumps({"token": SECRET, "token_type": "oauth2"}), "f").token_type == "oauth2"
    assert parse_token(json.dumps({"token": SECRET}), "f").token_type == "jwt"
    bare = parse_token(f"  {SECRET}\n", "f")
    assert (bare.token, bare.token_type) == (SECRET, "jwt")
    assert SECRET not in repr(bare)
    bad = ["", "{not json", json.dumps({"token": ""}), json.dumps({"token": SECRET, "token_type": "x"}),
           f"{SECRET} {SECRET}"]
    for text in bad:
        with pytest.raises(ValueError) as info:
            parse_token(text, "/etc/token.json")
        assert "/etc/token.json" in str(info.value) and SECRET not in str(info.value)


def test_subscribe_request_has_the_documented_shape() -> None:
    req = json.loads(subscribe_request(TIPS, "room1", SECRET, "apikey", "n1"))
    assert req == {"type": "subscribe", "nonce": "n1",
                   "data": {"topic": TIPS, "room": "room1", "token": SECRET, "token_type": "apikey"}}


def test_strip_pii_removes_email_geo_and_ip_at_any_depth() -> None:
    doc = {"donation": {"user": {"username": "u", "email": "a@b", "geo": "DE", "ip_address": "1.2.3.4"}},
           "list": [{"IPAddress": "x", "keep": 1}], "emailSent": True}
    clean, removed = strip_pii(doc)
    assert removed == 4
    assert clean == {"donation": {"user": {"username": "u"}}, "list": [{"keep": 1}], "emailSent": True}


def test_tip_maps_to_tip_with_its_id_time_and_fields_without_pii() -> None:
    m = mapped(TIPS, tip_doc("t1", "r", created_at="2026-01-05T19:07:09.302Z", ip="1.2.3.4"))
    ev = m.event
    assert (ev.platform, ev.type, ev.external_id) == ("streamelements", "tip", "t1")
    assert ev.created_at.isoformat() == "2026-01-05T19:07:09.302000+00:00"
    assert m.pii_removed == 3
    assert "donor@example.com" not in json.dumps(ev.payload)
    kept = mapped(TIPS, tip_doc("t1", "r", ip="1.2.3.4"), keep_pii=True)
    assert kept.pii_removed == 0 and "donor@example.com" in json.dumps(kept.event.payload)


def test_the_same_tip_from_either_topic_is_the_same_tip_row_key() -> None:
    from_tips = mapped(TIPS, tip_doc("t1", "r")).event
    from_activity = mapped(ACTIVITIES, tip_activity_doc("a1", "t1", "r")).event
    assert (from_tips.type, from_tips.external_id) == (from_activity.type, from_activity.external_id)
    assert from_activity.payload["amount"] == from_tips.payload["amount"]
    assert "email" not in json.dumps(from_activity.payload)
    # An activity tip that names no tip is its own row, never a second `tip`.
    orphan = mapped(ACTIVITIES, tip_activity_doc("a2", None, "r")).event
    assert (orphan.type, orphan.external_id) == ("activity.tip", "a2")


def test_status_and_moderation_are_typed_rows_of_their_own() -> None:
    failed = mapped(TIPS, tip_doc("t1", "r", status="failed")).event
    assert (failed.type, failed.external_id) == ("tip.failed", "t1:failed")
    pending = mapped(TIP_MODERATION, tip_doc("t1", "r", approved="pending")).event
    allowed = mapped(TIP_MODERATION, tip_doc("t1", "r", approved="allowed")).event
    assert pending.type == allowed.type == "tip.moderation"
    assert len({pending.external_id, allowed.external_id, "t1"}) == 3


def test_activities_map_to_their_type_with_the_viewer() -> None:
    ev = mapped(ACTIVITIES, activity_doc("a1", "r", "communityGiftPurchase")).event
    assert (ev.type, ev.external_id, ev.user_id) == ("activity.communityGiftPurchase", "a1", "424242")
    # An odd type or status is made a word, never a reason to lose the event.
    assert mapped(ACTIVITIES, activity_doc("a2", "r", "hype train!")).event.type == "activity.hype_train_"
    odd = mapped(TIPS, tip_doc("t9", "r", status="In Review")).event
    assert (odd.type, odd.external_id) == ("tip.In_Review", "t9:In_Review")


@pytest.mark.parametrize(("raw", "reason"), [
    (b"\xff\xfe", "utf8"),
    (b"{", "json"),
    (b"[]", "shape"),
    (b'{"type": 1}', "shape"),
    (b'{"type": "message", "data": []}', "shape"),
    (b"x" * (512 * 1024 + 1), "too_large"),
])
def test_unusable_frames_are_refused_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(BadFrame) as info:
        parse_frame(raw)
    assert info.value.reason == reason


@pytest.mark.parametrize(("topic", "data", "reason"), [
    ("channel.chat.message", {"_id": "x"}, "unsupported"),
    (TIPS, {"_id": "x", "status": "success"}, "shape"),
    (TIPS, {"donation": {}, "status": "success"}, "shape"),
    (TIPS, {**tip_doc("t", "r"), "createdAt": "1999-01-01T00:00:00Z"}, "time"),
    (TIPS, {**tip_doc("t", "r"), "createdAt": "soon"}, "time"),
    (ACTIVITIES, {"_id": "a", "type": 5}, "shape"),
    (ACTIVITIES, {"_id": "a", "type": " "}, "shape"),
    (ACTIVITIES, {"type": "follow"}, "shape"),
])
def test_unusable_messages_are_refused_with_a_reason(topic: str, data: dict[str, Any], reason: str) -> None:
    with pytest.raises(BadFrame) as info:
        mapped(topic, data)
    assert info.value.reason == reason
