"""`decode.copy_line`: a stageable entry as the COPY line of the very row the staging stores.

The flusher COPYs such lines straight into `chat_messages` instead of
handing the entries to PostgreSQL's jsonb staging; the rows must be the same
to the byte (jsonb keeps numbers as written), and every entry not in
`to_entry`'s shape must be left to the staging (None). An entry in exactly
`to_entry`'s bytes with nothing escaped takes `canonical_line` (no parse);
the other shapes need orjson: without it (`LUMIO_INGESTD_NO_ORJSON=1`, in a
child process) only the canonical ones become lines. The parity test writes
both ways into a real PostgreSQL.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

import support
from lumio_ingestd import fastjson
from lumio_ingestd.chat import store
from lumio_ingestd.chat.decode import canonical_line, copy_line, entry_row
from lumio_ingestd.config import TimescaleConfig
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.model import MAX_ENTRY_BYTES, ChatMessage
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.chat import assert_exactly_once, make_messages, make_rig
from support.harness.servers import PostgresServer

WHEN = datetime(2026, 3, 1, 12, 0, 0, 654321, tzinfo=UTC)


def message(mid: str, text: str = "hello", **extras: Any) -> ChatMessage:
    return ChatMessage.create(platform="twitch", account_id=7, message_id=mid, created_at=WHEN,
                              user_id="u1", user_login="login", display_name="Näme 😀", text=text,
                              extras=extras)


def template() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(message("t").to_entry())
    return obj


def hand(mid: str, **changes: Any) -> bytes:
    """An entry in to_entry's key order with `changes`, written by the standard library
    (so numbers stay as Python writes them, big ints included)."""
    obj = {**template(), "message_id": mid, **changes}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def canonical_entries() -> list[bytes]:
    """Entries as to_entry writes them without a `\\u` escape: canonical_line's, without a parse."""
    entries = [message(f"plain-{i}", t, nested={"list": [1, 2.5, None, True, "{} [] ,:"]}).to_entry()
               for i, t in enumerate(['braces {} and [brackets], commas , colons :', "emoji 😀 CJK 你好 é",
                                      "extras:{x:1}} as text", ""])]
    escaped = {"k\"ey\\": ['a "quoted" \\ value', "tab\tnl\ncr\r/"]}
    entries += [message(f"escaped-{i}", t, q=escaped).to_entry()
                for i, t in enumerate(['quotes " \' and a backslash \\ /', "backspace \x08 form feed \x0c",
                                       "tab\there\nnewline\rreturn \\n typed", '\\"\\\\"'])]
    entries += [
        message("no-extras").to_entry(),
        b'{"v":2,' + hand("plain-numbers", extras={})[7:-3] + b'{"a":0.10,"b":1e-400,'
        b'"c":123456789012345678901234567890,"d":{"extras":{}}}}',
        hand("plain-account", account_id=999_999_999_999_999_999),  # 18 digits
        hand("plain-space", extras={})[:-3] + b'{ "a" : [ 1 , 2 ] }}',
        message("escaped-slash").to_entry().replace(b'"hello"', rb'"a \/ b"'),  # no writer of ours does
    ]
    return entries


def copied_entries() -> list[bytes]:
    """Entries copy_line must turn into lines, each awkward in its own way."""
    texts = ['quotes " \' and a backslash \\ /', "tab\there\nnewline\rreturn, \\n typed",
             "typed \\u0041 and \\\\", "emoji 😀 CJK 你好 RTL مرحبا é", "\x01 \x1b ctl", ""]
    entries = [message(f"text-{i}", t, nested={"list": [1, 2.5, None, True, "é\t\"q\"\\"]}).to_entry()
               for i, t in enumerate(texts)]
    entries += [
        # Numbers jsonb keeps as written, which re-encoding would change.
        b'{"v":2,' + hand("numbers", extras={})[7:-3] + b'{"a":0.10,"b":1e-400,"c":1.5E+3,'
        b'"d":123456789012345678901234567890,"e":-0.0}}',
        hand("nested-extras-key", extras={"x": {"extras": {"y": 1}}, "extras": 2}),
        hand("null-extras", extras=None),
        hand("no-user-fields", user_id=None, user_login=None, display_name=None, text=None),
        b'{"v":2,' + hand("tab-space", extras={})[7:-3] + b'{\t"a" :\t[1 , 2]}}',
    ]
    missing = {k: v for k, v in template().items() if k not in ("extras", "user_id")}
    entries.append(json.dumps({**missing, "message_id": "missing-keys"}, ensure_ascii=False,
                              separators=(",", ":")).encode())
    return entries + canonical_entries()


def declined_entries() -> list[bytes]:
    """Entries copy_line must leave to PostgreSQL (the staging judges or casts them)."""
    good = message("g").to_entry()
    return [
        b"[1,2]", b'{"v":2,"platform":"twitch", not json',
        hand("bad-time", created_at="yesterday"), hand("no-zone", created_at="2026-03-01T12:00:00.123456"),
        hand("bool-account", account_id=True), hand("float-account", account_id=7.0),
        hand("str-account", account_id="7"), hand("big-account", account_id=2**70),
        hand("number-user", user_id=5), hand("list-extras", extras=[1]), hand("str-extras", extras="x"),
        json.dumps({k: v for k, v in template().items() if k != "message_id"}).encode(),
        good[:-1] + b',"later":1}',  # extras not the last key: the slice would not parse
        good.replace(b',"extras":', b', "extras":'),  # not to_entry's bytes
        b'{"v":2,"extras":{"a":{"extras":{}}},"platform":"twitch","account_id":7,"message_id":"m",'
        b'"created_at":"2026-03-01T12:00:00.654321Z"}',  # a nested key found first
        good[:-1] + b',"extras":{"twice":1}}',  # a second top-level extras: the slice holds both
    ]


def test_entries_to_entry_writes_without_a_unicode_escape_are_joined_without_a_parse() -> None:
    for entry in canonical_entries():
        assert canonical_line(entry) is not None, entry[:80]
    escaped = [e for e in copied_entries() if b"\\u" in e]
    assert escaped and all(canonical_line(e) is None for e in escaped)


def test_entries_near_to_entry_bytes_are_not_taken_for_canonical() -> None:
    good = message("g").to_entry()
    near = [
        hand("zero-lead")[:-3].replace(b'"account_id":7', b'"account_id":07') + b'{}}',
        good.replace(b'"account_id":7', b'"account_id":-0'),
        hand("nineteen-digits", account_id=1_000_000_000_000_000_000),
        good.replace(b'"v":2', b'"v":1'), good.replace(b'"text":"hello"', b'"text": "hello"'),
        good.replace(b'"hello"', rb'"hel\u006co"'), good.replace(b'"hello"', rb'"he\\"llo"'),
        good.replace(b'"hello"', rb'"hel\xlo"'), good.replace(b'"hello"', rb'"hello\"'),  # not JSON
        good.replace(b'"hello"', rb'"hel\0lo"'), good[:-3] + rb'{"a":"\u00e9"}}',
        good.replace(b'"hello"', b'"hel\x01lo"'), good.replace(b'"hello"', b'"hel\tlo"'),  # raw: not JSON
        good[:-3] + b'{\t"a":1}}', good[:-3] + b'{\n"a":1}}',  # JSON whitespace COPY cannot carry
        good[:-3] + b'{"a":1},"b":{}}',  # a key after extras: the group is not one value
        good[:-3] + b'{"a":1}}}', good[:-1] + b' }', good.replace(b".654321Z", b".654321+00:00"),
        good.replace(b',"user_id":"u1"', b""), good.replace(b"twitch", b"tw\\u0069tch"),
        good.replace(b'"hello"', b'"' + b"a" * MAX_ENTRY_BYTES + b'"'),  # past the entry cap
    ]
    for entry in near:
        assert canonical_line(entry) is None, entry


def test_entries_to_entry_writes_become_lines() -> None:
    for entry in copied_entries():
        assert store.stageable(entry), entry[:60]
        assert copy_line(entry) is not None, entry[:80]


def test_entries_in_any_other_shape_are_left_to_postgresql() -> None:
    for entry in declined_entries():
        assert copy_line(entry) is None, entry[:80]


def test_the_test_run_has_orjson() -> None:
    assert fastjson.USING_ORJSON, "the test extra installs orjson: the tests above need it"


def test_without_orjson_only_canonical_entries_become_lines_and_the_same_ones() -> None:
    entries = copied_entries() + declined_entries()
    child = ("import json, sys\n"
             "from lumio_ingestd import fastjson\n"
             "from lumio_ingestd.chat.decode import copy_line\n"
             "entries = [bytes.fromhex(h) for h in json.load(sys.stdin)]\n"
             "lines = [(line or b'').hex() for line in map(copy_line, entries)]\n"
             "print(json.dumps([fastjson.USING_ORJSON] + lines))\n")
    out = subprocess.run([sys.executable, "-c", child], input=json.dumps([e.hex() for e in entries]),
                         env=dict(os.environ, LUMIO_INGESTD_NO_ORJSON="1"),
                         cwd=support.ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    using_orjson, *lines = json.loads(out.stdout)
    assert using_orjson is False
    expected = [(canonical_line(e) or b"").hex() for e in entries]
    assert lines == expected
    assert all(canonical_line(e) is not None for e in canonical_entries())  # so `expected` has lines


@pytest.fixture
def pg_conn(pg_server: PostgresServer, pg_dsn: str) -> Iterator[psycopg2.extensions.connection]:
    migrate(TimescaleConfig(dsn=pg_server.url(dbname_of(pg_dsn))))
    conn = psycopg2.connect(pg_dsn, connect_timeout=5)
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


def stored_both_ways(conn: psycopg2.extensions.connection, lines: list[bytes],
                     entries: list[bytes]) -> tuple[list[Any], list[Any]]:
    """The rows `lines` store as COPY lines, and the rows `entries` store through the
    jsonb staging (each alone in an empty table; rolled back after)."""
    read = ("SELECT message_id, account_id, platform, created_at, user_id, user_login, "
            "display_name, text, extras::text FROM chat_messages ORDER BY message_id")
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE chat_messages")
            assert store.insert_encoded(cur, lines) == len(lines)
            cur.execute(read)
            by_line = cur.fetchall()
            cur.execute("TRUNCATE chat_messages")
            assert store.insert_entries(cur, entries) == len(entries)
            cur.execute(read)
            staged = cur.fetchall()
    finally:
        conn.rollback()
    return by_line, staged


def test_a_line_stores_the_row_the_staging_stores(pg_conn: psycopg2.extensions.connection) -> None:
    entries = copied_entries()
    lines = [copy_line(e) for e in entries]
    assert None not in lines
    by_line, staged = stored_both_ways(pg_conn, [line for line in lines if line is not None], entries)
    assert by_line == staged
    numbers = next(r for r in staged if r[0] == "numbers")
    assert "0.10" in numbers[8] and "123456789012345678901234567890" in numbers[8]


def test_the_flusher_copies_lines_and_stages_only_what_copy_line_declines(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    staged: list[bytes] = []
    real = store.insert_entries

    def counting(cur: Any, entries: Any) -> int:
        staged.extend(entries)
        return real(cur, entries)

    monkeypatch.setattr(store, "insert_entries", counting)
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    try:
        msgs = make_messages(250, account=7)
        odd = message("g").to_entry()[:-1] + b',"later":1}'  # storable, not to_entry's shape
        odd = odd.replace(b'"message_id":"g"', b'"message_id":"odd"')
        rig.oracle_redis().rpush(rediskeys.chat_buffer(7), *[m.to_entry() for m in msgs], odd)
        rig.flusher().tick()
        rig.flusher().tick()
        assert_exactly_once(rig.stored(), [m.message_id for m in msgs] + ["odd"])
        assert staged == [odd]  # the rest went in as COPY lines
    finally:
        rig.close()


# Characters chosen to stress both encodings: every escape JSON and COPY share,
# quotes, braces and the key names the pattern looks for, non-ASCII of 2, 3 and
# 4 bytes; rarely, what JSON writes with a \u (a control character) or what
# looks like one (a typed backslash-u).
_ALPHABET = list('ab "\\/{}[]:,\t\n\r\b\f\x7fé你😀') + ['"extras":', "\\t"]
_RARE = ["\x01", "\x1f", "\\u0041"]


def _random_text(rng: random.Random) -> str:
    text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 12)))
    return text + rng.choice(_RARE) if rng.random() < 0.01 else text


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return _random_text(rng)
    if kind == 1:
        return rng.choice([0, -7, 2**62, 2**80, 0.1, 2.5, -1e-7, 1.5e300, True, None])
    if kind == 2:
        return rng.choice(["", "plain"])
    if kind == 3:
        return rng.randint(-1000, 1000)
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {_random_text(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def random_entries(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    return [ChatMessage.create(
        platform="twitch", account_id=rng.choice([1, 7, 123456789012]), message_id=f"r{seed}-{i}",
        created_at=WHEN, user_id=_random_text(rng), user_login=_random_text(rng),
        display_name=_random_text(rng), text=_random_text(rng),
        extras={_random_text(rng): _random_value(rng, 1) for _ in range(rng.randint(0, 3))}).to_entry()
        for i in range(n)]


_COPY_ESCAPE = re.compile(rb"\\(.)", re.S)
_COPY_MEANING = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def copy_fields(line: bytes) -> list[bytes]:
    """A COPY text line's values, as PostgreSQL reads them."""
    return [_COPY_ESCAPE.sub(lambda m: _COPY_MEANING.get(m.group(1), m.group(1)), field)
            for field in line.rstrip(b"\n").split(b"\t")]


def test_random_entries_give_the_values_the_parsed_path_gives_or_are_declined() -> None:
    joined = 0
    for entry in random_entries(1, 3000):
        line = canonical_line(entry)
        if line is None:
            assert b"\\u" in entry, entry  # the one thing to_entry writes that it declines
            continue
        joined += 1
        expected = copy_fields(entry_row(entry)[0])  # parsed, then encoded by encode_row
        got = copy_fields(line)
        assert got[:8] == expected[:8], entry
        assert json.loads(got[8]) == json.loads(expected[8]), entry
    assert 2000 < joined < 3000  # most of the draw has no \u escape; some do


def test_random_entries_store_the_rows_the_staging_stores(pg_conn: psycopg2.extensions.connection) -> None:
    entries = [e for e in random_entries(2, 600) if canonical_line(e) is not None]
    assert len(entries) > 400
    by_line, staged = stored_both_ways(pg_conn, [canonical_line(e) or b"" for e in entries], entries)
    assert by_line == staged
