"""The chat batch insert against a real PostgreSQL: idempotence, escaping, poison isolation,
and rows made while the COPY sends them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.chat.store import (
    Row,
    RowsNotMade,
    encode_row,
    insert_chat,
    store_isolating,
    store_rows_isolating,
)
from lumio_ingestd.model import ChatMessage, Kind
from support import dbname_of
from support.chat import BASE_TIME, ChatRig, assert_exactly_once, make_messages, make_rig
from support.harness.servers import PostgresServer


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


# -- rows made while the COPY sends them ------------------------------------------------------
# The flusher and the dead-letter drain hand `store_rows_isolating` a generator:
# each batch's COPY lines are made a piece at a time as psycopg2 reads them, so
# PostgreSQL stores one piece while the next is made. These batches are many
# pieces long (5,000 lines of ~180 bytes: ~28 pieces), and what goes wrong
# goes wrong in a later piece: a refused row, rows already stored, a row that
# cannot even be made.

STREAMED = 5_000


def _made(msgs: Sequence[ChatMessage], made: list[str]) -> Iterator[Row[str]]:
    """The rows of `msgs`, each made only when asked for (its id appended to `made` then)."""
    for msg in msgs:
        made.append(msg.message_id)
        yield msg.message_id, encode_row(msg), False


def test_later_rows_are_made_while_postgresql_stores_earlier_ones(rig: ChatRig) -> None:
    msgs = make_messages(STREAMED)
    made: list[str] = []
    seen_by_copy: list[int] = []
    # What the COPY running now has written, seen from another session: PostgreSQL's
    # progress counter, or on a hypertable (TimescaleDB's COPY does not report
    # progress) the growth of its chunk, made beforehand by a row since deleted.
    with rig.db() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO chat_messages (account_id, platform, message_id, created_at) "
                    "VALUES (7, 'twitch', 'chunk-maker', %s)", (msgs[0].created_at,))
        cur.execute("DELETE FROM chat_messages WHERE message_id = 'chunk-maker'")
        cur.execute("SELECT to_regclass('timescaledb_information.hypertables') IS NOT NULL")
        hyper = bool((cur.fetchone() or (False,))[0])
        probe = ("SELECT coalesce(sum(pg_relation_size(c)), 0) FROM show_chunks('chat_messages') c"
                 if hyper else "SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy")
        cur.execute(probe)
        baseline = int((cur.fetchone() or (0,))[0]) if hyper else 0

    def watched() -> Iterator[Row[str]]:
        for i, row in enumerate(_made(msgs, made)):
            if i == STREAMED - 500:
                # Rows made first and sent whole afterwards would leave it at nothing.
                with rig.db() as conn, conn.cursor() as cur:
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        cur.execute(probe)
                        found = cur.fetchone()
                        processed = int(found[0]) - baseline if found else 0
                        if processed > 0:
                            break
                        time.sleep(0.01)
                    seen_by_copy.append(processed)
            yield row

    inserted, culprits = store_rows_isolating(rig.pool, watched(), _deadline())

    assert (inserted, culprits) == (STREAMED, [])
    assert seen_by_copy and seen_by_copy[0] > 0
    assert hyper or seen_by_copy[0] < STREAMED
    assert made == [m.message_id for m in msgs]  # each made once, in order
    assert_exactly_once(rig.stored(), made)


def test_a_refused_row_in_a_later_piece_is_isolated_and_the_rest_stored_once(rig: ChatRig) -> None:
    msgs = make_messages(STREAMED)
    poison = replace(msgs[4321], message_id="poison-account", account_id=2**70)  # past bigint
    batch = [*msgs[:4321], poison, *msgs[4321:]]
    made: list[str] = []

    inserted, culprits = store_rows_isolating(rig.pool, _made(batch, made), _deadline())

    assert inserted == STREAMED
    assert [(item, v.kind, v.sqlstate) for item, v in culprits] == [
        ("poison-account", Kind.PERMANENT, "22003")]
    assert made == [m.message_id for m in batch]  # every row made, once, though the COPY failed
    assert_exactly_once(rig.stored(), made, quarantined=["poison-account"])


def test_rows_stored_before_in_a_later_piece_take_the_staging_path(rig: ChatRig) -> None:
    msgs = make_messages(STREAMED)
    with rig.pool.transaction(deadline=_deadline()) as cur:
        assert insert_chat(cur, msgs[3000:4000]) == 1000
    made: list[str] = []

    inserted, culprits = store_rows_isolating(rig.pool, _made(msgs, made), _deadline())

    assert (inserted, culprits) == (STREAMED - 1000, [])
    assert made == [m.message_id for m in msgs]
    assert_exactly_once(rig.stored(), made)


@pytest.mark.parametrize("at", [0, 3500])
def test_a_row_that_cannot_be_made_fails_the_batch_whole(rig: ChatRig, at: int) -> None:
    """A bug while making rows is not a database error: nothing is split, nothing
    committed, and it says so (the caller keeps the batch in flight)."""
    msgs = make_messages(STREAMED)

    def broken() -> Iterator[Row[str]]:
        for i, row in enumerate(_made(msgs, [])):
            if i == at:
                raise RuntimeError(f"a bug while making row {at}")
            yield row

    with pytest.raises(RowsNotMade) as info:
        store_rows_isolating(rig.pool, broken(), _deadline())

    assert f"row {at}" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert rig.stored() == {}

