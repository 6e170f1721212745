"""The source hot path: the raw-text check that lets a clean frame skip the repair walk, the one
depth scan per frame, the fixed-format timestamp parse, the message built without its walk or its
frozen `__init__`, the duplicate window. Pure functions, no servers."""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from lumio_ingestd import boundedjson, model
from lumio_ingestd.model import (
    MAX_ID,
    MAX_JSON_DEPTH,
    MAX_JSON_STRING,
    MAX_NAME,
    MAX_TEXT,
    ChatMessage,
    _parse_time_general,
    clean_json,
    clean_text,
    format_time,
    frame_is_clean,
    parse_time,
    utc,
)
from lumio_ingestd.recent import RecentIds
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.twitch import mapping
from lumio_ingestd.sources.twitch.mapping import interpret, map_chat, parse_envelope
from support import twitch_frames as tf

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


# --------------------------------------------------------------------------- one depth scan


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _interleaved(depth: int, *strings: str) -> Any:
    """Each level `[s0, s1, <next level>, s2, s3]`."""
    value: Any = 0
    for _ in range(depth):
        value = [strings[0], strings[1], value, strings[2], strings[3]]
    return value


def _true_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_true_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_true_depth(v) for v in value), default=0)
    return 0


def _random_doc(rng: random.Random, depth: int) -> Any:
    """JSON with strings that hold brackets, quotes, backslashes and non-ASCII text."""
    pieces = ["[", "]", "{", "}", '"', "\\", "a", "\u00e9", "\u20ac", "\U0001F600", "\n", " ", "1"]
    if depth <= 0 or rng.random() < 0.05:
        return rng.choice(["".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))),
                           rng.randint(-10, 10), None, True, 1.5])
    # one child goes on down, its siblings stay shallow (the document stays small)
    kids = [_random_doc(rng, depth - 1)] + [_random_doc(rng, rng.randint(0, min(2, depth - 1)))
                                            for _ in range(rng.randint(0, 3))]
    rng.shuffle(kids)
    if rng.random() < 0.5:
        return kids
    return {"".join(rng.choice(pieces) for _ in range(rng.randint(0, 3))) + str(i): kid
            for i, kid in enumerate(kids)}


def test_the_fast_depth_scan_answers_what_the_exact_scan_answers() -> None:
    rng = random.Random(16)
    docs = [json.dumps(_random_doc(rng, rng.randint(0, 40)), ensure_ascii=rng.random() < 0.5)
            for _ in range(1500)]
    docs += [json.dumps(_nested(n)) for n in range(28, 70)]
    # brackets in strings beside a structure 33 deep: neither may hide or fake a level
    # Strings whose brackets, read as structure, would close each level at once: an escaped
    # quote, or a backslash before a closing quote, misread would make 40 levels look like 1.
    docs += [json.dumps(_interleaved(40, '"', ']"', '"', '["')),
             json.dumps(_interleaved(40, "\\", "]\\", "\\", "[\\"))]
    docs += [json.dumps({"s": "[" * 40 + "}", "t": 'x\\"[', "v": _nested(33)}),
             json.dumps({"s": "]" * 40, "v": _nested(32)}),
             json.dumps({"s": "a\\\\", "v": _nested(33)}), json.dumps(["\\\"[[["] * 20)]
    checked = 0
    for doc in docs:
        obj = json.loads(doc)
        for limit in (16, 32, 64):
            expected = _true_depth(obj) > limit
            assert boundedjson.depth_exceeds(doc, limit) is expected, (limit, doc[:200])
            assert boundedjson.depth_exceeds(doc.encode(), limit) is expected
            assert boundedjson._depth_exceeds_exact(doc.encode(), limit) is expected
            checked += expected
    assert checked > 100  # the deep side was exercised, not only the shallow one


def test_invalid_json_is_scanned_the_exact_way_and_still_refused() -> None:
    for doc in ('[' * 70, '{"a": ' * 40 + '"x"', '["' + "[" * 70 + ']', '"' + "[" * 70,
                '[' * 40 + '"\\' + ']' * 40):
        got = boundedjson.depth_exceeds(doc, 32)
        assert got is boundedjson._depth_exceeds_exact(doc.encode(), 32), doc[:80]
        with pytest.raises(boundedjson.JsonRefused):
            boundedjson.loads(doc, max_depth=32)


def test_depth_at_most_skips_the_scan_only_within_the_limit() -> None:
    deep = json.dumps(_nested(70))
    with pytest.raises(boundedjson.JsonRefused) as refused:
        boundedjson.loads(deep, max_depth=64, depth_at_most=65)  # a bound past the limit: scanned
    assert refused.value.reason == "too_deep"
    assert boundedjson.loads(deep, max_depth=64, depth_at_most=64) == json.loads(deep)  # trusted


def _chat_frame_nested(depth: int, text: str = "hi") -> str:
    return _chat_frame(text, reply=_nested(depth))


@pytest.mark.parametrize("text", ["hi", "a \\\\ backslash"])  # the second fails the check early
def test_a_frame_past_the_parser_limit_is_still_refused_as_too_deep(text: str) -> None:
    frame = _chat_frame_nested(70, text)
    assert not frame_is_clean(frame)
    with pytest.raises(BadFrame) as refused:
        parse_envelope(frame)
    assert refused.value.reason == "too_deep"


@pytest.mark.parametrize("depth", [33, 40, 60])
def test_a_frame_past_the_clean_depth_is_repaired(depth: int) -> None:
    frame = _chat_frame_nested(depth)
    clean, fast = _via_interpret(frame)
    assert not clean and fast.sanitized
    _assert_same(fast, _walked(frame))


def test_a_frame_at_the_clean_depth_is_clean() -> None:
    # the reply sits 3 levels down (frame, payload, event): 29 more make 32 in all
    frame = _chat_frame_nested(29)
    assert _true_depth(json.loads(frame)) == MAX_JSON_DEPTH
    clean, fast = _via_interpret(frame)
    assert clean and not fast.sanitized
    _assert_same(fast, _walked(frame))
    assert not frame_is_clean(_chat_frame_nested(30))


# --------------------------------------------------------------------------- long strings


@pytest.mark.parametrize(("text", "clean"), [
    ("x" * MAX_NAME, True),
    ("x" * (MAX_NAME + 1), False),
    ("\u00e9" * MAX_NAME, True),          # 512 bytes, 256 characters: the byte check defers
    ("\u00e9" * (MAX_NAME + 1), False),
    ("\U0001F600" * MAX_NAME, True),      # 4 bytes each
    ("a\"" * 200, True),                  # escaped quotes split nothing, but 400 chars...
])
def test_the_long_string_check_counts_characters_not_bytes(text: str, clean: bool) -> None:
    frame = json.dumps({"a": text}, ensure_ascii=False)
    expected = clean and len(text) <= MAX_NAME
    assert frame_is_clean(frame) is expected, text[:20]
    assert model._has_long_run(frame, MAX_NAME) is (model._long_run(MAX_NAME).search(frame) is not None)


def test_the_long_string_check_gives_what_the_regex_gives() -> None:
    rng = random.Random(7)
    alphabet = ['"', "a", "\u00e9", "\U0001F600", " ", ":"]
    for _ in range(2000):
        probe = "".join(rng.choice(alphabet) if rng.random() < 0.02 else "a" * rng.randint(0, 120)
                        for _ in range(rng.randint(1, 30)))
        for limit in (8, 64, 256):
            assert model._has_long_run(probe, limit) is (
                model._long_run(limit).search(probe) is not None), (limit, probe[:80])


# --------------------------------------------------------------------------- building a message


def _create_by_walk(**kw: Any) -> ChatMessage:
    """What `ChatMessage.create` gave before its fast path: every field cleaned one by one."""
    raw = (kw["message_id"], kw.get("user_id", ""), kw.get("user_login", ""),
           kw.get("display_name", ""), kw.get("text", ""))
    clean = (clean_text(raw[0], MAX_ID), clean_text(raw[1], MAX_ID), clean_text(raw[2], MAX_NAME),
             clean_text(raw[3], MAX_NAME), clean_text(raw[4], MAX_TEXT))
    given = dict(kw.get("extras") or {})
    extras = given if kw.get("known_clean") else clean_json(given)
    return ChatMessage(platform=clean_text(kw["platform"], 32), account_id=int(kw["account_id"]),
                       message_id=clean[0], created_at=utc(kw["created_at"]), user_id=clean[1],
                       user_login=clean[2], display_name=clean[3], text=clean[4], extras=extras,
                       sanitized=raw != clean or extras != given)


FIELD_CASES: list[dict[str, Any]] = [
    {},
    {"text": "caf\u00e9 \U0001F600"},
    {"text": "nul \x00"},
    {"user_login": "\ud83d", "display_name": "\ude00"},  # two halves in two fields: both repaired
    {"display_name": "\ud83d\ude00"},                     # a real pair written as two surrogates
    {"message_id": "m" * (MAX_ID + 1)},
    {"user_id": "u" * (MAX_ID + 1)},
    {"user_login": "l" * (MAX_NAME + 1)},
    {"text": "t" * (MAX_TEXT + 1)},
    {"text": "t" * MAX_TEXT},
    {"user_id": 12345},                                   # not a str: converted
    {"user_id": None},
    {"platform": "p" * 33},
    {"platform": "tw\x00itch"},
    {"extras": {"k": "v\x00"}},
    {"extras": {"k": "v\x00"}, "known_clean": True},      # the caller's promise is taken
    {"extras": {"k": [1, 2.5, None]}},
    {"extras": {"k": float("nan")}},
    {"created_at": datetime(2026, 1, 5, 18, 1, 2)},       # naive: taken as UTC
    {"created_at": datetime(2026, 1, 5, 20, 1, 2, tzinfo=timezone(timedelta(hours=2)))},
]


@pytest.mark.parametrize("case", FIELD_CASES, ids=[repr(c)[:40] for c in FIELD_CASES])
@pytest.mark.parametrize("known_clean", [False, True])
def test_create_gives_what_cleaning_field_by_field_gives(case: dict[str, Any], known_clean: bool) -> None:
    kw: dict[str, Any] = {"platform": "twitch", "account_id": 42, "message_id": "m-1",
                          "created_at": DELIVERY, "user_id": "1", "user_login": "viewer",
                          "display_name": "Viewer", "text": "hello", "extras": {"color": "#fff"},
                          "known_clean": known_clean}
    kw.update(case)
    got, expected = ChatMessage.create(**kw), _create_by_walk(**kw)
    assert got == expected
    assert got.sanitized is expected.sanitized
    assert got.created_at.utcoffset() == timedelta(0)
    for name in ("platform", "message_id", "user_id", "user_login", "display_name", "text"):
        value = getattr(got, name)
        assert type(value) is str and not model._BAD_CHARS.search(value)
    if "known_clean" not in case:
        assert got.to_entry() == expected.to_entry()


def test_the_fast_builders_build_what_the_dataclass_builds() -> None:
    fields_ = dict(platform="twitch", account_id=1, message_id="m", created_at=DELIVERY, user_id="u",
                   user_login="l", display_name="d", text="t", extras={"a": 1}, sanitized=True)
    fast, slow = model._new_chat(*fields_.values()), ChatMessage(**fields_)  # type: ignore[arg-type]
    assert fast == slow and fast.sanitized and repr(fast) == repr(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.text = "changed"  # type: ignore[misc]
    env = mapping._new_envelope("id", "notification", DELIVERY, "t", "1", {"p": 1}, True)
    assert env == mapping.Envelope("id", "notification", DELIVERY, "t", "1", {"p": 1}, True)
    chat = ChatMessage(**fields_)  # type: ignore[arg-type]
    assert mapping._chat_note(chat) == mapping.Notification(chat=chat)
    with pytest.raises(AssertionError):  # a field added without its builder is caught at import
        model.slot_setters(ChatMessage, ("platform", "account_id"))


@pytest.mark.parametrize("ts", [
    DELIVERY, DELIVERY.replace(microsecond=0), datetime(999, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
    datetime(2026, 1, 5, 18, 1, 2, 7),  # naive
    datetime(2026, 1, 5, 20, 1, 2, 7, tzinfo=timezone(timedelta(hours=2))),
    datetime(2026, 1, 5, 18, 1, 2, 7, tzinfo=timezone(timedelta(0), "named UTC")),
])
def test_format_time_gives_what_it_gave(ts: datetime) -> None:
    assert format_time(ts) == utc(ts).isoformat(timespec="microseconds").replace("+00:00", "Z")
    assert format_time(ts).endswith("Z") and len(format_time(ts)) == 27


# --------------------------------------------------------------------------- the duplicate window


def test_recent_ids_forget_the_oldest_and_a_repeat_counts_as_new() -> None:
    recent = RecentIds(3)
    for ident in ("a", "b", "c"):
        recent.add(ident)
    recent.add("a")  # seen again: now the newest
    recent.add("d")  # "b" is the oldest now, and goes
    assert "b" not in recent and all(i in recent for i in ("a", "c", "d")) and len(recent) == 3
    assert list(recent._ids) == ["c", "a", "d"]
    empty = RecentIds(0)
    empty.add("x")
    assert len(empty) == 0
