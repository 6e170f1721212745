"""Rows made while the COPY sends them (`store_rows_isolating` given a generator).

The flusher and the dead-letter drain make each batch's COPY lines a piece at
a time as psycopg2 reads them, so PostgreSQL stores one piece while the next
is made. These tests drive that path against a real PostgreSQL with batches
of many pieces, and put what goes wrong in a later piece: a refused row, rows
already stored, a row that cannot even be made.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from chat_support import ChatRig, assert_exactly_once, make_messages, make_rig
from harness.servers import PostgresServer
from lumio_ingestd.chat.store import Row, RowsNotMade, encode_row, insert_chat, store_rows_isolating
from lumio_ingestd.db.errors import Kind
from lumio_ingestd.model import ChatMessage
from support import dbname_of

# Each line is ~150 bytes: 5,000 of them are ~25 pieces of the COPY.
N = 5_000


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    yield r
    r.close()


def _deadline() -> float:
    return time.monotonic() + 30


def _made(msgs: Sequence[ChatMessage], made: list[str]) -> Iterator[Row[str]]:
    """The rows of `msgs`, each made only when asked for (its id appended to `made` then)."""
    for msg in msgs:
        made.append(msg.message_id)
        yield msg.message_id, encode_row(msg), False


def test_later_rows_are_made_while_postgresql_stores_earlier_ones(rig: ChatRig) -> None:
    msgs = make_messages(N)
    made: list[str] = []
    seen_by_copy: list[int] = []

    def watched() -> Iterator[Row[str]]:
        for i, row in enumerate(_made(msgs, made)):
            if i == N - 500:
                # PostgreSQL's own progress counter of the COPY running now: rows
                # made first and sent whole afterwards would leave it at nothing.
                with rig.db() as conn, conn.cursor() as cur:
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        cur.execute("SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy")
                        found = cur.fetchone()
                        processed = int(found[0]) if found else 0
                        if processed:
                            break
                        time.sleep(0.01)
                    seen_by_copy.append(processed)
            yield row

    inserted, culprits = store_rows_isolating(rig.pool, watched(), _deadline())

    assert (inserted, culprits) == (N, [])
    assert seen_by_copy and 0 < seen_by_copy[0] < N
    assert made == [m.message_id for m in msgs]  # each made once, in order
    assert_exactly_once(rig.stored(), made)


def test_a_refused_row_in_a_later_piece_is_isolated_and_the_rest_stored_once(rig: ChatRig) -> None:
    msgs = make_messages(N)
    poison = replace(msgs[4321], message_id="poison-account", account_id=2**70)  # past bigint
    batch = [*msgs[:4321], poison, *msgs[4321:]]
    made: list[str] = []

    inserted, culprits = store_rows_isolating(rig.pool, _made(batch, made), _deadline())

    assert inserted == N
    assert [(item, v.kind, v.sqlstate) for item, v in culprits] == [
        ("poison-account", Kind.PERMANENT, "22003")]
    assert made == [m.message_id for m in batch]  # every row made, once, though the COPY failed
    assert_exactly_once(rig.stored(), made, quarantined=["poison-account"])


def test_rows_stored_before_in_a_later_piece_take_the_staging_path(rig: ChatRig) -> None:
    msgs = make_messages(N)
    with rig.pool.transaction(deadline=_deadline()) as cur:
        assert insert_chat(cur, msgs[3000:4000]) == 1000
    made: list[str] = []

    inserted, culprits = store_rows_isolating(rig.pool, _made(msgs, made), _deadline())

    assert (inserted, culprits) == (N - 1000, [])
    assert made == [m.message_id for m in msgs]
    assert_exactly_once(rig.stored(), made)


def test_a_row_that_cannot_be_made_fails_the_batch_whole(rig: ChatRig) -> None:
    """A bug while making rows is not a database error: nothing is split, nothing
    committed, and it says so (the caller keeps the batch in flight)."""
    msgs = make_messages(N)

    def broken() -> Iterator[Row[str]]:
        for i, row in enumerate(_made(msgs, [])):
            if i == 3500:
                raise RuntimeError("a bug while making row 3500")
            yield row

    with pytest.raises(RowsNotMade) as info:
        store_rows_isolating(rig.pool, broken(), _deadline())

    assert "row 3500" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert rig.stored() == {}

