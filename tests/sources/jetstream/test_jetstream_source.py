"""The Jetstream source end to end: a stand-in Jetstream server, a real PostgreSQL.

Times are unix microseconds an hour ago, one event per second, so a 5 s
rewind replays five events.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.devkit.standins.jetstream import (
    JetstreamStandin,
    StandinEvent,
    account,
    commit,
    identity,
    tid,
)
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.jetstream.source import JetstreamSource
from lumio_ingestd.stores.jetstream import JetstreamStore
from support import make_config
from support.harness.proxy import FaultProxyFactory
from support.harness.servers import PostgresServer, wait_until

DID = "did:plc:streamer1111aaaa2222bbbb"
DID2 = "did:web:second.example.com"
STRANGER = "did:plc:someoneelse0000000000000"
POST, LIKE, FOLLOW = "app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.graph.follow"
SEC = 1_000_000
BASE = (int(time.time()) - 3600) * SEC


def at(i: int) -> int:
    return BASE + i * SEC


def ev(frame: dict[str, Any]) -> StandinEvent:
    return StandinEvent.of(frame)


@dataclass
class Rig:
    """One migrated database, one pool, the sources a test starts (stopped after)."""

    tmp_path: Path
    pg_url: str
    pool: Pool | None = None
    sources: list[JetstreamSource] = field(default_factory=list)
    alerts: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def config(self, url: str, collections: str = f"{POST}, {FOLLOW}") -> Config:
        return make_config(self.tmp_path, pg_url=self.pg_url, sections={
            "jetstream": {"url": url, "collections": collections, "rewind_secs": 5},
            "account.1": {"bluesky_did": DID},
            "account.2": {"bluesky_did": DID2},
            "account.3": {"twitch_user_id": "123"},
        })

    def source(self, url: str, *, collections: str = f"{POST}, {FOLLOW}", start: bool = True,
               on_post: Callable[[int, dict[str, Any]], None] | None = None,
               **kw: Any) -> JetstreamSource:
        cfg = self.config(url, collections)
        if self.pool is None:
            migrate(cfg.timescale)
            self.pool = Pool(cfg.timescale)
        opts: dict[str, Any] = dict(read_timeout_secs=5.0, ping_interval_secs=1.0, connect_timeout_secs=2.0,
                                    batch_window_secs=0.05, write_timeout_secs=5.0)
        opts.update(kw)
        src = JetstreamSource(cfg.jetstream, cfg.accounts, JetstreamStore(self.pool), Metrics(),
                              on_post=on_post or (lambda a, p: self.alerts.append((a, p))), **opts)
        src.reconnect_min_secs, src.reconnect_max_secs = 0.05, 0.2
        self.sources.append(src)
        if start:
            src.start()
        return src

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        assert self.pool is not None
        with self.pool.transaction() as cur:
            cur.execute(query, args)
            return cur.fetchall() if cur.description else []

    def cursor(self) -> int | None:
        got = self.sql("SELECT time_us FROM jetstream_cursor WHERE name = 'default'")
        return int(got[0][0]) if got else None

    def seed_cursor(self, value: int) -> None:
        self.sql("INSERT INTO jetstream_cursor (name, time_us) VALUES ('default', %s)", (value,))

    def table(self) -> list[tuple[Any, ...]]:
        return self.sql("SELECT did, collection, rkey, rev, cid, record, time_us FROM bsky_records "
                        "ORDER BY did, collection, rkey")

    def stop(self, src: JetstreamSource) -> None:
        src.request_stop()
        assert src.join(5), "the source did not stop"

    def close(self) -> None:
        for src in self.sources:
            src.request_stop()
        for src in self.sources:
            src.join(5)
        if self.pool is not None:
            self.pool.close()


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str) -> Iterator[Rig]:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    r = Rig(tmp_path, pg_server.url(dbname))
    yield r
    r.close()


@pytest.fixture
def fake() -> Iterator[JetstreamStandin]:
    with JetstreamStandin() as server:
        yield server


def _prime(rig: Rig, fake: JetstreamStandin) -> None:
    """Migrate (via a source that is never started) so the test can seed the cursor."""
    rig.sources.pop() if rig.source(fake.url, start=False) else None


def value(metric: Any, *labels: str) -> float:
    return float((metric.labels(*labels) if labels else metric)._value.get())


# -- connecting ---------------------------------------------------------------------


def test_starts_live_without_a_saved_cursor_then_stores_and_alerts_after_commit(
        rig: Rig, fake: JetstreamStandin, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lumio_ingestd.sources.jetstream")
    fake.add(ev(commit(DID, at(0), "create", POST, "before")))  # before we connect: not replayed
    seen_committed: list[bool] = []

    def on_post(account_id: int, payload: dict[str, Any]) -> None:
        # called after the commit: another connection already sees the row
        conn = psycopg2.connect(rig.pg_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM bsky_records WHERE rkey = %s", (payload["rkey"],))
                seen_committed.append(cur.fetchone() is not None)
        finally:
            conn.close()
        rig.alerts.append((account_id, payload))

    src = rig.source(fake.url, on_post=on_post)
    assert fake.wait_connections(1)
    first = fake.connections[0]
    assert first.cursor is None
    assert first.wanted_dids == sorted([DID, DID2])
    assert first.wanted_collections == [POST, FOLLOW]
    assert "no saved cursor: starting live" in caplog.text
    record = {"$type": POST, "text": "going live now!", "langs": ["en"],
              "createdAt": "2026-01-05T19:06:40.000Z"}
    fake.add(
        ev(commit(DID, at(10), "create", POST, "p1", record=record, cid="bafyreipost")),
        ev(commit(DID, at(11), "create", LIKE, "l1")),          # not a wanted collection
        ev(commit(STRANGER, at(12), "create", POST, "x1")),     # not a wanted DID
        ev(commit(DID2, at(13), "create", FOLLOW, "f1")),
        ev(commit(DID2, at(14), "update", POST, "p0")),        # an update is no alert
        ev(identity(DID, at(15), "streamer.example.com")),
        ev(account(DID2, at(16), active=False, status="deactivated")),
    )
    assert wait_until(lambda: rig.cursor() == at(16), timeout=10)
    assert [(r[1], r[2]) for r in rig.table()] == [(POST, "p1"), (POST, "p0"), (FOLLOW, "f1")]
    stored = {r[2]: r for r in rig.table()}
    assert stored["p1"] == (DID, POST, "p1", tid(at(10)), "bafyreipost", record, at(10))
    assert wait_until(lambda: len(rig.alerts) == 1, timeout=5)
    account_id, payload = rig.alerts[0]
    assert account_id == 1 and seen_committed == [True]
    assert payload["type"] == "bluesky.post" and payload["uri"] == f"at://{DID}/{POST}/p1"
    assert payload["record"] == record
    m = src.metrics
    assert value(m.jetstream_events, "commit", "create") == 2  # what arrived (the server filtered two)
    assert value(m.jetstream_events, "commit", "update") == 1
    assert value(m.jetstream_events, "identity", "none") == 1
    assert value(m.jetstream_events, "account", "none") == 1
    assert value(m.jetstream_records, "written") == 3
    # The events are about an hour old (BASE is fixed when the module loads).
    expected_lag = time.time() - at(16) / 1_000_000
    assert abs(value(m.jetstream_cursor_lag) - expected_lag) < 30
    assert "account event for did:web:second.example.com: active=False status=deactivated" in caplog.text


def test_a_reconnect_before_the_first_commit_resumes_from_when_it_went_live(
        rig: Rig, fake: JetstreamStandin) -> None:
    src = rig.source(fake.url)
    assert fake.wait_connections(1)
    went_live = int(time.time() * 1_000_000)
    # dropped right after an event the server filters out: nothing was committed yet
    fake.drop_after(at(1))
    fake.add(ev(commit(STRANGER, at(1), "create", POST, "x")))
    assert fake.wait_connections(2)
    second = fake.connections[1].cursor
    assert second is not None and went_live - 7 * SEC < second <= went_live - 5 * SEC
    assert rig.cursor() is None  # nothing is persisted for it: it is only this process's memory
    fake.add(ev(commit(DID, at(2), "create", POST, "p")))
    assert wait_until(lambda: rig.cursor() == at(2), timeout=10)
    assert src.requested_cursors[0] is None


def test_each_reconnect_asks_for_the_saved_cursor_minus_five_seconds(
        rig: Rig, fake: JetstreamStandin) -> None:
    _prime(rig, fake)
    rig.seed_cursor(at(0) - 1)
    fake.add(*[ev(commit(DID, at(i), "create", POST, f"p{i}")) for i in range(20)])
    fake.drop_after(at(7))
    fake.drop_after(at(15), abrupt=True)
    src = rig.source(fake.url)
    assert wait_until(lambda: rig.cursor() == at(19), timeout=15)
    assert [c.cursor for c in fake.connections] == [at(0) - 1 - 5 * SEC, at(7) - 5 * SEC, at(15) - 5 * SEC]
    assert src.requested_cursors == [c.cursor for c in fake.connections]
    assert value(src.metrics.source_disconnects, "bluesky") == 2
    assert value(src.metrics.jetstream_cursor_gaps) == 0
    assert len(rig.table()) == 20
    # the replays were seen and changed nothing; no post alerted twice
    assert value(src.metrics.jetstream_records, "stale") >= 8
    assert sorted(p["rkey"] for _, p in rig.alerts) == sorted(f"p{i}" for i in range(20))


def test_the_rewound_cursor_is_clamped_at_zero_and_an_old_cursor_is_a_counted_gap(
        rig: Rig, fake: JetstreamStandin, caplog: pytest.LogCaptureFixture) -> None:
    _prime(rig, fake)
    rig.seed_cursor(3 * SEC)  # 1970: rewinding 5 s would go below zero
    fake.oldest_retained_us = at(2)
    fake.add(*[ev(commit(DID, at(i), "create", POST, f"p{i}")) for i in range(5)])
    src = rig.source(fake.url)
    assert wait_until(lambda: rig.cursor() == at(4), timeout=10)
    assert fake.connections[0].cursor == 0  # still asked for: the server clamps it
    assert value(src.metrics.jetstream_cursor_gaps) == 1
    assert "may be missing" in caplog.text
    assert [r[2] for r in rig.table()] == ["p2", "p3", "p4"]  # what the server still had


def test_an_instance_that_ignores_the_filters_does_not_flood_the_table(rig: Rig) -> None:
    with JetstreamStandin(ignore_filters=True) as server:
        _prime(rig, server)
        rig.seed_cursor(at(0) - 1)
        server.add(ev(commit(DID, at(1), "create", LIKE, "l1")),
                   ev(commit(STRANGER, at(2), "create", POST, "x")),
                   ev(identity(STRANGER, at(3))), ev(commit(DID, at(4), "create", POST, "p1")))
        src = rig.source(server.url)
        assert wait_until(lambda: rig.cursor() == at(4), timeout=10)
        rig.stop(src)
    assert [r[2] for r in rig.table()] == ["p1"]
    assert value(src.metrics.jetstream_records, "unwanted") == 2


# -- exactly once in effect ---------------------------------------------------------------


def _script(n: int, seed: int) -> list[dict[str, Any]]:
    """Creates, updates and deletes over a few keys, with identity/account events between."""
    rng = random.Random(seed)
    alive: dict[tuple[str, str], bool] = {}
    frames: list[dict[str, Any]] = []
    for i in range(n):
        if i % 9 == 4:
            frames.append(identity(DID, at(i)) if i % 2 else account(DID2, at(i)))
            continue
        did = rng.choice([DID, DID2])
        collection = rng.choice([POST, POST, FOLLOW])
        key = (did, f"{collection}/k{rng.randrange(4)}")
        rkey = key[1].split("/")[1]
        if not alive.get(key):
            op = "create"
        else:
            op = rng.choice(["update", "delete"]) if collection == POST else "delete"
        alive[key] = op != "delete"
        frames.append(commit(did, at(i), op, collection, rkey, record={"$type": collection, "i": i}))
    frames.append(commit(STRANGER, at(n), "create", POST, "zz"))  # filtered by the server
    return frames


def test_events_straddling_disconnects_end_up_applied_exactly_once_in_effect(rig: Rig) -> None:
    frames = _script(40, seed=7)
    last = at(39)

    def run(drops: list[tuple[int, bool]]) -> tuple[list[tuple[Any, ...]], list[tuple[str, str]], int]:
        rig.sql("TRUNCATE bsky_records, jetstream_cursor, cursor_log")
        rig.alerts.clear()
        rig.seed_cursor(at(0) - 1)
        with JetstreamStandin([ev(f) for f in frames]) as server:
            for t, abrupt in drops:
                server.drop_after(t, abrupt=abrupt)
            src = rig.source(server.url)
            assert wait_until(lambda: rig.cursor() == last and len(server.connections) == len(drops) + 1,
                              timeout=20)
            rig.stop(src)
        alerts = [(p["uri"], p["rev"]) for _, p in rig.alerts]
        return rig.table(), alerts, len(server.connections)

    with JetstreamStandin() as idle:
        _prime(rig, idle)
    # Every change of the saved cursor is logged by a trigger, to prove it never moved back.
    rig.sql("CREATE TABLE cursor_log (n bigserial PRIMARY KEY, time_us bigint NOT NULL)")
    rig.sql("""CREATE FUNCTION log_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN INSERT INTO cursor_log (time_us) VALUES (NEW.time_us); RETURN NEW; END $$""")
    rig.sql("CREATE TRIGGER cursor_logged AFTER INSERT OR UPDATE ON jetstream_cursor "
            "FOR EACH ROW EXECUTE FUNCTION log_cursor()")

    plain, plain_alerts, _ = run([])
    cut, cut_alerts, connections = run([(at(9), False), (at(10), True), (at(22), False), (at(31), True)])
    assert connections == 5
    assert cut == plain  # whole table: same rows, revs, cids, records, times (tombstones too)
    assert len(plain) > 5 and any(r[5] is None for r in plain) and any(r[5] is not None for r in plain)
    # the saved cursor never moved backward, although every reconnect replayed 5 s
    log = [r[0] for r in rig.sql("SELECT time_us FROM cursor_log ORDER BY n")]
    assert log == sorted(log) and log[-1] == last
    # live alerts: never twice for one post revision; every surviving post was alerted in both runs
    assert len(cut_alerts) == len(set(cut_alerts))
    surviving = {(f"at://{r[0]}/{r[1]}/{r[2]}", r[3]) for r in plain if r[1] == POST and r[5] is not None}
    created = {(f"at://{f['did']}/{POST}/{f['commit']['rkey']}", f["commit"]["rev"]) for f in frames
               if f["kind"] == "commit" and f["commit"]["operation"] == "create"
               and f["commit"]["collection"] == POST and f["did"] != STRANGER}
    assert surviving & created <= set(plain_alerts) & set(cut_alerts)
    assert set(cut_alerts) <= created


# -- bad input, refusals -----------------------------------------------------------------


def test_bad_frames_are_counted_and_skipped_and_take_no_good_data_with_them(
        rig: Rig, fake: JetstreamStandin, caplog: pytest.LogCaptureFixture) -> None:
    _prime(rig, fake)
    rig.seed_cursor(at(0) - 1)
    junk = [
        StandinEvent(at(1), b"\x28\xb5\x2f\xfd\x00\x01", binary=True),
        StandinEvent(at(2), b'{"kind":"commit","did":"\xff"}'),            # a text frame, not UTF-8
        StandinEvent(at(3), "{not json"),
        StandinEvent(at(4), json.dumps({"did": DID, "time_us": at(4), "type": "com",
                                        "commit": {"type": "c"}})),
        StandinEvent(at(5), json.dumps({"did": DID, "time_us": at(5), "kind": "commit",
                                     "commit": {"operation": "create"}})),
        StandinEvent(at(6), '{"kind":"heartbeat","payload":""}'),
    ]
    good = [ev(commit(DID, at(10 + i), "create", POST, f"p{i}")) for i in range(3)]
    fake.add(good[0], *junk, good[1], good[2])
    src = rig.source(fake.url)
    assert wait_until(lambda: rig.cursor() == at(12), timeout=10)
    assert [r[2] for r in rig.table()] == ["p0", "p1", "p2"]
    m = src.metrics
    for reason in ("binary", "not_utf8", "not_json", "unsupported_schema", "malformed"):
        assert value(m.source_bad_frames, "bluesky", reason) == 1, reason
    assert value(m.source_disconnects, "bluesky") == 0 and src.alive
    assert "frame refused (malformed)" in caplog.text


def test_a_commit_the_database_refuses_is_skipped_alone(rig: Rig, fake: JetstreamStandin) -> None:
    _prime(rig, fake)
    rig.seed_cursor(at(0) - 1)
    rig.sql("ALTER TABLE bsky_records ADD CONSTRAINT no_poison CHECK (rkey <> 'poison')")
    fake.add(*[ev(commit(DID, at(i), "create", POST, rkey)) for i, rkey in enumerate(["a", "poison", "b"])])

    def failing_alert(account_id: int, payload: dict[str, Any]) -> None:
        rig.alerts.append((account_id, payload))
        raise RuntimeError("the broadcaster is broken")

    src = rig.source(fake.url, on_post=failing_alert, batch_window_secs=0.5)
    assert wait_until(lambda: rig.cursor() == at(2), timeout=10)
    assert [r[2] for r in rig.table()] == ["a", "b"]
    assert value(src.metrics.jetstream_records, "refused") == 1
    assert sorted(p["rkey"] for _, p in rig.alerts) == ["a", "b"]  # a raising alert undoes nothing
    assert src.alive and value(src.metrics.source_disconnects, "bluesky") == 0


# -- stop, timeouts, database outage ---------------------------------------------------------


def test_the_stop_is_prompt_and_what_was_received_is_committed(rig: Rig, fake: JetstreamStandin) -> None:
    _prime(rig, fake)
    rig.seed_cursor(at(0) - 1)
    fake.add(*[ev(commit(DID, at(i), "create", POST, f"p{i:02}")) for i in range(50)])
    # a long window: everything stays in memory until the stop
    src = rig.source(fake.url, batch_window_secs=60.0, batch_max=10_000, read_timeout_secs=120.0)
    assert wait_until(lambda: src.pending == 50, timeout=10)
    assert rig.cursor() == at(0) - 1
    started = time.monotonic()
    src.request_stop()
    assert src.join(5)
    assert time.monotonic() - started < 0.9  # the read blocks up to 1 s; wake() cuts it
    assert len(rig.table()) == 50 and rig.cursor() == at(49)


def test_a_silent_socket_is_dead_but_pings_keep_a_quiet_one_alive(
        rig: Rig, fake: JetstreamStandin, fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy("127.0.0.1", fake.port)
    src = rig.source(f"ws://127.0.0.1:{proxy.port}/subscribe", read_timeout_secs=0.8,
                     ping_interval_secs=0.2, connect_timeout_secs=0.5)
    assert fake.wait_connections(1)
    quiet = threading.Event()
    quiet.wait(2.0)  # nothing is sent for 2.5 read timeouts: only pings and pongs cross
    assert len(fake.connections) == 1 and value(src.metrics.source_disconnects, "bluesky") == 0
    proxy.blackhole()
    assert wait_until(lambda: value(src.metrics.source_disconnects, "bluesky") == 1, timeout=5)
    proxy.pass_through()
    assert fake.wait_connections(2)
    fake.add(ev(commit(DID, at(1), "create", POST, "after")))
    assert wait_until(lambda: rig.cursor() == at(1), timeout=10)


def test_database_down_during_a_batch_the_rewind_recovers_it(tmp_path: Path, private_pg: PostgresServer,
                                                              fake: JetstreamStandin) -> None:
    private_pg.create_database("lumio")
    rig = Rig(tmp_path, private_pg.url("lumio"))
    try:
        _prime(rig, fake)
        rig.seed_cursor(at(0) - 1)
        fake.add(*[ev(commit(DID, at(i), "create", POST, f"p{i:02}")) for i in range(10)])
        src = rig.source(fake.url, write_timeout_secs=3.0)
        assert wait_until(lambda: rig.cursor() == at(9), timeout=10)
        private_pg.stop()
        fake.add(*[ev(commit(DID, at(i), "create", POST, f"p{i:02}")) for i in range(10, 20)])
        m = src.metrics
        assert wait_until(lambda: value(m.jetstream_batches, "failed") >= 1
                          and value(m.source_connect_failures, "bluesky") >= 1, timeout=15)
        assert len(fake.connections) == 1  # no reconnect without the saved cursor
        private_pg.start()
        assert wait_until(lambda: rig.cursor() == at(19), timeout=20)
        # the failed batch did not move the cursor: the reconnect asked for the old one, rewound
        assert fake.connections[1].cursor == at(9) - 5 * SEC
        table = rig.table()
        assert [r[2] for r in table] == [f"p{i:02}" for i in range(20)]
        assert [r[3] for r in table] == [tid(at(i)) for i in range(20)]
        assert sorted(p["rkey"] for _, p in rig.alerts) == [f"p{i:02}" for i in range(20)]
    finally:
        rig.close()


def test_many_dids_are_sent_in_an_options_update(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str,
                                                   fake: JetstreamStandin) -> None:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    dids = [f"did:plc:{i:024d}" for i in range(1, 301)]
    cfg = make_config(tmp_path, pg_url=pg_server.url(dbname), sections={
        "jetstream": {"url": fake.url, "collections": POST},
        **{f"account.{i}": {"bluesky_did": did} for i, did in enumerate(dids, start=1)}})
    migrate(cfg.timescale)
    pool = Pool(cfg.timescale)
    alerts: list[int] = []
    src = JetstreamSource(cfg.jetstream, cfg.accounts, JetstreamStore(pool), Metrics(),
                          batch_window_secs=0.05,
                          on_post=lambda a, p: alerts.append(a))
    try:
        src.start()
        assert fake.wait_connections(1)
        conn = fake.connections[0]
        assert "requireHello=true" in conn.query and "wantedDids" not in conn.query
        assert conn.hello is not None and conn.wanted_dids == dids and conn.wanted_collections == [POST]
        fake.add(ev(commit(dids[-1], at(1), "create", POST, "p")),
                 ev(commit(STRANGER, at(2), "create", POST, "x")),
                 ev(commit(dids[0], at(3), "create", LIKE, "l")),
                 ev(commit(dids[0], at(4), "create", POST, "q")))
        assert wait_until(lambda: sorted(alerts) == [1, 300], timeout=10)
    finally:
        src.request_stop()
        src.join(5)
        pool.close()
