"""The inline insert's round trips, counted in the server's own statement log.

`persist_event` stores an event in one query, its commit included: the lock
and the probe-folded INSERT (children through its RETURNING) as one
multi-statement query in one implicit transaction. Each query message the
server receives is one `statement:` line of `log_statement = all`, so the
lines of the pool's backend are its round trips. The dedup outcomes are
checked on the same path: one row, and children only with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.model import PlatformEvent
from support import dbname_of
from support.events import Rig, children_of, make_event, make_rig, stored_ids
from support.harness.servers import PostgresServer


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[Rig]:
    # Before the pool connects: a database's settings apply to sessions opened after.
    conn = psycopg2.connect(pg_server.dsn())
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{dbname_of(pg_dsn)}" SET log_statement = \'all\'')
    finally:
        conn.close()
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url)
    yield r
    r.close()


def _round_trips(rig: Rig, pg_server: PostgresServer, ev: PlatformEvent) -> tuple[str, int]:
    """`persist_event(ev)`'s outcome and the query messages its connection sent."""
    offset = pg_server.log_path.stat().st_size
    outcome = rig.ingest.persist_event(ev).outcome
    # One thread, so the pool lends the one connection it just used (no query).
    with rig.pool.connection() as conn:
        pid = conn.info.backend_pid
    with open(pg_server.log_path, "rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    return outcome, len(re.findall(rf"\[{pid}\] LOG:  statement: ", text))


@pytest.mark.parametrize("external_id,children", [
    ("gift-rt", 3), ("gift-rt", 0), (None, 2), (None, 0),
], ids=["external-id-children", "external-id", "children", "plain"])
def test_the_inline_insert_is_one_round_trip(rig: Rig, pg_server: PostgresServer,
                                              external_id: str | None, children: int) -> None:
    rig.ingest.persist_event(make_event(n=99))  # the pool's connection opened (and its settings)
    ev = make_event(external_id=external_id, n=1, children=children)
    # Before the live insert became one round trip: BEGIN, lock, EXISTS, INSERT, children, COMMIT
    # (6 with both).
    assert _round_trips(rig, pg_server, ev) == ("stored", 1)
    # A replay of the same row: one round trip too, nothing added.
    assert _round_trips(rig, pg_server, ev) == ("duplicate", 1)
    assert str(ev.id) in stored_ids(rig.pg_url)
    assert len(children_of(rig.pg_url, ev.id)) == children


def test_duplicates_through_the_live_path_add_no_row_and_no_children(rig: Rig) -> None:
    first = make_event(external_id="gift-dup", n=1, children=3)
    # The platform's redelivery: a new row id, a later delivery time, other recipients.
    redelivery = replace(make_event(external_id="gift-dup", n=2, children=5),
                         created_at=first.created_at + timedelta(seconds=30))
    assert rig.ingest.persist_event(first).outcome == "stored"
    assert rig.ingest.persist_event(redelivery).outcome == "duplicate"
    assert rig.ingest.persist_event(first).outcome == "duplicate"  # the same id replayed
    assert rig.ingest.insert_event(redelivery).outcome == "duplicate"  # the REST emit's path
    assert stored_ids(rig.pg_url) == [str(first.id)]
    assert [ordinal for ordinal, _ in children_of(rig.pg_url, first.id)] == [0, 1, 2]
    assert children_of(rig.pg_url, redelivery.id) == []
    assert rig.failures("parked") == 0
