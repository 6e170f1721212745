"""The flusher's shortcut decoder gives exactly what `ChatMessage.from_entry` gives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lumio_ingestd.chat.decode import decode_entry, entry_row
from lumio_ingestd.chat.store import encode_row
from lumio_ingestd.model import MAX_ID, MAX_JSON_DEPTH, MAX_NAME, MAX_TEXT, ChatMessage, EntryError
from support.chat import make_messages


def _variants() -> list[bytes]:
    base: dict[str, Any] = json.loads(make_messages(1)[0].to_entry())
    nested: Any = "leaf"
    for _ in range(MAX_JSON_DEPTH + 2):
        nested = {"n": nested}

    def entry(**changes: Any) -> bytes:
        obj = dict(base)
        for key, value in changes.items():
            if value is KeyError:
                obj.pop(key)
            else:
                obj[key] = value
        return json.dumps(obj).encode()

    return [
        *[m.to_entry() for m in make_messages(20)],
        ChatMessage.create(platform="kick", account_id=3, message_id="e", created_at=make_messages(1)[0]
                           .created_at, text="emoji 🧪 \\ \t \n", extras={}).to_entry(),
        entry(text="nul \u0000 inside"), entry(text="lone \ud83d"), entry(user_login="\udc00"),
        entry(text="x" * (MAX_TEXT + 1)), entry(text="x" * MAX_TEXT), entry(message_id="m" * (MAX_ID + 1)),
        entry(display_name="d" * (MAX_NAME + 1)), entry(platform="p" * 40),
        entry(extras={"k" * (MAX_NAME + 1): 1}), entry(extras={"deep": nested}),
        entry(extras={"f": float("nan")}), entry(extras={"f": 1.5, "b": True, "n": None}),
        entry(extras=["not", "an", "object"]), entry(extras=[]), entry(extras=None),
        entry(extras={"s": "\u0000"}), entry(account_id="7"), entry(account_id=True),
        entry(account_id=2**70), entry(user_id=None), entry(user_id=KeyError), entry(text=KeyError),
        entry(message_id=KeyError), entry(platform=KeyError), entry(created_at="2026-02-31T00:00:00.000000Z"),
        entry(created_at="2026-03-01T00:00:00Z"), entry(created_at="2026-03-01T00:00:00.123456789+02:00"),
        entry(created_at=12), entry(account_id=float("inf")), entry(v=2), entry(v=KeyError),
        b"[1, 2]", b"not json", b"\xff\xfe", b"[" * 100_000,
        entry(text="placeholder").replace(b"placeholder", b"\xed\xa0\xbd"),  # a UTF-8-encoded surrogate
        entry(extras={"long": "y" * 300, "k": [1, 2.5, {"x": None}]}),
        entry(extras={"s": "z" * 10_001}), entry(extras={"a": [[[[1]]]], "t": "{[{["}),
        b'{"v": 1, "text": "\\ud83d\\ude00", "platform": "twitch", "account_id": 1, '
        b'"message_id": "pair", "created_at": "2026-03-01T00:00:00.000001Z"}',
    ]


@pytest.mark.parametrize("raw", _variants())
def test_shortcut_matches_from_entry(raw: bytes) -> None:
    try:
        expected = ChatMessage.from_entry(raw)
    except (EntryError, AttributeError, OverflowError, RecursionError):
        # (from_entry lets the last three out; the decoder makes them EntryError)
        with pytest.raises(EntryError):
            decode_entry(raw)
        with pytest.raises(EntryError):
            entry_row(raw)
        return
    got = decode_entry(raw)
    assert got == expected
    assert got.sanitized == expected.sanitized
    assert entry_row(raw) == (encode_row(expected), expected.sanitized)


def test_entries_written_by_to_entry_take_the_shortcut() -> None:
    from lumio_ingestd.chat.decode import _clean_object

    msgs = make_messages(50)
    msgs.append(ChatMessage.create(platform="twitch", account_id=1, message_id="x",
                                   created_at=msgs[0].created_at, extras={"long": "y" * 5000}))
    assert all(_clean_object(m.to_entry()) is not None for m in msgs)
