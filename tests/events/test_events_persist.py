"""persist_event and insert_event against real servers and real faults (the fault table's event rows).

Every test ends with the exactly-once oracle: each event sent is stored once
(by id, or by external id), or sits where the outcome says it went.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.events.deadletter import DEADLETTER_TTL_SECS
from lumio_ingestd.events.persist import event_spool_handler
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.events import (
    Rig,
    children_of,
    db_rows,
    make_event,
    make_rig,
    parked,
    stored_ids,
    stored_rows,
)
from support.harness.proxy import FaultProxy, FaultProxyFactory
from support.harness.servers import PostgresServer, RedisServer, wait_until

TIMEOUT = 3.0  # [events] insert_timeout_secs in these tests (the specified value)
MARGIN = 0.5   # what the bound may be overrun by: scheduling, the park itself




@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Rig]:
    r = make_rig(tmp_path, pg_url, redis_url)
    yield r
    r.close()


@pytest.fixture
def proxied(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
            fault_proxy: FaultProxyFactory) -> Iterator[tuple[Rig, FaultProxy, str]]:
    """A rig whose pool reaches the database through a fault proxy; and the direct URL."""
    direct = pg_server.url(dbname_of(pg_dsn))
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname_of(pg_dsn)}"
    r = make_rig(tmp_path, url, redis_url, timescale={"pool_size": 2})
    r.pg_url = direct  # the oracles read around the proxy
    r.warm()
    yield r, proxy, direct
    proxy.pass_through()
    r.close()


def _timed(rig: Rig, ev: PlatformEvent) -> tuple[str, float]:
    started = time.monotonic()
    result = rig.ingest.persist_event(ev)
    return result.outcome, time.monotonic() - started


def _replay_all(rig: Rig) -> None:
    report = rig.worker().run_pass()
    assert report.leader and report.stopped is None, report


# -- normal operation ---------------------------------------------------------------


def test_normal_operation_inserts_directly(rig: Rig) -> None:
    ev = make_event(external_id="sub-1", children=2)
    result = rig.ingest.persist_event(ev)
    assert (result.outcome, result.event, result.error) == ("stored", ev, None)
    assert result.durable
    assert stored_rows(rig.pg_url) == {str(ev.id): (ev.created_at, 7, "sub-1")}
    assert children_of(rig.pg_url, ev.id) == [(0, "r0.0"), (1, "r0.1")]
    assert parked(rig.redis, 7) == []
    assert rig.counter("events_persisted_total", path="inline") == 1
    assert rig.counter("events_insert_duration_seconds_count") == 1
    for outcome in ("parked", "recovered", "lost", "rejected"):  # exported at 0 from the start
        assert rig.failures(outcome) == 0


def test_a_redelivered_event_is_stored_once(rig: Rig) -> None:
    first = make_event(external_id="cheer-1")
    again = replace(first, id=uuid.uuid4())  # a platform retry, built into a new event
    assert rig.ingest.persist_event(first).broadcast
    result = rig.ingest.persist_event(again)
    assert result.outcome == "duplicate"
    assert result.durable and not result.broadcast  # its alert went out the first time
    assert rig.ingest.persist_event(first).outcome == "duplicate"
    assert stored_ids(rig.pg_url) == [str(first.id)]


def test_the_same_event_from_many_threads_is_one_row(rig: Rig) -> None:
    events = [make_event(external_id="raid-7", n=i) for i in range(6)]
    start = threading.Barrier(len(events), timeout=10)
    outcomes: list[str] = []
    lock = threading.Lock()

    def go(ev: PlatformEvent) -> None:
        start.wait()
        outcome = rig.ingest.persist_event(ev).outcome
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=go, args=(ev,), name=f"ingest-{i}") for i, ev in enumerate(events)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert sorted(outcomes) == ["duplicate"] * 5 + ["stored"]
    assert len(stored_ids(rig.pg_url)) == 1
    assert rig.failures("parked") == 0


# -- the database down, then back ------------------------------------------------------


def test_database_down_parks_and_the_replay_keeps_the_original_id_and_time(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str) -> None:
    rig = make_rig(tmp_path, private_pg.url(), redis_url)
    try:
        rig.warm()
        private_pg.stop()
        events = [make_event(n=i, external_id=f"sub-{i}" if i % 2 else None, children=i % 3)
                  for i in range(6)]
        results = [rig.ingest.persist_event(ev) for ev in events]
        assert [r.outcome for r in results] == ["parked"] * 6
        # The caller gets the row the event will be stored as (for the live alert).
        assert [r.event for r in results] == events
        assert all(r.durable and r.broadcast and r.error for r in results)
        assert rig.failures("parked") == 6

        entries = parked(rig.redis, 7)  # read before the replay
        in_redis = [PlatformEvent.from_entry(e) for e in entries]
        assert in_redis == events  # children included
        ttl_ms = rig.redis.pttl(rediskeys.events_deadletter(7))
        assert 0 < ttl_ms <= DEADLETTER_TTL_SECS * 1000

        private_pg.start()
        report = rig.worker().run_pass()
        assert (report.stored, report.recovered, report.stopped) == (6, 0, None)
        # Stored with the id and created_at of the parked entry, exactly once.
        assert stored_rows(rig.pg_url) == {
            str(p.id): (p.created_at, 7, p.external_id) for p in in_redis}
        for p in in_redis:
            assert [c[1] for c in children_of(rig.pg_url, p.id)] == [c.user_id for c in p.children]
        assert parked(rig.redis, 7) == []
        assert rig.counter("events_persisted_total", path="replay") == 6
        assert rig.counter("events_dead_letter_depth") == 0
    finally:
        rig.close()


def test_the_bound_holds_with_the_database_black_holed(proxied: tuple[Rig, FaultProxy, str]) -> None:
    rig, proxy, direct = proxied
    proxy.blackhole()
    events = [make_event(n=1), make_event(n=2, external_id="follow-2")]
    # First on the pooled connection (cut at the deadline), then on a fresh
    # connect that never gets an answer.
    for ev in events:
        outcome, took = _timed(rig, ev)
        assert outcome == "parked"
        assert took <= TIMEOUT + MARGIN, f"persist_event took {took:.2f}s"
    assert [PlatformEvent.from_entry(e) for e in parked(rig.redis, 7)] == events
    proxy.pass_through()
    _replay_all(rig)
    assert sorted(stored_ids(direct)) == sorted(str(e.id) for e in events)


def test_the_bound_holds_with_every_pool_connection_busy(proxied: tuple[Rig, FaultProxy, str]) -> None:
    rig, _, direct = proxied
    held = threading.Barrier(rig.pool.size + 1, timeout=10)
    release = threading.Event()

    def hold() -> None:
        with rig.pool.connection():
            held.wait()
            release.wait(30)

    holders = [threading.Thread(target=hold, name=f"holder-{i}") for i in range(rig.pool.size)]
    for th in holders:
        th.start()
    ev = make_event(external_id="bits-1", children=1)
    try:
        held.wait()
        outcome, took = _timed(rig, ev)  # acquire_timeout_secs is 30: the deadline cuts it
    finally:
        release.set()
        for th in holders:
            th.join(timeout=10)
    assert outcome == "parked"
    assert TIMEOUT - 0.2 <= took <= TIMEOUT + MARGIN, f"persist_event took {took:.2f}s"
    _replay_all(rig)
    assert stored_ids(direct) == [str(ev.id)]
    assert children_of(direct, ev.id) == [(0, "r0.0")]


def test_the_bound_holds_with_a_slow_database(proxied: tuple[Rig, FaultProxy, str]) -> None:
    """A lock makes the insert wait; statement_timeout (30 s) would only cancel it much later."""
    rig, _, direct = proxied
    blocker = psycopg2.connect(direct)
    ev = make_event(n=3)
    try:
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        outcome, took = _timed(rig, ev)
    finally:
        blocker.rollback()
        blocker.close()
    assert outcome == "parked"
    assert TIMEOUT - 0.2 <= took <= TIMEOUT + MARGIN, f"persist_event took {took:.2f}s"
    _replay_all(rig)
    assert stored_ids(direct) == [str(ev.id)]


# -- refusals ------------------------------------------------------------------------


@pytest.mark.parametrize("broken,sqlstate", [
    ({"account_id": 2**63}, "22003"),   # beyond bigint: a hand-built event
    ({"external_id": ""}, "23514"),     # the CHECK the model's sanitizing normally prevents
], ids=["bigint-overflow", "empty-external-id"])
def test_a_permanent_error_is_rejected_and_nothing_is_parked(rig: Rig, broken: dict[str, object],
                                                             sqlstate: str) -> None:
    ev = replace(make_event(), **broken)  # type: ignore[arg-type]
    result = rig.ingest.persist_event(ev)
    assert (result.outcome, result.sqlstate) == ("rejected", sqlstate)
    assert result.error and not result.durable
    assert rig.failures("rejected") == 1
    assert rig.failures("parked") == 0
    assert list(rig.redis.scan_iter(match="lumio:events:*")) == []
    assert stored_ids(rig.pg_url) == []


def test_a_missing_table_parks_raises_the_alert_and_replays_after_the_fix(rig: Rig) -> None:
    admin = psycopg2.connect(rig.pg_url)
    admin.autocommit = True
    try:
        rig.warm()
        with admin.cursor() as cur:
            cur.execute("ALTER TABLE events RENAME TO events_moved")
        ev = make_event(external_id="sub-42", children=1)
        result = rig.ingest.persist_event(ev)
        assert (result.outcome, result.sqlstate) == ("parked", "42P01")
        assert rig.counter("db_environmental_errors_total") == 1
        assert rig.failures("rejected") == 0
        # The replay meets the same problem, pass after pass: the entry waits; it is not
        # quarantined as stuck, because a canary event fails the same way.
        worker = rig.worker(stuck_after=2)
        for _ in range(3):
            assert worker.run_pass().stopped == "transient"
        assert rig.counter("db_environmental_errors_total") == 4
        assert len(parked(rig.redis, 7)) == 1
        assert rig.counter("events_quarantined_total", reason="stuck") == 0
        with admin.cursor() as cur:
            cur.execute("ALTER TABLE events_moved RENAME TO events")
        report = worker.run_pass()
        assert (report.stored, report.quarantined) == (1, 0)
        assert stored_ids(rig.pg_url) == [str(ev.id)]
        assert children_of(rig.pg_url, ev.id) == [(0, "r0.0")]
    finally:
        admin.close()


def test_a_revoked_grant_parks_and_replays_after_the_grant(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    dbname = dbname_of(pg_dsn)
    role = f"lumio_{uuid.uuid4().hex[:8]}"
    admin = pg_server.connect(dbname)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE ROLE {role} LOGIN")
        owner = make_rig(tmp_path, pg_server.url(dbname), redis_url)  # migrates as postgres
        owner.close()
        with admin.cursor() as cur:
            cur.execute(f"GRANT SELECT, INSERT ON events, event_children TO {role}")
        rig = make_rig(tmp_path, f"postgresql://{role}@127.0.0.1:{pg_server.port}/{dbname}",
                       redis_url, migrate_db=False)
        rig.pg_url = pg_server.url(dbname)
        try:
            assert rig.ingest.persist_event(make_event(n=0)).outcome == "stored"
            with admin.cursor() as cur:
                cur.execute(f"REVOKE INSERT ON events FROM {role}")
            ev = make_event(n=1, external_id="redeem-1")
            result = rig.ingest.persist_event(ev)
            assert (result.outcome, result.sqlstate) == ("parked", "42501")
            assert rig.counter("db_environmental_errors_total") == 1
            with admin.cursor() as cur:
                cur.execute(f"GRANT INSERT ON events TO {role}")
            _replay_all(rig)
            assert len(stored_ids(rig.pg_url)) == 2
            assert str(ev.id) in stored_ids(rig.pg_url)
        finally:
            rig.close()
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP OWNED BY {role}")
            cur.execute(f"DROP ROLE {role}")
        admin.close()


# -- the fail-fast variant ----------------------------------------------------------------


def test_insert_event_fails_fast_and_never_parks(proxied: tuple[Rig, FaultProxy, str]) -> None:
    rig, proxy, direct = proxied
    ok = make_event(n=1)
    assert rig.ingest.insert_event(ok).outcome == "stored"
    assert rig.counter("events_persisted_total", path="emit") == 1
    bad = replace(make_event(n=2), account_id=2**63)
    assert rig.ingest.insert_event(bad).outcome == "rejected"
    proxy.reset()
    down = make_event(n=3)
    started = time.monotonic()
    result = rig.ingest.insert_event(down)
    assert result.outcome == "unavailable" and result.error
    assert not result.durable
    assert time.monotonic() - started < TIMEOUT + MARGIN
    assert list(rig.redis.scan_iter(match="lumio:events:*")) == []
    assert rig.failures("parked") == 0
    assert stored_ids(direct) == [str(ok.id)]


# -- Redis refusing writes, and both down ----------------------------------------------------


def _refuse_writes(server: RedisServer) -> None:
    """maxmemory below what Redis already uses, with noeviction: every write is an OOM error."""
    client = server.client()
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
    finally:
        client.close()


def test_redis_refusing_writes_leaves_the_normal_path_alone_and_the_park_spools(
        tmp_path: Path, private_redis: RedisServer, pg_server: PostgresServer, pg_dsn: str,
        fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    direct = pg_server.url(dbname_of(pg_dsn))
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname_of(pg_dsn)}"
    rig = make_rig(tmp_path, url, private_redis.url, spool_bytes=1 << 20)
    rig.pg_url = direct
    try:
        _refuse_writes(private_redis)
        normal = make_event(n=1, external_id="sub-1")
        assert rig.ingest.persist_event(normal).outcome == "stored"

        proxy.reset()  # now the database too: the park meets the OOM, the spool takes it
        spooled = make_event(n=2, external_id="sub-2", children=2)
        result = rig.ingest.persist_event(spooled)
        assert (result.outcome, result.event) == ("spooled", spooled)
        assert result.durable
        assert rig.failures("parked") == 1 and rig.failures("lost") == 0
        assert rig.counter("spool_records_total", kind="event", op="written") == 1

        # The database comes back while Redis still refuses: the spool handler inserts directly.
        proxy.pass_through()
        assert rig.spool is not None
        assert rig.spool.replay(event_spool_handler(rig.ingest)) == 1
        assert rig.spool.pending_bytes() == 0
        assert sorted(stored_ids(direct)) == sorted([str(normal.id), str(spooled.id)])
        assert children_of(direct, spooled.id) == [(0, "r2.0"), (1, "r2.1")]
        assert rig.counter("events_persisted_total", path="replay") == 1
    finally:
        rig.close()


def test_both_down_spools_and_after_recovery_the_event_is_stored_once(
        tmp_path: Path, private_redis: RedisServer, private_pg: PostgresServer) -> None:
    rig = make_rig(tmp_path, private_pg.url(), private_redis.url, spool_bytes=1 << 20)
    try:
        rig.warm()
        private_pg.stop()
        private_redis.stop()
        events = [make_event(n=i, external_id=f"gift-{i}" if i else None, children=1) for i in range(3)]
        results = [rig.ingest.persist_event(ev) for ev in events]
        assert [r.outcome for r in results] == ["spooled"] * 3
        assert rig.failures("parked") == 3  # parked in the local tier
        assert rig.failures("lost") == 0

        handler = event_spool_handler(rig.ingest)
        assert rig.spool is not None
        with pytest.raises(Exception, match="both refused"):  # still both down: the spool keeps them
            rig.spool.replay(handler)
        assert rig.spool.pending_bytes() > 0

        # Redis comes back first: the spool parks the events there, the retry worker stores them.
        private_redis.start()
        assert wait_until(lambda: _redis_up(rig), timeout=5)
        assert rig.spool.replay(handler) == 3
        assert [PlatformEvent.from_entry(e) for e in parked(rig.redis, 7)] == events
        private_pg.start()
        worker = rig.worker()
        assert worker.run_pass().stored == 3
        # A second delivery of the same spool records (a crash before the ack) changes nothing.
        handler("event", [ev.to_entry() for ev in events])
        report = worker.run_pass()
        assert (report.stored, report.recovered) == (0, 3)
        rows = stored_rows(private_pg.url())
        assert rows == {str(e.id): (e.created_at, 7, e.external_id) for e in events}
        assert db_rows(private_pg.url(), "SELECT count(*) FROM event_children") == [(3,)]
    finally:
        rig.close()


def _redis_up(rig: Rig) -> bool:
    try:
        return bool(rig.redis.ping())
    except Exception:  # noqa: BLE001 - still starting
        return False


def test_spool_refusing_too_counts_lost(tmp_path: Path, private_redis: RedisServer,
                                        pg_server: PostgresServer, pg_dsn: str,
                                        fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname_of(pg_dsn)}"
    rig = make_rig(tmp_path, url, private_redis.url, spool_bytes=64)  # too small for any event
    try:
        proxy.reset()
        _refuse_writes(private_redis)
        ev = make_event(n=1)
        result = rig.ingest.persist_event(ev)
        assert (result.outcome, result.durable) == ("lost", False)
        assert rig.failures("lost") == 1 and rig.failures("parked") == 0
        assert rig.counter("spool_lost_total", kind="event", reason="full") == 1
    finally:
        rig.close()
