"""The replay's group: several parked events in one statement under one savepoint.

`store.insert_events_in_one_savepoint` must keep every rule of `insert_event`
(the advisory lock, the bounded dedup probe, the conflict on (id, created_at),
children only with a new row) and the worker must stay exactly-once with it.
Each test ends with the exactly-once check on the rows it wrote.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest

from lumio_ingestd.events import store
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.model import PlatformEvent
from support.events import (
    Rig,
    all_parked_ids,
    db_rows,
    inflight,
    make_event,
    make_rig,
    one_waits_on_an_advisory_lock,
    stored_ids,
    uuid_connection,
)

ACCOUNT = 9


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Rig]:
    r = make_rig(tmp_path, pg_url, redis_url)
    yield r
    r.close()


def _group(rig: Rig, events: list[PlatformEvent]) -> list[bool]:
    conn = uuid_connection(rig.pg_url)
    try:
        with conn.cursor() as cur:
            store.prepare_replay(cur)
            news = store.insert_events_in_one_savepoint(cur, events, "g")
        conn.commit()
    finally:
        conn.close()
    return news


def test_a_group_keeps_every_rule_of_the_single_insert(rig: Rig) -> None:
    stored = make_event(account=ACCOUNT, n=1, children=1)
    known = make_event(account=ACCOUNT, n=2, external_id="k-2")
    for ev in (stored, known):
        assert rig.ingest.persist_event(ev).outcome == "stored"
    redelivered = make_event(account=ACCOUNT, n=3, external_id="k-2",
                             created_at=known.created_at + timedelta(seconds=30))
    far = replace(make_event(account=ACCOUNT, n=4, external_id="k-2"), id=uuid.uuid4(),
                  created_at=known.created_at - 2 * store.DEDUP_WINDOW)
    other_platform = replace(make_event(account=ACCOUNT, n=5, external_id="k-2"),
                             platform="kick")
    fresh = make_event(account=ACCOUNT, n=6, children=2)
    plain = make_event(account=ACCOUNT, n=7)
    # `stored` again, with one child more than was stored: still no new child.
    again = replace(stored, children=(*stored.children, *fresh.children))
    assert _group(rig, [again, redelivered, fresh, plain]) == [False, False, True, True]
    # Outside the dedup window, or on another platform, the same external id is another event.
    assert _group(rig, [far]) == [True]
    assert _group(rig, [other_platform]) == [True]

    ids = stored_ids(rig.pg_url)
    assert sorted(ids) == sorted(str(e.id) for e in (stored, known, far, other_platform, fresh,
                                                     plain))
    children = db_rows(rig.pg_url, "SELECT event_id::text, ordinal, user_id FROM event_children "
                                   "ORDER BY event_id, ordinal")
    assert children == sorted((str(e.id), i, c.user_id) for e in (stored, fresh)
                              for i, c in enumerate(e.children))


def test_an_id_twice_in_a_group_is_one_row_new_once(rig: Rig) -> None:
    """An entry parked twice (a retried park) may land twice in one group."""
    ev = make_event(account=ACCOUNT, n=1, children=2)
    other = make_event(account=ACCOUNT, n=2)
    assert _group(rig, [ev, other, ev]) == [True, True, False]
    assert sorted(stored_ids(rig.pg_url)) == sorted([str(ev.id), str(other.id)])
    assert db_rows(rig.pg_url, "SELECT count(*) FROM event_children") == [(2,)]


def test_a_group_takes_the_advisory_lock_every_writer_takes(rig: Rig) -> None:
    """A live insert of the same external id waits for the group's transaction and then
    finds its row: the group's lock key is the single insert's."""
    grouped = [make_event(account=ACCOUNT, n=i, external_id=f"lk-{i}") for i in range(3)]
    live = make_event(account=ACCOUNT, n=9, external_id="lk-1")
    results: dict[str, bool] = {}

    def insert_live() -> None:
        with rig.pool.transaction() as cur:
            results["live"] = store.insert_event(cur, live)

    conn = uuid_connection(rig.pg_url)
    try:
        with conn.cursor() as cur:
            store.prepare_replay(cur)
            assert store.insert_events_in_one_savepoint(cur, grouped, "g") == [True] * 3
            writer = threading.Thread(target=insert_live, name="live-writer")
            writer.start()
            assert one_waits_on_an_advisory_lock(rig.pg_url), (
                "the live insert never waited on the group's advisory lock")
            assert "live" not in results
        conn.commit()
        writer.join(timeout=10)
    finally:
        conn.close()
    assert results == {"live": False}
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in grouped)


def test_a_failing_group_is_undone_whole_by_its_savepoint(rig: Rig) -> None:
    first = [make_event(account=ACCOUNT, n=i) for i in range(3)]
    bad = make_event(account=ACCOUNT, n=99)
    refused = replace(bad, external_id="")  # the CHECK refuses an empty external id
    second = [make_event(account=ACCOUNT, n=10 + i, external_id=f"f-{i}") for i in range(3)]
    conn = uuid_connection(rig.pg_url)
    try:
        with conn.cursor() as cur:
            store.prepare_replay(cur)
            assert store.insert_events_in_one_savepoint(cur, first, "a") == [True] * 3
            with pytest.raises(psycopg2.IntegrityError):
                store.insert_events_in_one_savepoint(cur, [*second, refused], "b", "a")
            cur.execute("ROLLBACK TO SAVEPOINT b")
            assert store.insert_events_in_one_savepoint(cur, second, "c", "b") == [True] * 3
            with pytest.raises(ValueError):
                store.insert_events_in_one_savepoint(cur, [], "d")
        conn.commit()
    finally:
        conn.close()
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in first + second)


def test_an_entry_parked_twice_in_one_claim_is_stored_once_and_counted_once(rig: Rig) -> None:
    events = [make_event(account=ACCOUNT, n=i, external_id=f"p{i}" if i % 2 else None,
                         children=2 if i % 7 == 0 else 0) for i in range(150)]
    entries = [e.to_entry() for e in events]
    entries[60:60] = entries[40:45]  # a retried park: five entries again, in the same claim
    DeadLetters(rig.redis).park(ACCOUNT, entries)

    report = rig.worker().run_pass()
    assert (report.stored, report.recovered, report.quarantined, report.stopped) == (
        150, 5, 0, None)
    ids = stored_ids(rig.pg_url)
    assert sorted(ids) == sorted(str(e.id) for e in events)
    assert db_rows(rig.pg_url, "SELECT count(*) FROM event_children") == [
        (sum(len(e.children) for e in events),)]
    assert all_parked_ids(rig.redis) == []
    assert inflight(rig.redis, ACCOUNT, "replayer-1") == []
