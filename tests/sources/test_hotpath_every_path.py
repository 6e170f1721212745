"""The raw-text check on every other path: Kick's socket and webhooks, Twitch's webhooks and events.

A frame or body that passes `frame_is_clean` skips the repair walk of its
chat extras and event payloads (`known_clean`). For every frame and body of
the shared corpus, and for each repair case injected into them, the rows are
exactly the rows the walk gives (an event's random id aside), and a repair
case is still repaired. Without the recorded corpus, they run on the
project's own frames (`support.corpus`). Pure functions, no servers.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from lumio_ingestd.model import MAX_NAME, ChatMessage, PlatformEvent, frame_is_clean
from lumio_ingestd.sources.kick import mapping as kick
from lumio_ingestd.sources.twitch import mapping as twitch
from support.corpus import CORPUS

RECEIVED = datetime(2026, 1, 5, 18, 0, tzinfo=UTC)


def _lines(name: str) -> list[dict[str, Any]]:
    return CORPUS.lines(name)


def _row(item: Any) -> tuple[str, Any, bool]:
    """What an item stores: the chat entry, or the event without its random id."""
    if item.chat is not None:
        msg: ChatMessage = item.chat
        return "chat", msg.to_entry(), msg.sanitized
    ev: PlatformEvent = item.event
    obj = ev.to_json()
    del obj["id"]
    return "event", json.dumps(obj, sort_keys=True), False


# Text spliced into a string of a frame, with whether the frame then still passes the check.
INJECTIONS = [
    ("", True),
    ("caf\u00e9 \U0001F600", True),
    ("\x00", False),                      # a NUL in the decoded value (\\u0000 on the wire)
    ("\ud800", False),                    # a lone surrogate (\\ud800 on the wire)
    ("x" * (MAX_NAME + 1), False),        # longer than the check allows
    ('quote " and \\ backslash', False),  # an escaped backslash: not told apart, walked
]


def _inject(value: Any, extra: str) -> Any:
    """`value` with `extra` appended to every string in it."""
    if isinstance(value, str):
        return value + extra
    if isinstance(value, dict):
        return {k: _inject(v, extra) for k, v in value.items()}
    if isinstance(value, list):
        return [_inject(v, extra) for v in value]
    return value


def _deep(value: dict[str, Any]) -> dict[str, Any]:
    nested: Any = "leaf"
    for _ in range(40):
        nested = [nested]
    return {**value, "deep_extra": nested, "nan_extra": float("nan")}


def _pusher_frames() -> list[str]:
    frames = []
    for line in _lines("kick.jsonl"):
        if line.get("transport") != "pusher-websocket":
            continue
        frame = line["frame"]
        if "event" not in frame:
            frame = {"event": "App\\Events\\ChatMessageEvent", "channel": "chatrooms.668.v2",
                     "data": frame}
        data = frame.get("data")
        if isinstance(data, str):
            data = json.loads(data) if data else {}
        frames.append({**frame, "data": data})
    assert len(frames) >= 10
    return [json.dumps({**f, "data": json.dumps(d)}) for f in frames for d in _variants(f["data"])]


def _variants(data: Any) -> list[Any]:
    if not isinstance(data, dict):
        return [data]
    return [_inject(data, extra) for extra, _ in INJECTIONS] + [
        _deep(data), {**data, "nan_extra": float("nan")}, {**data, "inf_extra": 1e999}]


def test_kick_socket_frames_give_the_rows_the_walk_gives() -> None:
    clean_chat = walked_chat = repaired = 0
    for text in _pusher_frames():
        try:
            got = kick.interpret(42, text, RECEIVED)
        except kick.BadFrame:
            continue
        frame = kick.parse_frame(text)
        handler = kick._PUSHER.get(frame.name)
        if handler is None or got.kind not in ("chat", "event"):
            continue
        walked = handler(42, frame.data, RECEIVED, kick.BUCKET_SECS, False)
        assert [_row(i) for i in got.items] == [_row(i) for i in walked], text[:200]
        inner = json.loads(text)["data"]
        if frame.clean:
            assert frame_is_clean(inner)
        if got.kind == "chat":
            clean_chat += frame.clean
            walked_chat += not frame.clean
            repaired += got.items[0].chat is not None and got.items[0].chat.sanitized
    assert clean_chat and walked_chat and repaired  # both ways taken, repairs still made


def test_kick_socket_chat_known_clean_only_when_the_inner_text_passes() -> None:
    base = {"id": "m-1", "chatroom_id": 1, "content": "hi", "type": "message",
            "created_at": "2026-01-05T18:00:00+00:00",
            "sender": {"id": 7, "username": "U", "slug": "u", "identity": {"color": "#fff", "badges": []}}}
    for extra, passes in INJECTIONS:
        data = _inject(base, extra)
        text = json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": "chatrooms.1.v2",
                           "data": json.dumps(data)})
        frame = kick.parse_frame(text)
        assert frame.clean is passes, repr(extra)
        msg = kick.interpret(42, text, RECEIVED).items[0].chat
        assert msg is not None
        assert msg.sanitized is (not passes and extra != 'quote " and \\ backslash')
        assert "\x00" not in msg.text and "\ud800" not in msg.text
    deep = json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": "chatrooms.1.v2",
                       "data": json.dumps({**base, "metadata": _deep({})})})
    frame = kick.parse_frame(deep)
    assert not frame.clean
    msg = kick.interpret(42, deep, RECEIVED).items[0].chat
    assert msg is not None and msg.sanitized
    assert msg.extras["metadata"]["nan_extra"] is None
    # not finite only: the check passes, the decoder refuses, the walk repairs
    nan = json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": "chatrooms.1.v2",
                      "data": json.dumps({**base, "metadata": {"n": float("nan"), "i": 1e999}})})
    assert frame_is_clean(json.loads(nan)["data"])
    frame = kick.parse_frame(nan)
    assert not frame.clean
    msg = kick.interpret(42, nan, RECEIVED).items[0].chat
    assert msg is not None and msg.sanitized and msg.extras["metadata"] == {"n": None, "i": None}


def test_kick_webhook_bodies_give_the_rows_the_walk_gives() -> None:
    checked = clean = 0
    for n, line in enumerate(_lines("kick.jsonl")):
        if line.get("transport") != "webhook":
            continue
        event_type = line["headers"]["Kick-Event-Type"]
        for body in _variants(line["frame"]):
            raw = json.dumps(body).encode()
            obj, passes = kick.decode_checked(raw)
            got = kick.map_webhook(42, event_type, obj, f"d-{n}", RECEIVED, known_clean=passes)
            walked = kick.map_webhook(42, event_type, obj, f"d-{n}", RECEIVED, known_clean=False)
            assert got is not None and walked is not None
            assert [_row(i) for i in got] == [_row(i) for i in walked], (n, line["kind"])
            checked += 1
            clean += passes
    assert checked >= 50 and clean >= 10


def test_twitch_webhook_bodies_give_the_rows_the_walk_gives() -> None:
    checked = clean = 0
    for n, line in enumerate(_lines("twitch_eventsub_webhook.jsonl")):
        headers = line.get("headers") or {}
        if headers.get("Twitch-Eventsub-Message-Type", "notification") != "notification":
            continue
        body = line["frame"]
        sub_type = headers.get("Twitch-Eventsub-Subscription-Type") or twitch.subscription_type_of(body)
        variants = [body] + [{**body, "event": v} for v in _variants(body.get("event"))[1:]
                             ] if isinstance(body.get("event"), dict) else [body]
        for variant in variants:
            obj, passes = twitch.decode_checked(json.dumps(variant))
            got = twitch.map_notification(42, sub_type, obj, f"c-{n}", RECEIVED, known_clean=passes)
            walked = twitch.map_notification(42, sub_type, obj, f"c-{n}", RECEIVED)
            assert [_row(i) for i in got] == [_row(i) for i in walked], (n, line["kind"])
            checked += 1
            clean += passes
    assert checked >= 300 and clean >= 70 if CORPUS.recorded else checked >= 100 and clean >= 10


def test_an_event_payload_is_repaired_unless_known_clean() -> None:
    payload = {"a": "nul \x00", "b": float("inf"), "c": [[[]]]}
    walked = PlatformEvent.new(account_id=1, platform="twitch", type="t", payload=payload)
    assert walked.payload == {"a": "nul \ufffd", "b": None, "c": [[[]]]}
    trusted = PlatformEvent.new(account_id=1, platform="twitch", type="t", payload={"a": "ok"},
                                known_clean=True)
    assert trusted.payload == {"a": "ok"}
