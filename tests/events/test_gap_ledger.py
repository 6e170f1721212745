"""The gaps ledger on real Redis and PostgreSQL: when a path was away, and its row.

A first start with no record has no gap; a path that went down and came up
has one with exactly those bounds; a stop's time (a clean SIGTERM) is the
start of the next process's gap; without it (SIGKILL) the gap starts at the
last periodic record; chat paths are `not_healable`, 7TV and Jetstream
`healed`; every closed gap is counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events.gaps import HealQueue, HealWorker
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import GapKey
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.gaps import GapTable
from lumio_ingestd.stores.redisclient import connect
from support import make_config
from support.gaps import GapRig, make_gap_rig
from support.harness.servers import PostgresServer, wait_until

KICK = GapKey(7, "kick", "pusher", "not_healable")
SEVENTV = GapKey(7, "seventv", "eventapi", "healed")
CHAT = GapKey(8, "twitch", "chat", "not_healable")


@pytest.fixture
def parts(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[tuple[Pool, redis.Redis, str]]:
    cfg = make_config(tmp_path, pg_url=pg_url, redis_url=redis_url)
    migrate(cfg.timescale)
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    yield pool, client, pg_url
    pool.close()
    client.close()


def _rig(parts: tuple[Pool, redis.Redis, str], seen_interval_secs: float = 0.2) -> GapRig:
    pool, client, pg_url = parts
    return make_gap_rig(pool, client, Metrics(), pg_url, seen_interval_secs=seen_interval_secs)


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _seen(client: redis.Redis, key: GapKey) -> int | None:
    v = client.hget(rediskeys.source_seen(key.account_id), key.field)
    return None if v is None else int(v)


def test_a_first_start_has_no_gap_and_a_reconnect_has_one_with_exact_bounds(
        parts: tuple[Pool, redis.Redis, str]) -> None:
    rig = _rig(parts).start()
    client = parts[1]
    try:
        t0 = int(time.time() * 1000) - 10_000
        rig.ledger.up([KICK, CHAT], t0)
        assert wait_until(lambda: _seen(client, KICK) is not None and _seen(client, CHAT) is not None, 5)
        rig.ledger.down([KICK], t0 + 1_000)
        rig.ledger.up([KICK], t0 + 4_321)
        rows = rig.wait_rows(1)
        assert len(rows) == 1, rows  # no row for the first start, none for the chat path
        row = rows[0]
        assert (row["account_id"], row["platform"], row["source"], row["status"]) == (
            7, "kick", "pusher", "not_healable")
        assert row["started_at"] == _at(t0 + 1_000) and row["ended_at"] == _at(t0 + 4_321)
        assert row["healed_rows"] == 0
        assert rig.value("source_gaps_total", platform="kick", status="not_healable") == 1
        assert rig.value("source_gap_seconds_total", platform="kick") == pytest.approx(3.321)
    finally:
        rig.stop()


def test_up_paths_are_recorded_every_interval_and_a_kill_gap_starts_at_the_last_record(
        parts: tuple[Pool, redis.Redis, str]) -> None:
    client = parts[1]
    rig = _rig(parts, seen_interval_secs=0.2).start()
    rig.ledger.up([SEVENTV], int(time.time() * 1000))
    assert wait_until(lambda: _seen(client, SEVENTV) is not None, 5)
    first = _seen(client, SEVENTV)
    assert first is not None
    assert wait_until(lambda: (_seen(client, SEVENTV) or 0) >= first + 350, 5)
    # A SIGKILL: the process ends without the stop record (the source never says stopped).
    rig.stop()
    last = _seen(client, SEVENTV)
    assert last is not None
    killed_at = int(time.time() * 1000)
    assert killed_at - last <= 200 + 150  # at most one interval (and the stop's own turn) back

    again = _rig(parts).start()  # the next process
    try:
        back = int(time.time() * 1000) + 2_000
        again.ledger.up([SEVENTV], back)
        rows = again.wait_rows(1)
        assert rows[0]["started_at"] == _at(last) and rows[0]["ended_at"] == _at(back)
        assert rows[0]["status"] == "healed"  # 7TV's REST diff heals it on its own
        assert again.value("source_gaps_total", platform="seventv", status="healed") == 1
    finally:
        again.stop()


def test_a_clean_stop_records_its_time_and_the_next_gap_starts_exactly_there(
        parts: tuple[Pool, redis.Redis, str]) -> None:
    client = parts[1]
    rig = _rig(parts, seen_interval_secs=60).start()
    t0 = int(time.time() * 1000)
    rig.ledger.up([KICK], t0)
    assert wait_until(lambda: _seen(client, KICK) == t0, 5)
    stop_at = t0 + 777
    rig.ledger.stopped([KICK], stop_at)
    assert _seen(client, KICK) == stop_at  # written before stopped() returned
    rig.stop()
    assert _seen(client, KICK) == stop_at  # the ledger's own stop does not move it

    again = _rig(parts).start()
    try:
        again.ledger.up([KICK], stop_at + 20_000)
        rows = again.wait_rows(1)
        assert rows[0]["started_at"] == _at(stop_at)
        assert rows[0]["ended_at"] == _at(stop_at + 20_000)
    finally:
        again.stop()


def test_the_same_gap_reported_twice_is_one_row(parts: tuple[Pool, redis.Redis, str]) -> None:
    pool = parts[0]
    rig = _rig(parts).start()
    try:
        t0 = int(time.time() * 1000) - 5_000
        rig.ledger.up([KICK], t0)
        rig.ledger.down([KICK], t0 + 100)
        rig.ledger.up([KICK], t0 + 200)
        rig.wait_rows(1)
        from lumio_ingestd.model import Gap
        assert GapTable(pool).insert(Gap(KICK, t0 + 100, t0 + 200), "not_healable") is False
        assert len(rig.rows()) == 1
        assert rig.value("source_gaps_total", platform="kick", status="not_healable") == 1
    finally:
        rig.stop()


def test_a_gap_found_while_the_database_is_down_is_written_once_it_is_back(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str) -> None:
    cfg = make_config(tmp_path, pg_url=private_pg.url(), redis_url=redis_url, sections={
        "timescale": {"connect_timeout_secs": 2, "acquire_timeout_secs": 1}})
    migrate(cfg.timescale)
    pool = Pool(cfg.timescale)
    client = connect(cfg.redis)
    rig = _rig((pool, client, private_pg.url())).start()
    try:
        t0 = int(time.time() * 1000) - 5_000
        rig.ledger.up([KICK], t0)
        assert wait_until(lambda: _seen(client, KICK) == t0, 5)
        private_pg.stop()
        rig.ledger.down([KICK], t0 + 1_000)
        rig.ledger.up([KICK], t0 + 2_000)
        assert wait_until(lambda: _seen(client, KICK) == t0 + 2_000, 5)  # Redis goes on
        time.sleep(1.0)  # a few failed writes
        private_pg.start()
        rows = rig.wait_rows(1, timeout=20)
        assert [(r["started_at"], r["ended_at"]) for r in rows] == [(_at(t0 + 1_000), _at(t0 + 2_000))]
    finally:
        rig.stop()
        pool.close()
        client.close()


def test_a_heal_thread_waiting_for_a_job_stops_at_once(parts: tuple[Pool, redis.Redis, str]) -> None:
    # It waits in HealQueue.take for up to its poll; the stop's wake must end that wait (it
    # made every daemon's SIGTERM take the poll's full second), for every heal thread.
    pool, _, _ = parts
    queue = HealQueue()
    workers = [HealWorker(f"gap-heal-{n}", queue, GapTable(pool), Metrics(), heal_max_hours=1.0,
                          poll_secs=600.0) for n in (1, 2)]
    for worker in workers:
        worker.start()
    assert wait_until(lambda: all(w.alive for w in workers), 10)
    workers[0].request_stop()
    assert workers[0].join(10)
    assert workers[1].alive  # the other thread's wait goes on: only its own stop ends it
    workers[1].request_stop()
    assert workers[1].join(10)
