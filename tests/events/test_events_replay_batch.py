"""The batched replay of parked events: many per transaction, each failing one alone.

Every test ends with the exactly-once check: each parked event is a row once,
or in the quarantine, or counted as already stored. A trigger records the
top-level transaction id of every row written (`txid_current()` is the same
inside a savepoint), so the tests can tell how many transactions stored them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest

from lumio_ingestd.events import store
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.events.retry import MAX_TX_ENTRIES
from lumio_ingestd.model import EventChild, PlatformEvent
from lumio_ingestd.stores import rediskeys
from support.events import (
    Rig,
    all_parked_ids,
    db_rows,
    inflight,
    make_event,
    make_rig,
    quarantined,
    stored_ids,
    uuid_connection,
)

ACCOUNT = 8


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Rig]:
    r = make_rig(tmp_path, pg_url, redis_url)
    _admin(r.pg_url, """
        CREATE TABLE written_in (event_id uuid, txid bigint);
        CREATE FUNCTION note_txid() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO written_in VALUES (NEW.id, txid_current());
            RETURN NEW;
        END $$;
        CREATE TRIGGER note_txid AFTER INSERT ON events
            FOR EACH ROW EXECUTE FUNCTION note_txid();""")
    yield r
    r.close()


def _admin(pg_url: str, sql: str) -> None:
    conn = psycopg2.connect(pg_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def _poison_trigger(pg_url: str, *, deferred: bool) -> None:
    """Rows whose payload has "poison" are refused (23514), at insert or at commit."""
    timing = "CONSTRAINT TRIGGER refuse_poison AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED" \
        if deferred else "TRIGGER refuse_poison BEFORE INSERT ON events"
    _admin(pg_url, f"""
        CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.payload ? 'poison' THEN
                RAISE EXCEPTION 'poisoned row' USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        CREATE {timing} FOR EACH ROW EXECUTE FUNCTION refuse_poison();""")


def _backlog(n: int, *, poison: set[int] = frozenset()) -> list[PlatformEvent]:  # type: ignore[assignment]
    return [make_event(account=ACCOUNT, n=i, external_id=f"x{i}" if i % 3 == 0 else None,
                       children=2 if i % 17 == 0 else 0,
                       payload={"n": i, "poison": True} if i in poison else None)
            for i in range(n)]


def _transactions(pg_url: str) -> dict[int, int]:
    """Top-level transaction id -> rows of events it wrote."""
    return {int(txid): int(n) for txid, n in db_rows(
        pg_url, "SELECT txid, count(*) FROM written_in GROUP BY txid")}


def _assert_stored_once(rig: Rig, events: list[PlatformEvent]) -> None:
    ids = stored_ids(rig.pg_url)
    assert len(ids) == len(set(ids)), "a second row"
    assert sorted(ids) == sorted(str(e.id) for e in events)
    assert db_rows(rig.pg_url, "SELECT count(*) FROM event_children") == [
        (sum(len(e.children) for e in events),)]
    assert all_parked_ids(rig.redis) == []
    assert inflight(rig.redis, ACCOUNT, "replayer-1") == []


def test_a_backlog_is_stored_many_events_per_transaction_exactly_once(rig: Rig) -> None:
    events = _backlog(300)
    stored_before = events[5]  # committed earlier, never settled: a replay of a stored event
    assert rig.ingest.persist_event(stored_before).outcome == "stored"
    # A platform redelivery parked beside the original: same external id, another id.
    again = make_event(account=ACCOUNT, n=999, external_id=events[90].external_id)
    entries = [e.to_entry() for e in events]
    entries.insert(91, again.to_entry())
    DeadLetters(rig.redis).park(ACCOUNT, entries)

    report = rig.worker().run_pass()
    assert (report.stored, report.recovered, report.quarantined, report.stopped) == (
        299, 2, 0, None)
    _assert_stored_once(rig, events)
    assert rig.failures("recovered") == 2
    assert rig.counter("events_persisted_total", path="replay") == 299
    per_tx = _transactions(rig.pg_url)
    # The pass's first three transactions hold one entry each, then the size doubles.
    assert max(per_tx.values()) == MAX_TX_ENTRIES
    assert len(per_tx) <= 16, per_tx


def test_an_entry_the_database_refuses_is_rolled_back_alone_inside_a_large_transaction(
        rig: Rig) -> None:
    _poison_trigger(rig.pg_url, deferred=False)
    events = _backlog(200, poison={70, 71, 150})
    DeadLetters(rig.redis).park(ACCOUNT, [e.to_entry() for e in events])

    report = rig.worker().run_pass()
    assert (report.stored, report.quarantined, report.stopped) == (197, 3, None)
    good = [e for i, e in enumerate(events) if i not in {70, 71, 150}]
    _assert_stored_once(rig, good)
    held = quarantined(rig.redis, ACCOUNT)
    assert [(q["id"], q["reason"], q["sqlstate"]) for q in held] == [
        (str(events[i].id), "permanent", "23514") for i in (70, 71, 150)]
    # Still batched around them: far fewer transactions than entries.
    assert len(_transactions(rig.pg_url)) <= 30


def test_a_transaction_refused_at_commit_is_retried_one_entry_per_transaction(rig: Rig) -> None:
    """A failure that only shows at COMMIT (a deferred constraint) loses the whole
    transaction: its entries are retried one per transaction, so only the bad one is
    quarantined and every other is stored once."""
    _poison_trigger(rig.pg_url, deferred=True)
    events = _backlog(120, poison={60})
    DeadLetters(rig.redis).park(ACCOUNT, [e.to_entry() for e in events])

    report = rig.worker().run_pass()
    assert (report.stored, report.quarantined, report.stopped) == (119, 1, None)
    _assert_stored_once(rig, [e for i, e in enumerate(events) if i != 60])
    [held] = quarantined(rig.redis, ACCOUNT)
    assert (held["id"], held["reason"], held["sqlstate"]) == (str(events[60].id), "permanent",
                                                              "23514")


def test_several_events_in_one_round_trip_tell_new_from_already_stored(rig: Rig) -> None:
    stored = make_event(account=ACCOUNT, n=1)
    assert rig.ingest.persist_event(stored).outcome == "stored"
    first = make_event(account=ACCOUNT, n=2, external_id="e-2")
    redelivered = make_event(account=ACCOUNT, n=3, external_id="e-2")
    fresh = make_event(account=ACCOUNT, n=4)
    conn = uuid_connection(rig.pg_url)
    try:
        with conn.cursor() as cur:
            store.prepare_replay(cur)
            store.prepare_replay(cur)  # a second time: a no-op
            assert store.insert_events_in_one_savepoint(cur, [stored, first, fresh],
                                                        "a") == [False, True, True]
            # The redelivery in a later query of the same transaction: the probe sees the row.
            assert store.insert_events_in_one_savepoint(cur, [redelivered], "b", "a") == [False]
            with pytest.raises(ValueError):
                store.insert_events_in_one_savepoint(cur, [], "c")
        conn.commit()
    finally:
        conn.close()
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in (stored, first, fresh))
    assert json.loads(make_event().to_entry())  # entries are still what they were


def test_events_with_children_share_the_round_trip_and_get_children_only_when_new(
        rig: Rig) -> None:
    """In a group, an event's children are written exactly when its row is new: not for a
    replay of a stored event (even one whose entry carries more children than were
    stored) nor for a duplicate by external id; once for a new row."""
    stored = make_event(account=ACCOUNT, n=1, children=1)
    assert rig.ingest.persist_event(stored).outcome == "stored"
    replayed = dataclasses.replace(stored, children=(*stored.children, EventChild("extra")))
    first = make_event(account=ACCOUNT, n=2, external_id="c-2", children=2)
    redelivered = make_event(account=ACCOUNT, n=3, external_id="c-2", children=3)
    fresh = make_event(account=ACCOUNT, n=4, children=2)
    plain = make_event(account=ACCOUNT, n=5, external_id="c-5")
    conn = uuid_connection(rig.pg_url)
    try:
        with conn.cursor() as cur:
            store.prepare_replay(cur)
            assert store.insert_events_in_one_savepoint(
                cur, [replayed, first, fresh, plain], "a") == [False, True, True, True]
            assert store.insert_events_in_one_savepoint(cur, [redelivered], "b", "a") == [False]
        conn.commit()
    finally:
        conn.close()
    assert sorted(stored_ids(rig.pg_url)) == sorted(
        str(e.id) for e in (stored, first, fresh, plain))
    children = db_rows(rig.pg_url, "SELECT event_id::text, ordinal, user_id, payload "
                                   "FROM event_children ORDER BY event_id, ordinal")
    assert children == sorted(
        (str(e.id), i, c.user_id, dict(c.payload))
        for e in (stored, first, fresh) for i, c in enumerate(e.children))


def test_a_backlog_with_children_is_stored_in_groups(rig: Rig,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Events with children no longer take a round trip of their own (two, with the
    children's insert): the replay stores them in its groups, each stored once."""
    alone: list[PlatformEvent] = []
    one_by_one = store.insert_event_in_savepoint

    def counted(cur: store.Cursor, ev: PlatformEvent, savepoint: str,
                release: str | None = None) -> bool:
        alone.append(ev)
        return one_by_one(cur, ev, savepoint, release)

    monkeypatch.setattr(store, "insert_event_in_savepoint", counted)
    events = [make_event(account=ACCOUNT, n=i, external_id=f"g{i}" if i % 2 else None,
                         children=3 if i % 4 == 0 else 0) for i in range(200)]
    DeadLetters(rig.redis).park(ACCOUNT, [e.to_entry() for e in events])
    report = rig.worker().run_pass()
    assert (report.stored, report.recovered, report.quarantined, report.stopped) == (
        200, 0, 0, None)
    _assert_stored_once(rig, events)
    # Only the ramp's first lone entries (and a group's lone tail) go one by one.
    assert not [e for e in alone if e.children][3:], len(alone)


def test_settling_trims_the_head_of_the_in_flight_list_or_removes_each_entry(rig: Rig) -> None:
    key = rediskeys.events_inflight(ACCOUNT, "r")
    entries = [make_event(account=ACCOUNT, n=i).to_entry() for i in range(6)]
    rig.redis.rpush(key, *entries)
    dl = DeadLetters(rig.redis)
    dl.settle_many(ACCOUNT, "r", entries[:3])  # the head, in order: trimmed
    assert inflight(rig.redis, ACCOUNT, "r") == entries[3:]
    dl.settle_many(ACCOUNT, "r", [entries[4], entries[3]])  # not the head in order: one by one
    assert inflight(rig.redis, ACCOUNT, "r") == [entries[5]]
    dl.settle_many(ACCOUNT, "r", [entries[5], b"never claimed"])  # longer than the list
    assert inflight(rig.redis, ACCOUNT, "r") == []
