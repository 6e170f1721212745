"""The chat batch insert against a real PostgreSQL: idempotence, escaping, poison isolation."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import psycopg2
import pytest

from chat_support import BASE_TIME, ChatRig, assert_exactly_once, make_messages, make_rig
from harness.servers import PostgresServer
from lumio_ingestd.chat.store import insert_chat, store_isolating
from lumio_ingestd.db.errors import Kind
from lumio_ingestd.model import ChatMessage
from support import dbname_of


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    yield r
    r.close()


def _deadline() -> float:
    return time.monotonic() + 10


def test_insert_is_idempotent_and_round_trips_every_value(rig: ChatRig) -> None:
    msgs = make_messages(50)
    tricky = ChatMessage.create(
        platform="twitch", account_id=7, message_id="tricky\t\\N\n",
        created_at=BASE_TIME + timedelta(days=1),
        user_id="ü", user_login="\\\\", display_name="\r\n\t",
        text="emoji 🧪 zwj 👩‍👩‍👧 rtl \u202e combining e\u0301 and \\N and a quote \" and '",
        extras={"reply": {"text": "line\nbreak\ttab\\"}, "cheer": {"bits": 100}, "emotes": []})
    batch = [*msgs, tricky, msgs[0]]  # the same message twice in one batch
    with rig.pool.transaction(deadline=_deadline()) as cur:
        assert insert_chat(cur, batch) == 51
    with rig.pool.transaction(deadline=_deadline()) as cur:
        # a replay inserts nothing, and two calls in one transaction do not mix
        assert insert_chat(cur, msgs[:10]) == 0
        assert insert_chat(cur, msgs[10:]) == 0
    assert_exactly_once(rig.stored(), [m.message_id for m in batch])
    rows = rig.rows()
    for msg in (msgs[3], tricky):
        account, platform, created_at, user_id, login, name, text, extras = rows[msg.message_id]
        assert (account, platform, user_id, login, name, text) == (
            msg.account_id, msg.platform, msg.user_id, msg.user_login, msg.display_name, msg.text)
        assert created_at == msg.created_at  # microseconds kept
        assert extras == json.loads(json.dumps(msg.extras))


def test_store_isolating_stores_everything_else_and_returns_the_culprits(rig: ChatRig) -> None:
    good = make_messages(40)
    # Built without ChatMessage.create, as a buggy or older writer might: the
    # edge would have repaired these, the store must still isolate them.
    nul = replace(good[0], message_id="bad-nul", text="a\x00b")
    surrogate = replace(good[0], message_id="bad-surrogate", text="x\ud83dy")
    huge_account = replace(good[0], message_id="bad-account", account_id=2**70)
    batch = [*good[:13], nul, *good[13:30], huge_account, *good[30:], surrogate]

    inserted, culprits = store_isolating(rig.pool, batch, _deadline())

    assert inserted == 40
    by_id = {m.message_id: verdict for m, verdict in culprits}
    assert set(by_id) == {"bad-nul", "bad-surrogate", "bad-account"}
    assert all(v.kind is Kind.PERMANENT for v in by_id.values())
    assert by_id["bad-account"].sqlstate == "22003"
    assert by_id["bad-nul"].sqlstate is not None and by_id["bad-nul"].sqlstate.startswith("22")
    assert by_id["bad-surrogate"].sqlstate is None
    assert_exactly_once(rig.stored(), [m.message_id for m in batch], quarantined=by_id)
    # Idempotent on the second run, and the culprits are found again.
    inserted, culprits = store_isolating(rig.pool, batch, _deadline())
    assert inserted == 0 and len(culprits) == 3


def test_store_isolating_raises_transient_errors_whole(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   timescale={"statement_timeout_secs": 0.5})
    try:
        with rig.db() as locker, locker.cursor() as cur:
            cur.execute("BEGIN; LOCK TABLE chat_messages IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(psycopg2.Error) as info:
                store_isolating(rig.pool, make_messages(5), _deadline())
            cur.execute("ROLLBACK")
        assert info.value.pgcode == "57014"  # statement timeout: not split, not quarantined
        assert rig.stored() == {}
    finally:
        rig.close()
