"""The source hot path: the raw-text check that lets a clean frame skip the repair walk, and the
fixed-format timestamp parse. Pure functions, no servers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

import twitch_frames as tf
from lumio_ingestd.model import (
    MAX_ID,
    MAX_JSON_STRING,
    MAX_NAME,
    MAX_TEXT,
    ChatMessage,
    _parse_time_general,
    frame_is_clean,
    parse_time,
)
from lumio_ingestd.sources.twitch.mapping import BadFrame, interpret, map_chat, parse_envelope

DELIVERY = datetime(2026, 1, 5, 18, 1, 2, 345678, tzinfo=UTC)


def _chat_frame(text: str = "hello Kappa", **extra: Any) -> str:
    event = tf.chat_event("chat-1", text)
    event.update(extra)
    return tf.frame("channel.chat.message", event)


def _via_interpret(frame: str) -> tuple[bool, ChatMessage]:
    it = interpret(42, frame)
    chat = it.items[0].chat
    assert chat is not None
    return it.envelope.clean, chat


def _walked(frame: str) -> ChatMessage:
    """Today's repair path, by hand: the same frame mapped with the walk."""
    obj = json.loads(frame)
    return map_chat(42, obj["payload"]["event"], parse_time(obj["metadata"]["message_timestamp"]))


def _assert_same(fast: ChatMessage, walked: ChatMessage) -> None:
    assert fast == walked
    assert fast.sanitized == walked.sanitized
    assert fast.to_entry() == walked.to_entry()


@pytest.mark.parametrize("frame", [
    _chat_frame(),
    _chat_frame("caf\u00e9 \u00fcber"),                      # non-ASCII, raw UTF-8 (ensure_ascii off below)
    _chat_frame("pair \U0001F600 ok"),                      # a valid surrogate pair escape
    _chat_frame('she said "gg" twice'),                     # escaped quotes
    _chat_frame("tab\there", cheer={"bits": 100, "ratio": 1.5e2}),  # a float that is finite
    _chat_frame("x" * MAX_NAME),                            # the longest string that passes
])
def test_a_frame_that_passes_decodes_to_the_values_the_walk_gives(frame: str) -> None:
    for text in (frame, json.dumps(json.loads(frame), ensure_ascii=False)):
        assert frame_is_clean(text), text[:200]
        clean, fast = _via_interpret(text)
        assert clean
        assert not fast.sanitized
        _assert_same(fast, _walked(text))
        # and the values are what the database takes: no NUL, no surrogate
        entry = fast.to_entry().decode("utf-8")
        assert "\\u0000" not in entry and "\x00" not in entry


# (frame, what the repaired value must look like)
REPAIRS: list[tuple[str, str]] = [
    (_chat_frame("nul \u0000 here"), "nul"),
    (_chat_frame("ok", color="#00\u0000FF"), "nul extras"),
    (tf.frame("channel.chat.message", tf.chat_event("chat-1", "lone \ud800 high")), "lone high"),
    (tf.frame("channel.chat.message", tf.chat_event("chat-1", "lone \udc00 low")), "lone low"),
    (_chat_frame("ok", color="reversed \udc00\ud800"), "reversed pair"),
    (_chat_frame("x" * (MAX_TEXT + 5)), "long text"),
    (_chat_frame("ok", color="c" * (MAX_JSON_STRING + 1)), "long extras string"),
    (_chat_frame("ok", badges=[{"k" * (MAX_NAME + 1): "v"}]), "long key"),
    (tf.frame("channel.chat.message", tf.chat_event("m" * (MAX_ID + 1), "long id")), "long id"),
    (_chat_frame("ok", reply=json.loads("[" * 40 + "]" * 40)), "too deep"),
    (_chat_frame("ok", cheer={"bits": 1e999}), "overflow to infinity"),
    (_chat_frame("ok", cheer={"bits": float("nan")}), "NaN"),
    (_chat_frame("ok", cheer={"bits": float("-inf")}), "-Infinity"),
    (_chat_frame("a literal \\u0000, not a NUL"), "escaped backslash"),
]


@pytest.mark.parametrize(("frame", "case"), REPAIRS, ids=[c for _, c in REPAIRS])
def test_every_repair_case_is_still_repaired(frame: str, case: str) -> None:
    clean, fast = _via_interpret(frame)
    assert not clean, case
    walked = _walked(frame)
    _assert_same(fast, walked)
    entry = fast.to_entry().decode("utf-8")
    assert "\x00" not in entry and "\\u0000" not in entry.replace("\\\\u0000", "")
    entry.encode("utf-8")  # no lone surrogate (it would not encode)
    if case != "escaped backslash":
        assert fast.sanitized, case
    if case == "too deep":
        assert "null" in json.dumps(fast.extras)
    if case in ("overflow to infinity", "NaN", "-Infinity"):
        assert fast.extras["cheer"] == {"bits": None}


def test_the_check_never_passes_a_lone_surrogate_or_nul_escape() -> None:
    assert not frame_is_clean('{"a":"\\u0000"}')
    assert not frame_is_clean('{"a":"\\ud83d"}')
    assert not frame_is_clean('{"a":"\\ude00"}')
    assert not frame_is_clean('{"a":"\\ude00\\ud83d"}')
    assert not frame_is_clean('{"a":"\\ud83d\\ud83d\\ude00"}')
    assert frame_is_clean('{"a":"\\ud83d\\ude00"}')
    assert not frame_is_clean('{"a":"\\\\"}')  # escaped backslash: not told apart, walked
    assert not frame_is_clean('{"a":"' + "\ud800" + '"}')  # a raw surrogate in a str


def test_a_bad_frame_is_still_refused_as_before() -> None:
    with pytest.raises(BadFrame) as raw_nul:
        parse_envelope(_chat_frame().replace("hello", "hel\x00lo"))
    assert raw_nul.value.reason == "nul"
    with pytest.raises(BadFrame) as not_json:
        parse_envelope('{"metadata": ')
    assert not_json.value.reason == "json"


TIMES = [
    "2023-07-19T14:56:51.634234626Z",  # Twitch's own shape
    "2023-07-19T14:56:51.000000000Z",
    "2024-02-29T23:59:59.999999999Z",
    "1999-12-31T00:00:00.123456789Z",
    "2023-07-19T14:56:51.634234Z",
    "2023-07-19T14:56:51Z",
    "2023-07-19t14:56:51.1z",
    "2023-07-19 14:56:51.634234626Z",
    "2023-07-19T14:56:51.634234626+02:00",
    "2023-07-19T14:56:51.634234626-0530",
    "2023-07-19T14:56:51.634234626",
    " 2023-07-19T14:56:51.634234626Z ",
    "2023-07-19T14:56:51.1234567891Z",
    "9999-12-31T23:59:59.999999999Z",
    "0001-01-01T00:00:00.000000000Z",
    # refused, by both
    "2023-02-30T14:56:51.634234626Z",
    "2023-07-19T24:56:51.634234626Z",
    "2023-07-19T14:60:51.634234626Z",
    "2023-07-19T14:56:61.634234626Z",
    "2023-07-19T14:56:51.63423462xZ",
    "2023-07-19T14:56:51,634234626Z",
    "2023-W29-3T14:56:51.634234626Z",
    "2023-07-19X14:56:51.634234626Z",
    "20230719T14:56:51.6342346260Z",
    "\uff12023-07-19T14:56:51.634234626Z",
    "2023-07-1\u0669T14:56:51.634234626Z",
    "+023-07-19T14:56:51.634234626Z",
    "2023-07-19T14:56:51.634234626",
    "",
]


@pytest.mark.parametrize("text", TIMES)
def test_the_fixed_format_timestamp_gives_what_the_general_parser_gives(text: str) -> None:
    try:
        expected: datetime | str = _parse_time_general(text)
    except ValueError:
        expected = "ValueError"
    try:
        got: datetime | str = parse_time(text)
    except ValueError:
        got = "ValueError"
    assert got == expected
    if isinstance(got, datetime):
        assert got.tzinfo == UTC and got.utcoffset() == expected.utcoffset()  # type: ignore[union-attr]
