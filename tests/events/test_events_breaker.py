"""The event path's breaker against a real black hole: one timeout per outage, not one per event.

A fault proxy in front of the session PostgreSQL stops forwarding without
closing anything. The first inline insert waits its bound and parks; every
later event parks at once, without trying the database, until the insert
probe (or a committed replay) sees it answer again. An insert stalled on one
thread makes the others park without waiting for their own timeout. A stop
cuts an insert in flight and parks what follows. Every test ends with each
event stored exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lumio_ingestd.events.persist import STOP_RESERVE_SECS
from lumio_ingestd.events.probe import InsertProbe
from lumio_ingestd.model import PersistResult, PlatformEvent, StreamChange
from lumio_ingestd.stores.sessions import StreamSessions
from lumio_ingestd.worker import STOP_GRACE_SECS
from support import dbname_of
from support.events import Rig, db_rows, make_event, make_rig, parked, stored_ids
from support.harness.proxy import FaultProxy, FaultProxyFactory
from support.harness.servers import PostgresServer

TIMEOUT = 1.5  # [events] insert_timeout_secs here: the pooled connection is warm, no connect
MARGIN = 0.5
#: What a park without an insert may take on a busy two-core machine (it is ~1 ms: one MULTI).
FAST = 0.25


@pytest.fixture
def proxied(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
            fault_proxy: FaultProxyFactory) -> Iterator[tuple[Rig, FaultProxy]]:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    rig = make_rig(tmp_path, f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname_of(pg_dsn)}",
                   redis_url, timescale={"pool_size": 3}, events={"insert_timeout_secs": TIMEOUT})
    rig.pg_url = pg_server.url(dbname_of(pg_dsn))  # the oracles read around the proxy
    rig.warm()
    yield rig, proxy
    proxy.pass_through()
    rig.close()


def _timed(rig: Rig, ev: PlatformEvent) -> tuple[PersistResult, float]:
    started = time.monotonic()
    result = rig.ingest.persist_event(ev)
    return result, time.monotonic() - started


def _replay_all(rig: Rig) -> None:
    report = rig.worker(breaker=rig.ingest.breaker).run_pass()
    assert report.leader and report.stopped is None, report


def test_a_black_hole_costs_the_first_event_one_timeout_and_the_rest_park_at_once(
        proxied: tuple[Rig, FaultProxy]) -> None:
    rig, proxy = proxied
    before = make_event(n=0, external_id="before")
    assert rig.ingest.persist_event(before).outcome == "stored"
    proxy.blackhole()
    first_ev = make_event(n=1, external_id="first")
    first, took = _timed(rig, first_ev)
    assert first.outcome == "parked" and TIMEOUT - 0.2 <= took <= TIMEOUT + MARGIN, took
    assert rig.ingest.breaker.open
    later = [make_event(n=i, external_id=f"later-{i}", children=i % 2) for i in range(2, 40)]
    waits = []
    for ev in later:
        result, took = _timed(rig, ev)
        assert result.outcome == "parked" and result.broadcast, result
        assert result.error and result.error.startswith("not tried"), result.error
        waits.append(took)
    assert max(waits) < FAST, sorted(waits)[-5:]
    assert rig.failures("parked") == 1 + len(later)
    # Nothing but the first event asked the database: one inline attempt was timed.
    assert rig.counter("events_insert_duration_seconds_count") == 2

    # The probe sees the hole too, on its own thread's time; the breaker stays open.
    probe = InsertProbe(rig.ingest, rig.metrics)
    probe.tick()
    assert rig.ingest.breaker.open and probe.probes == 1
    proxy.pass_through()
    probe.tick()
    assert not rig.ingest.breaker.open
    probe.tick()
    assert probe.probes == 2  # a closed breaker is not probed
    after = make_event(n=99, external_id="after")
    assert rig.ingest.persist_event(after).outcome == "stored"
    assert db_rows(rig.pg_url, "SELECT count(*) FROM events WHERE type = 'lumio.canary'") == [(0,)]

    _replay_all(rig)
    assert parked(rig.redis, 7) == []
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in [before, first_ev, *later, after])


def test_an_insert_stalled_on_one_thread_makes_the_others_park_at_once(
        proxied: tuple[Rig, FaultProxy]) -> None:
    rig, proxy = proxied
    proxy.blackhole()
    stalled = make_event(n=1, external_id="stalled")
    results: list[PersistResult] = []
    thread = threading.Thread(target=lambda: results.append(rig.ingest.persist_event(stalled)),
                              name="test-stalled-insert")
    thread.start()
    try:
        # Before the stall bound the others still try (a healthy insert is that slow at worst).
        deadline = time.monotonic() + 5
        while rig.ingest.breaker.stalled() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not rig.ingest.breaker.open  # nothing has failed yet: it is only stalled
        others = [make_event(n=i, external_id=f"other-{i}") for i in range(2, 12)]
        for ev in others:
            result, took = _timed(rig, ev)
            assert result.outcome == "parked" and took < FAST, (result, took)
            assert result.error is not None and "waited" in result.error
    finally:
        thread.join(TIMEOUT + 5)
    assert [r.outcome for r in results] == ["parked"]
    assert rig.ingest.breaker.open
    proxy.pass_through()
    assert rig.ingest.probe()
    _replay_all(rig)
    assert sorted(stored_ids(rig.pg_url)) == sorted(str(e.id) for e in [stalled, *others])


def test_the_retry_worker_opens_and_closes_the_breaker(proxied: tuple[Rig, FaultProxy]) -> None:
    rig, proxy = proxied
    worker = rig.worker(breaker=rig.ingest.breaker)
    ev = make_event(n=1, external_id="parked-by-hand")
    rig.ingest.deadletters.park(ev.account_id, [ev.to_entry()])
    proxy.blackhole()
    assert worker.run_pass().stopped == "transient"
    assert rig.ingest.breaker.open  # the live path parks now without a timeout of its own
    live, took = _timed(rig, make_event(n=2, external_id="live"))
    assert live.outcome == "parked" and took < FAST
    proxy.pass_through()
    rig.warm()  # the cut connections are gone; a new one takes longer than TIMEOUT to open
    report = worker.run_pass()
    assert report.stored == 2 and report.stopped is None, report
    assert not rig.ingest.breaker.open
    assert rig.ingest.persist_event(make_event(n=3, external_id="back")).outcome == "stored"
    assert len(stored_ids(rig.pg_url)) == 3


def test_a_stop_cuts_an_insert_in_flight_and_parks_what_comes_late(
        proxied: tuple[Rig, FaultProxy]) -> None:
    rig, proxy = proxied
    stop_budget = 5.0
    proxy.blackhole()
    ev = make_event(n=1, external_id="in-flight")
    results: list[tuple[PersistResult, float]] = []
    thread = threading.Thread(target=lambda: results.append(_timed(rig, ev)), name="test-in-flight")
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not rig.ingest.breaker.in_flight() and time.monotonic() < deadline:
            time.sleep(0.005)
        stop_by = time.monotonic() + stop_budget
        rig.ingest.stopping(stop_by)
    finally:
        thread.join(TIMEOUT + 5)
    (result, took), = results
    assert result.outcome == "parked"
    assert took < STOP_GRACE_SECS + 0.4 < TIMEOUT, took  # cut at the stop, not at its own bound
    assert rig.ingest.in_progress({thread.ident or 0}) == 0

    # The database is back: while enough time is left, an insert is tried, bounded to the grace.
    proxy.pass_through()
    assert rig.ingest.probe()
    assert rig.ingest.persist_event(make_event(n=2, external_id="drained")).outcome == "stored"
    # With less than the grace and the reserve left, the event is parked without a try.
    rig.ingest.stopping(time.monotonic() + STOP_GRACE_SECS + STOP_RESERVE_SECS - 0.1)
    late, took = _timed(rig, make_event(n=3, external_id="late"))
    assert late.outcome == "parked" and late.error == "not tried: stopping, too little time left"
    _replay_all(rig)
    assert len(stored_ids(rig.pg_url)) == 3


def test_stream_session_writes_wait_while_the_breaker_is_open(
        proxied: tuple[Rig, FaultProxy]) -> None:
    rig, proxy = proxied
    sessions = StreamSessions(rig.pool, rig.metrics, breaker=rig.ingest.breaker, retry_every_secs=0.0)
    proxy.blackhole()
    assert rig.ingest.persist_event(make_event(n=1)).outcome == "parked"  # one timeout: open now
    change = StreamChange(platform="twitch", kind="online", at=datetime.now(UTC), stream_id="s-1")
    started = time.monotonic()
    assert sessions.apply(7, change) is False
    assert sessions.stream_before(7, "twitch", datetime(2020, 1, 1, tzinfo=UTC)) is None
    assert time.monotonic() - started < FAST  # neither waited for the database
    assert sessions.pending() == 1
    proxy.pass_through()
    assert rig.ingest.probe()
    sessions.retry_pending()
    assert sessions.pending() == 0
    assert db_rows(rig.pg_url, "SELECT external_id FROM stream_sessions") == [("s-1",)]
    _replay_all(rig)
    assert len(stored_ids(rig.pg_url)) == 1
