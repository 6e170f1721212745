"""Version-2 chat entries go from Redis to `chat_messages` without Python decoding them.

The flusher hands a `stageable` entry to PostgreSQL as it came out of Redis
(COPY into a jsonb staging table, columns taken out by `jsonb_to_record`);
anything else is decoded, repaired and written as a COPY line as before. These
tests hold the two paths to the same rows, the byte checks to what they must
refuse, and the poison isolation to what it did. Real Redis and PostgreSQL;
each flush test ends with the exactly-once oracle.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd import fastjson
from lumio_ingestd.chat import batch, decode
from lumio_ingestd.chat.store import stageable
from lumio_ingestd.model import CHAT_ENTRY_VERSION, MAX_ENTRY_BYTES, MAX_TEXT, ChatMessage
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.chat import ChatRig, assert_exactly_once, counter_value, make_messages, make_rig
from support.harness.servers import PostgresServer

WHEN = datetime(2026, 3, 1, 12, 0, 0, 654321, tzinfo=UTC)


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    yield r
    r.close()


def _awkward(account: int, prefix: str) -> list[ChatMessage]:
    """Messages whose values exercise every escape of JSON, CSV and COPY text."""
    texts = [
        "plain ascii",
        'quotes " and \' and a backslash \\ and a slash /',
        "tab\there\nnewline\rreturn and \\n typed as text",
        "typed escapes: \\u0000 \\ud800 \\\\u0041",
        "emoji 😀🎉 and CJK 你好 and RTL مرحبا and combining é",
        "\x01\x02 control characters \x1e\x1f inside",
        "",
        "x" * MAX_TEXT,
    ]
    msgs = [ChatMessage.create(platform="twitch", account_id=account, message_id=f"{prefix}-{i}",
                               created_at=WHEN, user_id=f"u{i}", user_login=f"login{i}",
                               display_name=f"Näme {i} 😀", text=text,
                               extras={"nested": {"list": [1, 2.5, None, True, "é\t\"q\""]},
                                       "empty": {}, "n": -(2**62)})
            for i, text in enumerate(texts)]
    msgs.append(ChatMessage.create(platform="kick", account_id=account, message_id=f"{prefix}-bare",
                                   created_at=WHEN))
    return msgs


def _as_v1(entry: bytes) -> bytes:
    obj = json.loads(entry)
    obj["v"] = 1
    return json.dumps(obj, ensure_ascii=False).encode()


def test_entries_written_by_to_entry_are_version_2_and_stageable() -> None:
    for msg in _awkward(7, "s"):
        entry = msg.to_entry()
        assert json.loads(entry)["v"] == CHAT_ENTRY_VERSION == 2
        # Text that spells an escape ("\\u0000" in the entry) looks like one to
        # the byte scan, so it takes the decoding path (same row, see below).
        assert stageable(entry) == ("\\u0000" not in msg.text), entry[:80]
        assert ChatMessage.from_entry(entry) == msg


def test_stageable_refuses_what_postgresql_must_not_read_unrepaired() -> None:
    good = make_messages(1)[0].to_entry()
    obj = json.loads(good)

    def entry(**changes: Any) -> bytes:
        return fastjson.dumps({**obj, **changes})

    assert stageable(good)
    assert not stageable(_as_v1(good))  # older daemons' entries are decoded and repaired
    assert not stageable(fastjson.dumps({**obj, "v": 1}))
    assert not stageable(entry(text="hand\u0000built"))  # written as the escape \u0000
    assert not stageable(b'{"v":2,' + good[7:].replace(b'"text":"', b'"text":"\\ud800', 1))
    assert not stageable(json.dumps(obj, indent=1).encode())  # raw newlines would split the field
    assert not stageable(good.replace(b"message ", b"message\r", 1))
    assert not stageable(good.replace(b"message ", b"message\x1e", 1))
    assert not stageable(good.replace(b"message ", b"message\x1f", 1))
    assert not stageable(b'{"v":2,"text":"' + b"y" * MAX_ENTRY_BYTES + b'"}')
    # A valid surrogate pair is one character: nothing to repair, but the scan
    # is byte-level and sends it the careful way (rare: our encoders write UTF-8).
    assert not stageable(entry(text="x").replace(b'"text":"x"', b'"text":"\\ud83d\\ude00"'))


def test_both_paths_store_the_same_rows(rig: ChatRig) -> None:
    """The staged path (v2) and the decoding path (v1) give identical rows."""
    staged = _awkward(7, "a")
    decoded = _awkward(8, "a")
    client = rig.oracle_redis()
    client.rpush(rediskeys.chat_buffer(7), *[m.to_entry() for m in staged])
    client.rpush(rediskeys.chat_buffer(8), *[_as_v1(m.to_entry()) for m in decoded])
    rig.flusher().tick()

    with rig.db() as conn, conn.cursor() as cur:
        cur.execute("SELECT account_id, message_id, platform, created_at, user_id, user_login, "
                    "display_name, text, extras FROM chat_messages")
        rows = cur.fetchall()
    by_account: dict[int, dict[str, tuple[Any, ...]]] = {7: {}, 8: {}}
    for account, mid, *values in rows:
        by_account[account][mid] = tuple(values)
    assert len(by_account[7]) == len(staged) and by_account[7] == by_account[8]
    for msg in staged:  # and both are the message as it was built
        platform, created, user_id, login, display, text, extras = by_account[7][msg.message_id]
        assert (platform, created, user_id, login, display, text, extras) == (
            msg.platform, msg.created_at, msg.user_id, msg.user_login, msg.display_name,
            msg.text, dict(msg.extras))
    assert counter_value(rig.metrics, "chat_sanitized_total") == 0


def test_the_flusher_does_not_decode_version_2_entries(rig: ChatRig,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bytes] = []
    real = decode.entry_row

    def counting(raw: bytes) -> tuple[bytes, bool]:
        decoded.append(raw)
        return real(raw)

    monkeypatch.setattr(batch, "entry_row", counting)
    msgs = make_messages(250)
    legacy = make_messages(3, prefix="legacy")
    client = rig.oracle_redis()
    client.rpush(rediskeys.chat_buffer(7), *[m.to_entry() for m in msgs],
                 *[_as_v1(m.to_entry()) for m in legacy])
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), [m.message_id for m in [*msgs, *legacy]])
    assert len(decoded) == len(legacy)  # only the version-1 entries were read in Python


def test_staged_rows_the_database_refuses_are_isolated_and_quarantined(rig: ChatRig) -> None:
    good = make_messages(300, account=7)
    template = json.loads(good[0].to_entry())

    def v2(**changes: Any) -> bytes:
        raw = fastjson.dumps({**template, **changes})
        assert stageable(raw)  # each of these reaches PostgreSQL unread
        return raw

    entries = [m.to_entry() for m in good]
    entries.insert(10, v2(message_id="big-account", account_id=2**70))  # 22003
    # PostgreSQL would read these as times; the entry's one shape is required (23502).
    entries.insert(90, v2(message_id="bad-time", created_at="yesterday"))
    entries.insert(95, v2(message_id="no-zone", created_at="2026-03-01T12:00:00.123456"))
    entries.insert(91, b'{"v":2,"platform":"twitch", this is not json')  # 22P02
    missing = {k: v for k, v in template.items() if k != "message_id"}
    entries.insert(200, fastjson.dumps(missing))  # 23502: message_id is NOT NULL
    entries.insert(201, v2(message_id="dup", text="first"))
    entries.insert(202, v2(message_id="dup", text="first"))  # the same message twice: one row
    client = rig.oracle_redis()
    client.rpush(rediskeys.chat_buffer(7), *entries)

    flusher = rig.flusher()
    for _ in range(rig.cfg.chat.max_flush_failures + 1):
        flusher.tick()

    quarantined = rig.quarantined(7)
    states = sorted(q["sqlstate"] for q in quarantined)
    assert states == ["22003", "22P02", "23502", "23502", "23502"]
    sent = [m.message_id for m in good] + ["big-account", "bad-time", "no-zone", "dup"]
    assert_exactly_once(rig.stored(), sent, quarantined=["big-account", "bad-time", "no-zone"])
    assert counter_value(rig.metrics, "chat_quarantined_total") == 5
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "deadlettered"}) == 0
    assert rig.chat_keys() == [rediskeys.chat_quarantine(7)]


def test_version_2_entries_needing_repair_are_still_repaired(rig: ChatRig) -> None:
    template = json.loads(make_messages(1)[0].to_entry())
    nul = fastjson.dumps({**template, "message_id": "nul", "text": "a\u0000b"})
    lone = b'{"v":2,' + fastjson.dumps({**template, "message_id": "lone", "text": "LONE"})[7:]
    lone = lone.replace(b'"LONE"', b'"lone \\ud800!"')
    pretty = json.dumps({**template, "message_id": "pretty"}, indent=2).encode()
    client = rig.oracle_redis()
    client.rpush(rediskeys.chat_buffer(7), nul, lone, pretty)
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), ["nul", "lone", "pretty"])
    rows = rig.rows()
    assert rows["nul"][6] == "a\ufffdb"
    assert rows["lone"][6] == "lone \ufffd!"
    assert rows["pretty"][6] == template["text"]
    assert counter_value(rig.metrics, "chat_sanitized_total") == 2


def test_staged_entries_stored_twice_are_one_row(rig: ChatRig) -> None:
    """A batch resumed after its commit (the in-flight list outlived it) inserts nothing new."""
    msgs = make_messages(120)
    client = rig.oracle_redis()
    client.rpush(rediskeys.chat_buffer(7), *[m.to_entry() for m in msgs])
    rig.flusher().tick()
    client.rpush(rediskeys.chat_buffer(7), *[m.to_entry() for m in msgs[::3]])
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), [m.message_id for m in msgs])
    assert counter_value(rig.metrics, "chat_messages_flushed_total") == len(msgs) + len(msgs[::3])
