"""The retry worker against real servers: order, transient stops, poison, leases, orphans."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.events.retry import EventRetryWorker
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.events import (
    Rig,
    all_parked_ids,
    db_rows,
    ids_in,
    inflight,
    make_event,
    make_rig,
    old,
    parked,
    quarantined,
    stored_ids,
    stored_rows,
)
from support.harness.proxy import FaultProxy, FaultProxyFactory
from support.harness.servers import PostgresServer, wait_until


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Rig]:
    r = make_rig(tmp_path, pg_url, redis_url)
    yield r
    r.close()


@pytest.fixture
def proxied(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
            fault_proxy: FaultProxyFactory) -> Iterator[tuple[Rig, FaultProxy]]:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    r = make_rig(tmp_path, f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname_of(pg_dsn)}",
                 redis_url)
    r.pg_url = pg_server.url(dbname_of(pg_dsn))
    yield r, proxy
    proxy.pass_through()
    r.close()


def _park(rig: Rig, events: list[PlatformEvent]) -> list[bytes]:
    entries = [ev.to_entry() for ev in events]
    for ev, entry in zip(events, entries, strict=True):
        DeadLetters(rig.redis).park(ev.account_id, [entry])
    return entries


def _park_raw(rig: Rig, account: int, entries: list[bytes]) -> None:
    DeadLetters(rig.redis).park(account, entries)


# -- order and transient stops ---------------------------------------------------------


def test_replay_stops_at_the_first_transient_error_and_the_rest_keeps_its_order(
        proxied: tuple[Rig, FaultProxy]) -> None:
    rig, proxy = proxied
    first = [make_event(account=1, n=i, external_id=f"a{i}" if i % 2 else None) for i in range(10)]
    second = [make_event(account=2, n=i) for i in range(5)]
    entries_1 = _park(rig, first)
    entries_2 = _park(rig, second)
    inserted = 0

    def failpoint(name: str) -> None:
        nonlocal inserted
        if name == "events.retry.inserted":
            inserted += 1
            if inserted == 3:
                proxy.reset()  # the database goes away mid-pass

    worker = rig.worker(batch_size=4, failpoint=failpoint)
    report = worker.run_pass()
    assert (report.stored, report.stopped) == (3, "transient")
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in first[:3])
    # The rest is back at the head, in its order, byte for byte; account 2 untouched.
    assert parked(rig.redis, 1) == entries_1[3:]
    assert parked(rig.redis, 2) == entries_2
    assert inflight(rig.redis, 1, worker.instance) == []
    assert rig.redis.pttl(rediskeys.events_deadletter(1)) > 0
    assert rig.counter("events_dead_letter_depth") == 12

    proxy.pass_through()
    report = worker.run_pass()
    assert (report.stored, report.recovered, report.stopped) == (12, 0, None)
    rows = stored_rows(rig.pg_url)
    assert rows == {str(e.id): (e.created_at, e.account_id, e.external_id) for e in first + second}
    assert all_parked_ids(rig.redis) == []
    assert rig.counter("events_dead_letter_depth") == 0


def test_a_database_stopped_mid_pass_stops_the_pass(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str) -> None:
    rig = make_rig(tmp_path, private_pg.url(), redis_url)
    try:
        events = [make_event(account=3, n=i) for i in range(6)]
        entries = _park(rig, events)

        def failpoint(name: str) -> None:
            if name == "events.retry.deleted" and len(parked(rig.redis, 3)) == 0 \
                    and len(inflight(rig.redis, 3, "replayer-1")) == 4:
                private_pg.stop()

        worker = rig.worker(failpoint=failpoint)
        report = worker.run_pass()
        assert (report.stored, report.stopped) == (2, "transient")
        assert parked(rig.redis, 3) == entries[2:]
        private_pg.start()
        assert worker.run_pass().stored == 4
        assert sorted(stored_ids(private_pg.url())) == sorted(str(e.id) for e in events)
    finally:
        rig.close()


# -- poison ------------------------------------------------------------------------------


def test_poison_entries_are_quarantined_and_do_not_block_their_account(rig: Rig) -> None:
    good = [make_event(account=5, n=i, external_id=f"g{i}" if i == 1 else None) for i in range(3)]
    expired = make_event(account=5, n=10, created_at=old(73))
    permanent = make_event(account=5, n=11)
    permanent_entry = json.loads(permanent.to_entry())
    permanent_entry["account_id"] = 2**63  # beyond bigint: 22003 on insert
    future_version = dict(json.loads(good[0].to_entry()), v=99, id="0190f0f0-0000-7000-8000-000000000000")
    entries = [good[0].to_entry(), b"\xff not json", good[1].to_entry(), expired.to_entry(),
               json.dumps(permanent_entry).encode(), json.dumps(future_version).encode(),
               good[2].to_entry()]
    _park_raw(rig, 5, entries)

    report = rig.worker().run_pass()
    assert (report.stored, report.quarantined, report.stopped) == (3, 4, None)
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in good)
    held = quarantined(rig.redis, 5)
    assert [(q["reason"], q["sqlstate"]) for q in held] == [
        ("undecodable", None), ("expired", None), ("permanent", "22003"), ("undecodable", None)]
    assert held[0]["raw"] == "\\xff not json"
    assert held[1]["id"] == str(expired.id)  # the original entry, kept whole
    assert parked(rig.redis, 5) == [] and inflight(rig.redis, 5, "replayer-1") == []
    assert rig.counter("events_quarantined_total", reason="expired") == 1
    assert rig.counter("events_quarantined_total", reason="permanent") == 1
    assert rig.counter("events_quarantined_total", reason="undecodable") == 2
    assert rig.failures("lost") == 1  # the expired one, counted lost as specified
    assert rig.failures("rejected") == 0


@pytest.mark.parametrize("errcode", ["insufficient_privilege", "XX000"],
                         ids=["environmental-42501", "unclassified-XX000"])
def test_an_entry_that_keeps_failing_is_quarantined_as_stuck(rig: Rig, errcode: str) -> None:
    """A failure only this entry meets, retryable in kind, must not block its account forever."""
    admin = psycopg2.connect(rig.pg_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f"""
                CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.payload ? 'poison' THEN
                        RAISE EXCEPTION 'poisoned row' USING ERRCODE = '{errcode}';
                    END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER refuse_poison BEFORE INSERT ON events
                    FOR EACH ROW EXECUTE FUNCTION refuse_poison();""")
    finally:
        admin.close()
    before = make_event(account=6, n=0)
    stuck = make_event(account=6, payload={"poison": True})
    after = make_event(account=6, n=2)
    _park(rig, [before, stuck, after])
    worker = rig.worker(stuck_after=3)
    for _ in range(2):
        assert worker.run_pass().stopped == "transient"
        assert ids_in(parked(rig.redis, 6)) == [str(stuck.id), str(after.id)]
    report = worker.run_pass()
    assert (report.stored, report.quarantined, report.stopped) == (1, 1, None)
    assert sorted(stored_ids(rig.pg_url)) == sorted([str(before.id), str(after.id)])
    [held] = quarantined(rig.redis, 6)
    assert (held["id"], held["reason"]) == (str(stuck.id), "stuck")
    assert rig.counter("events_quarantined_total", reason="stuck") == 1
    expected_env = 3 if errcode == "insufficient_privilege" else 0
    assert rig.counter("db_environmental_errors_total") == expected_env


def test_a_replay_of_a_stored_event_counts_recovered_and_adds_no_row(rig: Rig) -> None:
    """The crash between commit and settle: the entry is still parked, the row exists."""
    events = [make_event(n=1), make_event(n=2, external_id="sub-2", children=2)]
    for ev in events:
        assert rig.ingest.persist_event(ev).outcome == "stored"
    _park(rig, events)
    worker = rig.worker()
    report = worker.run_pass()
    assert (report.stored, report.recovered) == (0, 2)
    assert rig.failures("recovered") == 2
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in events)
    assert db_rows(rig.pg_url, "SELECT count(*) FROM event_children") == [(2,)]
    assert all_parked_ids(rig.redis) == []


# -- in-flight lists of dead instances ----------------------------------------------------------


def test_in_flight_lists_of_dead_instances_are_recovered_and_of_live_ones_left(rig: Rig) -> None:
    dead = [make_event(account=4, n=i) for i in range(3)]
    alive = [make_event(account=4, n=10 + i) for i in range(2)]
    queued = [make_event(account=4, n=20)]
    rig.redis.rpush(rediskeys.events_inflight(4, "dead-1"), *[e.to_entry() for e in dead])
    rig.redis.rpush(rediskeys.events_inflight(4, "alive-1"), *[e.to_entry() for e in alive])
    rig.redis.set(rediskeys.instance_heartbeat("alive-1"), "1", px=30_000)
    _park(rig, queued)
    worker = rig.worker()
    report = worker.run_pass()
    assert (report.inflight_recovered, report.stored) == (3, 4)
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in dead + queued)
    assert ids_in(inflight(rig.redis, 4, "alive-1")) == [str(e.id) for e in alive]
    assert rig.redis.exists(rediskeys.instance_heartbeat(worker.instance))


# -- leases -------------------------------------------------------------------------------------


def test_only_the_lease_holder_replays_and_the_other_takes_over_after_the_ttl(rig: Rig) -> None:
    a = rig.worker("replica-a", lease_ttl_secs=1.0, heartbeat_ttl_secs=1.0)
    b = rig.worker("replica-b", lease_ttl_secs=1.0, heartbeat_ttl_secs=1.0)
    batch_1 = [make_event(n=i) for i in range(3)]
    _park(rig, batch_1)
    assert a.run_pass().stored == 3
    batch_2 = [make_event(n=10 + i) for i in range(3)]
    _park(rig, batch_2)
    report_b = b.run_pass()
    assert (report_b.leader, report_b.stored, report_b.depth) == (False, 0, 3)
    assert rig.counter("events_dead_letter_depth") == 3
    # A dies without releasing: B takes over once the lease expires, not before.
    died = time.monotonic()
    took_over: list[float] = []

    def b_replays() -> bool:
        if b.run_pass().leader:
            took_over.append(time.monotonic() - died)
            return True
        return False

    assert wait_until(b_replays, timeout=5, interval=0.1)
    assert 0.5 <= took_over[0] <= 2.0  # not before the TTL ran out; generous under load
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in batch_1 + batch_2)


def test_losing_the_lease_mid_pass_stops_it_and_puts_the_rest_back(rig: Rig) -> None:
    events = [make_event(n=i) for i in range(5)]
    entries = _park(rig, events)
    worker: EventRetryWorker

    def failpoint(name: str) -> None:
        if name == "events.retry.deleted" and len(stored_ids(rig.pg_url)) == 2:
            rig.redis.set(rediskeys.EVENTS_DRAIN_LEADER, b"someone-else")  # expired and taken
            assert wait_until(lambda: not worker.lease.still_held(), timeout=3)

    worker = rig.worker(lease_ttl_secs=0.6, failpoint=failpoint)
    report = worker.run_pass()
    assert (report.stored, report.stopped) == (2, "lease")
    assert parked(rig.redis, 7) == entries[2:]
    assert inflight(rig.redis, 7, worker.instance) == []


def test_the_worker_thread_replays_and_releases_its_lease_on_stop(rig: Rig) -> None:
    worker = rig.worker()
    worker.start()
    try:
        events = [make_event(n=i) for i in range(4)]
        _park(rig, events)
        assert wait_until(lambda: len(stored_ids(rig.pg_url)) == 4, timeout=10)
        assert wait_until(lambda: rig.counter("events_dead_letter_depth") == 0, timeout=5)
    finally:
        worker.request_stop()
        assert worker.join(timeout=10)
    assert not rig.redis.exists(rediskeys.EVENTS_DRAIN_LEADER)
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in events)


def test_a_stop_request_mid_pass_puts_the_rest_back(rig: Rig) -> None:
    events = [make_event(n=i) for i in range(4)]
    entries = _park(rig, events)
    worker: EventRetryWorker

    def failpoint(name: str) -> None:
        if name == "events.retry.deleted":
            worker.stop_event.set()

    worker = rig.worker(failpoint=failpoint)
    report = worker.run_pass()
    assert (report.stored, report.stopped) == (1, "stopping")
    assert parked(rig.redis, 7) == entries[1:]


def test_a_pass_ends_at_its_time_budget_and_the_next_turn_continues(rig: Rig) -> None:
    events = [make_event(n=i) for i in range(5)]
    entries = _park(rig, events)
    worker = rig.worker(pass_budget_secs=0.0)  # every pass ends after its first entry
    report = worker.run_pass()
    assert (report.stored, report.stopped) == (1, "budget")
    assert parked(rig.redis, 7) == entries[1:]
    assert worker.run_once() == 0.0  # more to do: no interval wait
    worker.start()
    try:
        assert wait_until(lambda: len(stored_ids(rig.pg_url)) == 5, timeout=10)
    finally:
        worker.request_stop()
        assert worker.join(timeout=10)
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in events)


def test_a_replica_that_is_not_leader_hands_back_its_own_stranded_inflight(rig: Rig) -> None:
    """A pass that failed midway (a Redis blip between claim and settle) leaves entries in
    this instance's in-flight list; while its heartbeat lives the leader leaves them alone,
    so the non-leader must hand them back itself or they sit there unseen."""
    events = [make_event(account=4, n=i) for i in range(3)]
    entries = _park(rig, events)
    a, b = rig.worker(instance="replica-a"), rig.worker(instance="replica-b")
    assert b.lease.acquire()  # B leads
    # A's list as a failed pass leaves it; A's heartbeat is alive.
    rig.redis.delete(rediskeys.events_deadletter(4))
    rig.redis.rpush(rediskeys.events_inflight(4, "replica-a"), *entries)
    rig.redis.set(rediskeys.instance_heartbeat("replica-a"), b"1", px=60_000)

    report = a.run_pass()
    assert not report.leader and report.inflight_recovered == 3
    assert inflight(rig.redis, 4, "replica-a") == []
    assert parked(rig.redis, 4) == entries
    assert b.run_pass().stored == 3  # and the leader stores them, exactly once
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in events)


def test_a_table_wide_children_failure_quarantines_nothing(rig: Rig) -> None:
    """When every write to event_children fails (a missing grant), gift events fail pass after
    pass; the canary has the entry's shape (children included), fails the same way, and so
    nothing is quarantined as stuck: the events wait for the fix."""
    admin = psycopg2.connect(rig.pg_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute("""
                CREATE FUNCTION no_children() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    RAISE EXCEPTION 'permission denied for table event_children'
                        USING ERRCODE = 'insufficient_privilege';
                END $$;
                CREATE TRIGGER no_children BEFORE INSERT ON event_children
                    FOR EACH ROW EXECUTE FUNCTION no_children();""")
        gift = make_event(account=11, external_id="gift-1", children=2)
        _park(rig, [gift])
        worker = rig.worker(stuck_after=2)
        for _ in range(4):
            assert worker.run_pass().quarantined == 0
        assert ids_in(parked(rig.redis, 11)) == [str(gift.id)]
        with admin.cursor() as cur:
            cur.execute("DROP TRIGGER no_children ON event_children")
        assert worker.run_pass().stored == 1
        assert stored_ids(rig.pg_url) == [str(gift.id)]
    finally:
        admin.close()
