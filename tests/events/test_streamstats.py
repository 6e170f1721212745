"""Viewer statistics per minute into `stream_stats`, with real PostgreSQL and Redis.

Samples of one minute are one row; a later write of the same minute merges
(average weighted by samples, maximum of maxima, samples summed); a window
the database does not take at the minute boundary is parked (Redis) or
spooled (Redis down too) and stored exactly once afterwards, also when the
same parked entry is replayed twice; a parked record of a kind nobody can
store is quarantined, not lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lumio_ingestd.events.persist import event_spool_handler
from lumio_ingestd.events.records import record_entry, record_kind
from lumio_ingestd.events.streamstats import KIND, minute_of
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.events import parked, quarantined
from support.harness.servers import PostgresServer, RedisServer
from support.streamstatus import StatusRig, make_status_rig

MINUTE = minute_of(datetime.now(UTC) - timedelta(minutes=10))


def at(seconds: float, minute: datetime = MINUTE) -> datetime:
    return minute + timedelta(seconds=seconds)


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[StatusRig]:
    r = make_status_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url)
    try:
        yield r
    finally:
        r.close()


def test_samples_of_a_minute_are_one_row_and_a_later_write_merges(rig: StatusRig) -> None:
    for s, viewers in ((5, 10), (25, 30), (45, 20)):
        rig.stats.add(42, "twitch", viewers, title="first", category="Chess", at=at(s))
    rig.stats.add(42, "twitch", 99, title="next", at=at(5, MINUTE + timedelta(minutes=1)))
    assert rig.stats.flush_due(now=at(70)) == 1  # only the minute that ended
    assert rig.stats_rows() == [(42, "twitch", MINUTE, 20.0, 30, 3, "first", "Chess")]
    assert rig.stats.held() == 1

    # Two more samples of the same minute (a restart within it): merged, weighted by samples.
    rig.stats.add(42, "twitch", 40, title="second", at=at(50))
    rig.stats.add(42, "twitch", 0, at=at(55))
    rig.stats.flush_all()
    rows = rig.stats_rows()
    assert rows[0] == (42, "twitch", MINUTE, 20.0 * 3 / 5 + 40 / 5, 40, 5, "second", "Chess")
    assert rows[1][2:6] == (MINUTE + timedelta(minutes=1), 99.0, 99, 1)
    assert rig.value("events_stream_stats_windows_total", outcome="written") == 3


def test_a_database_outage_at_the_minute_boundary_parks_the_window_and_it_is_stored_once(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str) -> None:
    private_pg.create_database("lumio")
    rig = make_status_rig(tmp_path, private_pg.url("lumio"), redis_url)
    try:
        for s, viewers in ((1, 7), (21, 9)):
            rig.stats.add(5, "twitch", viewers, title="t", category="c", at=at(s))
            rig.stats.add(6, "kick", viewers + 1, at=at(s))
        private_pg.stop()
        assert rig.stats.flush_due(now=at(61)) == 2
        assert rig.value("events_stream_stats_windows_total", outcome="parked") == 2
        entries = parked(rig.redis, 5) + parked(rig.redis, 6)
        assert [record_kind(e) for e in entries] == [KIND, KIND]
        entry = json.loads(entries[0])
        assert {"v", "id", "created_at", "account_id", "platform", "type", "external_id",
                "payload", "children"} <= set(entry)  # the INTERFACE's parked entry, plus kind

        private_pg.start()
        worker = rig.retry_worker()
        report = worker.run_pass()
        assert report.stored == 2 and parked(rig.redis, 5) == [] and parked(rig.redis, 6) == []
        rows = {(r[0], r[1]): r[3:6] for r in rig.stats_rows()}
        assert rows == {(5, "twitch"): (8.0, 9, 2), (6, "kick"): (9.0, 10, 2)}
        assert rig.value("events_stream_stats_windows_total", outcome="replayed") == 2
        assert rig.value("events_persisted_total", path="replay") == 0  # not counted as events

        # The same entry once more (a replayer killed between commit and settle): no change.
        rig.redis.rpush(rediskeys.events_deadletter(5), entries[0])
        report = worker.run_pass()
        assert report.recovered == 1 and report.stored == 0
        assert {(r[0], r[1]): r[3:6] for r in rig.stats_rows()} == rows
    finally:
        rig.close()


def test_with_redis_down_too_the_window_is_spooled_and_stored_once(
        tmp_path: Path, private_pg: PostgresServer, private_redis: RedisServer) -> None:
    private_pg.create_database("lumio")
    rig = make_status_rig(tmp_path, private_pg.url("lumio"), private_redis.url, spool_bytes=1 << 20)
    try:
        rig.stats.add(8, "twitch", 12, at=at(3))
        rig.stats.add(8, "twitch", 16, at=at(33))
        private_pg.stop()
        private_redis.stop()
        rig.stats.flush_all()
        assert rig.value("events_stream_stats_windows_total", outcome="parked") == 1
        assert rig.value("spool_records_total", kind="event", op="written") == 1

        private_pg.start()  # Redis stays down: the replay writes it directly
        handler = event_spool_handler(rig.events)
        replayed: list[bytes] = []

        def keep(kind: str, entries: list[bytes]) -> None:
            handler(kind, entries)
            replayed.extend(entries)

        assert rig.spool is not None and rig.spool.replay(keep) == 1
        assert [r[3:6] for r in rig.stats_rows()] == [(14.0, 16, 2)]
        handler("event", replayed)  # re-delivered after a crash before the ack: no change
        assert [r[3:6] for r in rig.stats_rows()] == [(14.0, 16, 2)]
        assert rig.value("events_stream_stats_windows_total", outcome="lost") == 0
    finally:
        rig.close()


def test_a_parked_record_of_an_unknown_kind_is_quarantined_not_stored_as_an_event(
        rig: StatusRig) -> None:
    ev = PlatformEvent.new(account_id=9, platform="twitch", type="future.thing", payload={"x": 1})
    rig.redis.rpush(rediskeys.events_deadletter(9), record_entry("future_kind", ev))
    report = rig.retry_worker().run_pass()
    assert report.quarantined == 1 and report.stored == 0
    assert [q["reason"] for q in quarantined(rig.redis, 9)] == ["undecodable"]
    assert rig.rows("SELECT count(*) FROM events") == [(0,)]


def test_a_malformed_parked_window_is_quarantined_as_permanent(rig: StatusRig) -> None:
    ev = PlatformEvent.new(account_id=9, platform="twitch", type=KIND, created_at=at(0),
                           payload={"ts": at(0).isoformat(), "samples": 0, "viewers_max": 1,
                                    "viewers_avg": 1.0})
    rig.redis.rpush(rediskeys.events_deadletter(9), record_entry(KIND, ev))
    report = rig.retry_worker().run_pass()
    assert report.quarantined == 1
    assert [q["reason"] for q in quarantined(rig.redis, 9)] == ["permanent"]
    assert rig.stats_rows() == []


def test_a_missing_stream_stats_table_keeps_windows_parked_until_it_is_back(rig: StatusRig) -> None:
    rig.stats.add(3, "twitch", 10, at=at(1))
    with rig.pool.transaction() as cur:  # deployed before `migrate`, say
        cur.execute("ALTER TABLE stream_stats RENAME TO stream_stats_away")
    rig.stats.flush_all()
    assert rig.value("events_stream_stats_windows_total", outcome="parked") == 1
    worker = rig.retry_worker(stuck_after=2)
    for _ in range(4):
        assert worker.run_pass().stopped == "transient"
    # Every write to the table fails the same way (the canary too): not "stuck", it waits.
    assert quarantined(rig.redis, 3) == [] and len(parked(rig.redis, 3)) == 1
    assert rig.value("db_environmental_errors_total") >= 4
    with rig.pool.transaction() as cur:
        cur.execute("ALTER TABLE stream_stats_away RENAME TO stream_stats")
    assert worker.run_pass().stored == 1
    assert [r[3:6] for r in rig.stats_rows()] == [(10.0, 10, 1)]
