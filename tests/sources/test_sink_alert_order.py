"""An event's live alert never goes out before its persistence outcome is durable; a rejected
event raises none (`EventSink.persist`, lumio_ingestd/sources/sink.py).

Each case drives cheers through a real `TwitchSource` reading the stand-in
Twitch over a real WebSocket, into real PostgreSQL and Redis, and watches the
alert on both of its paths: a Redis subscriber of `lumio:alerts:{42}` and a
Server-Sent Events client of `GET /v1/accounts/42/alerts/stream`. The
persistence step is blocked for real while the test looks for an alert, so
the order is checked deterministically, not by a race:

- stored: `LOCK TABLE events IN EXCLUSIVE MODE` held in another connection;
  no alert while the insert waits on it; after the release the alert comes,
  and when it arrived (checked in the subscriber) the row was committed.
- parked: the same lock with a short insert bound makes the inline insert
  fail; `CLIENT PAUSE WRITE` holds the park (PUBLISH is paused too, so SSE is
  the path that shows an early alert); no alert until the pause ends, and
  when it arrives the dead-letter list holds the event.
- spooled: the database refusing (the lock) and Redis stopped; the spool's
  append lock held by the test; no alert (SSE) until the append got it, and
  when it arrives the spool holds the event.
- rejected: a CHECK constraint refuses one cheer's external_id; of that cheer
  and a good one sent after it only the good one's alert arrives (alerts are
  FIFO, so the rejected one's would have come first), and
  `events_persist_failures_total{outcome="rejected"}` went up by one.

Every case ends with nothing left held on the event gate and an
exactly-once check: each cheer sent is stored once, or is where the daemon
said it went (parked and spooled ones are then replayed and stored once).
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
import redis

from lumio_ingestd.devkit.standins import twitch_events as te
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.events.alerts import alerts_channel
from lumio_ingestd.events.persist import EventIngest, event_spool_handler
from lumio_ingestd.events.retry import EventRetryWorker
from lumio_ingestd.sources.twitch.sink import TwitchSink
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.spool import Spool
from support import dbname_of
from support.alerts import Reader, open_stream, stream_routes
from support.harness.servers import PostgresServer, RedisServer, wait_until
from support.http_client import serving
from support.twitch import ACCOUNT, TwitchRig, make_rig

#: The negative window: no alert may arrive while persistence is blocked.
QUIET_SECS = 1.0
#: Bound of the waits for something that must happen.
WAIT_SECS = 15.0

#: Run for each alert when it arrived, on the observer's thread: what was durable then.
Probe = Callable[[str], Any]


class _Keep(Exception):
    """Raised by the spool probe's handler so the replay keeps what it read."""


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1, reconnect_grace_secs=5) as f:
        yield f


RigFactory = Callable[[Mapping[str, Mapping[str, object]]], TwitchRig]


@pytest.fixture
def rig_with(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
             fake: TwitchStandin) -> Iterator[RigFactory]:
    """Factory: a `TwitchRig` with these config overrides (`twitch_config(extra=...)`)."""
    rigs: list[TwitchRig] = []

    def make(extra: Mapping[str, Mapping[str, object]]) -> TwitchRig:
        r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake, extra=extra)
        rigs.append(r)
        return r

    yield make
    for r in rigs:
        r.close()


# -- observers ---------------------------------------------------------------------------------


class RedisAlerts:
    """A subscriber of the account's alert channel on its own thread. For each alert it notes
    its external_id (`seen`), runs `probe(external_id)` at once, in the subscriber, and keeps
    what the probe said (`got`)."""

    def __init__(self, url: str, probe: Probe, account: int = ACCOUNT) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.pubsub = self.client.pubsub()
        self.pubsub.subscribe(alerts_channel(account))
        first = self.pubsub.get_message(timeout=5)
        assert first is not None and first["type"] == "subscribe"
        self.probe = probe
        self.seen: list[str] = []
        self.got: list[tuple[str, Any]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="redis-alerts", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self.pubsub.get_message(timeout=0.05)
            if msg is not None and msg["type"] == "message":
                external_id = json.loads(msg["data"])["external_id"]
                self.seen.append(external_id)
                self.got.append((external_id, self.probe(external_id)))

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.pubsub.close()
        self.client.close()


class ProbingReader(Reader):
    """The SSE `Reader`, which also runs `probe(external_id)` on its own thread for each
    alert the moment its message is complete (the stream's "at receipt")."""

    def __init__(self, sock: socket.socket, probe: Probe) -> None:
        self.probe = probe
        self.got: list[tuple[str, Any]] = []
        super().__init__(sock)  # starts the thread: the attributes above come first

    def _run(self) -> None:
        try:
            while chunk := self.sock.recv(65536):
                self.data += chunk
                if not self.data.endswith(b"\n\n"):
                    continue  # a message cut across reads: probe it once it is whole
                for msg in self.messages()[len(self.got):]:
                    external_id = json.loads(msg["data"])["external_id"]
                    self.got.append((external_id, self.probe(external_id)))
        except OSError:
            pass

    def seen(self) -> list[str]:
        """The event ids (SSE `id:`) of the alerts received so far, probed or not."""
        return [msg.get("id", "?") for msg in self.messages()]


class Watch:
    """Both alert paths of account 42, each probing at receipt."""

    def __init__(self, rig: TwitchRig, port: int, probe: Probe, *, redis_url: str | None) -> None:
        self.rig = rig
        self.sse = ProbingReader(open_stream(port, ACCOUNT), probe)
        assert wait_until(lambda: rig.alerts.client_count() == 1, WAIT_SECS)
        self.redis = RedisAlerts(redis_url, probe) if redis_url is not None else None

    def any_alert(self) -> bool:
        return bool(self.sse.messages()) or (self.redis is not None and bool(self.redis.seen))

    def assert_quiet(self, what: str) -> None:
        """The negative window: no alert on either path for QUIET_SECS."""
        assert not wait_until(self.any_alert, QUIET_SECS), (
            f"an alert went out while {what}: SSE event ids {self.sse.seen()}, "
            f"Redis external ids {self.redis.seen if self.redis else 'not watched'}")

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()
        self.sse.close()


# -- helpers ---------------------------------------------------------------------------------


def start_source(rig: TwitchRig, fake: TwitchStandin) -> None:
    rig.source().start()
    session = fake.wait_session(1)
    assert fake.wait_for(lambda: "channel.cheer" in session.subscriptions, WAIT_SECS)


def cheer(fake: TwitchStandin, message_id: str, user: str = "1234") -> str:
    """Send a cheer; its metadata message_id becomes the event's external_id."""
    return fake.notify("channel.cheer", te.cheer_event(user, 100), message_id=message_id)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def lock_events(pg_url: str) -> psycopg2.extensions.connection:
    """Another connection holding `LOCK TABLE events IN EXCLUSIVE MODE` (reads pass, inserts
    wait) until it is rolled back."""
    conn = psycopg2.connect(pg_url, connect_timeout=5)
    with conn.cursor() as cur:
        cur.execute("LOCK TABLE events IN EXCLUSIVE MODE")
    return conn


def sql(rig: TwitchRig, statement: str) -> None:
    conn = psycopg2.connect(rig.pg_url, connect_timeout=5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


def an_insert_waits_on_events(rig: TwitchRig) -> bool:
    waiting: int = rig.rows("SELECT count(*) FROM pg_locks WHERE NOT granted "
                            "AND relation = 'events'::regclass")[0][0]
    return waiting >= 1


def end_cut_inserts(rig: TwitchRig, blocker: psycopg2.extensions.connection) -> None:
    """End the server backends of inserts the deadline cut, while `blocker` still holds the lock.

    The deadline cuts the client's socket only (db/deadline.py): the backend of a cut insert
    keeps waiting on the lock and commits the row once the lock is released, so the event
    would end up parked (or spooled) and stored as well (a replay then counts it recovered).
    Ended while the lock is held, it never got past the lock: what the exactly-once check
    then counts is what the daemon reported."""
    with blocker.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE NOT granted "
                    "AND relation = 'events'::regclass")
    assert wait_until(lambda: not an_insert_waits_on_events(rig), WAIT_SECS)


def committed(rig: TwitchRig) -> Probe:
    """Probe: how many rows of this external_id are committed (as another session sees them)."""
    return lambda ext: rig.rows("SELECT count(*) FROM events WHERE external_id = %s", (ext,))[0][0]


def parked_ids(client: redis.Redis, account: int = ACCOUNT) -> list[str]:
    """external_ids in the account's dead-letter list, in order."""
    return [json.loads(e)["external_id"]
            for e in client.lrange(rediskeys.events_deadletter(account), 0, -1)]


def failures(rig: TwitchRig) -> dict[str, float]:
    return {o: rig.value("events_persist_failures_total", outcome=o)
            for o in ("parked", "rejected", "lost")}


def inserts_tried(rig: TwitchRig) -> float:
    return rig.value("events_insert_duration_seconds_count")


def warm(rig: TwitchRig) -> None:
    """Leave an idle connection in the pool. With an insert bound under libpq's 2 s connect
    timeout the pool never opens one for an insert (too little time left), so without it the
    insert would fail before it reached the table."""
    with rig.pool.connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT 1")


def replay_parked(rig: TwitchRig) -> None:
    """One pass of the retry worker over the dead-letter lists (stores what is parked)."""
    warm(rig)
    worker = EventRetryWorker(rig.redis, rig.pool, rig.metrics, rig.cfg, instance="replayer-1",
                              lease_ttl_secs=5, heartbeat_ttl_secs=5)
    try:
        report = worker.run_pass()
        assert report.leader and report.stopped is None, report
    finally:
        worker.lease.release()


def gate_released(rig: TwitchRig) -> None:
    # The alert thread releases its hold after the PUBLISH was answered, so after the
    # subscriber saw it: wait for it rather than read it once.
    assert wait_until(lambda: rig.alerts.gate.holds == 0, WAIT_SECS), rig.alerts.gate.holds


# -- the cases ---------------------------------------------------------------------------------


def test_a_stored_events_alert_waits_for_its_commit(rig_with: RigFactory, fake: TwitchStandin,
                                                   redis_url: str) -> None:
    # The insert must outwait the lock: bounds far above the time the test holds it.
    rig = rig_with({"events": {"insert_timeout_secs": 30},
                    "timescale": {"statement_timeout_secs": 30}})
    start_source(rig, fake)
    with serving(stream_routes(rig, rig.cfg.http.emit_token), rig.metrics) as port:
        watch = Watch(rig, port, committed(rig), redis_url=redis_url)
        try:
            blocker = lock_events(rig.pg_url)
            try:
                ext = cheer(fake, new_id("cheer-stored"))
                assert wait_until(lambda: an_insert_waits_on_events(rig), WAIT_SECS)
                assert rig.alerts.gate.holds == 1  # the event is on its way: the sink holds it
                watch.assert_quiet("the insert waited on the lock")
                assert committed(rig)(ext) == 0
            finally:
                blocker.rollback()
                blocker.close()
            assert wait_until(lambda: watch.sse.got and watch.redis and watch.redis.got, WAIT_SECS)
            # When each path got the alert, the row was already committed.
            assert watch.sse.got == [(ext, 1)]
            assert watch.redis is not None and watch.redis.got == [(ext, 1)]
        finally:
            watch.close()
    gate_released(rig)
    # Exactly once: stored once, inline; nothing parked.
    assert rig.event_ids() == Counter({ext: 1})
    assert rig.value("events_persisted_total", path="inline") == 1
    assert failures(rig) == {"parked": 0, "rejected": 0, "lost": 0}
    assert parked_ids(rig.redis) == []


def test_a_rejected_event_raises_no_alert(rig_with: RigFactory, fake: TwitchStandin,
                                         redis_url: str) -> None:
    rig = rig_with({})
    refused, good = new_id("cheer-refused"), new_id("cheer-good")
    # A real CHECK constraint: SQLSTATE 23514, a permanent error -> "rejected".
    sql(rig, f"ALTER TABLE events ADD CONSTRAINT no_refused_cheer CHECK (external_id <> '{refused}')")
    start_source(rig, fake)
    before = failures(rig)
    with serving(stream_routes(rig, rig.cfg.http.emit_token), rig.metrics) as port:
        watch = Watch(rig, port, committed(rig), redis_url=redis_url)
        try:
            assert cheer(fake, refused, user="666") == refused
            assert cheer(fake, good, user="777") == good
            assert wait_until(lambda: watch.sse.got and watch.redis and watch.redis.got, WAIT_SECS)
            # The refused cheer went first on the same socket and alerts keep their order: had
            # it raised an alert, that alert would be here, before the good one's.
            assert watch.sse.got == [(good, 1)]
            assert watch.redis is not None and watch.redis.got == [(good, 1)]
        finally:
            watch.close()
    gate_released(rig)
    after = failures(rig)
    assert after["rejected"] == before["rejected"] + 1
    assert (after["parked"], after["lost"]) == (before["parked"], before["lost"])
    # Exactly once: the good one stored once; the refused one nowhere (rejected keeps nothing).
    assert rig.event_ids() == Counter({good: 1})
    assert list(rig.redis.scan_iter(match="lumio:events:*")) == []


def test_a_parked_events_alert_waits_for_the_park(rig_with: RigFactory, fake: TwitchStandin,
                                                 redis_url: str) -> None:
    # The inline insert is cut fast (it waits on the lock, bounded to 0.5 s); the park then
    # waits on CLIENT PAUSE, which the Redis client must outwait (a socket timeout longer than
    # the test holds the pause, or the park would fail and the event be lost: no spool here).
    rig = rig_with({"events": {"insert_timeout_secs": 0.5},
                    "redis": {"socket_timeout_secs": 60}})
    probe_client = redis.Redis.from_url(redis_url, socket_timeout=5)
    admin = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        _parked_case(rig, fake, redis_url, probe_client, admin)
    finally:
        probe_client.close()
        admin.close()


def _parked_case(rig: TwitchRig, fake: TwitchStandin, redis_url: str, probe_client: redis.Redis,
                 admin: redis.Redis) -> None:
    start_source(rig, fake)
    warm(rig)
    with serving(stream_routes(rig, rig.cfg.http.emit_token), rig.metrics) as port:
        # Probe: is the event in the dead-letter list (a read: answered during the pause).
        watch = Watch(rig, port, lambda ext: parked_ids(probe_client).count(ext), redis_url=redis_url)
        blocker = lock_events(rig.pg_url)
        try:
            admin.client_pause(60_000, all=False)  # CLIENT PAUSE 60000 WRITE
            try:
                tried = inserts_tried(rig)
                ext = cheer(fake, new_id("cheer-parked"))
                assert wait_until(lambda: inserts_tried(rig) > tried, WAIT_SECS)  # cut at its bound
                # Now at the park, which the pause holds (its MULTI/EXEC is a write).
                watch.assert_quiet("the park was paused")
                assert failures(rig)["parked"] == 0 and parked_ids(probe_client) == []
                assert rig.alerts.gate.holds == 1
            finally:
                admin.client_unpause()
            assert wait_until(lambda: watch.sse.got and watch.redis and watch.redis.got, WAIT_SECS)
            # When each path got the alert, the dead-letter list held the event.
            assert watch.sse.got == [(ext, 1)]
            assert watch.redis is not None and watch.redis.got == [(ext, 1)]
            end_cut_inserts(rig, blocker)
        finally:
            admin.client_unpause()
            blocker.rollback()
            blocker.close()
            watch.close()
    gate_released(rig)
    # Exactly once: parked once (counted so), not stored; the replay then stores it once.
    assert parked_ids(probe_client) == [ext]
    assert failures(rig) == {"parked": 1, "rejected": 0, "lost": 0}
    assert rig.event_ids() == Counter()
    replay_parked(rig)
    assert rig.event_ids() == Counter({ext: 1})
    assert rig.value("events_persisted_total", path="replay") == 1
    assert parked_ids(probe_client) == []


def test_a_spooled_events_alert_waits_for_the_spool(rig_with: RigFactory, fake: TwitchStandin,
                                                   redis_server: RedisServer, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    # The rig has no spool: its sink is replaced, before the source is built, by one over an
    # EventIngest with a real spool; everything else (source, alerts, sessions) is the rig's.
    rig = rig_with({"events": {"insert_timeout_secs": 0.5}})
    spool = Spool(tmp_path / "spool", 1 << 20, rig.metrics)
    spool.open()
    try:
        _spooled_case(rig, fake, redis_server, spool, caplog)
    finally:
        spool.close()


def _spooled_case(rig: TwitchRig, fake: TwitchStandin, redis_server: RedisServer, spool: Spool,
                  caplog: pytest.LogCaptureFixture) -> None:
    ingest = EventIngest(rig.redis, rig.pool, spool, rig.metrics, rig.cfg)
    rig.sink = TwitchSink(ingest.persist_event, rig.metrics, alerts=rig.alerts, sessions=rig.sessions)
    start_source(rig, fake)
    warm(rig)

    def spooled(ext: str) -> int:
        """Probe: how many spool records hold this event (read without taking them)."""
        held: list[str] = []

        def peek(kind: str, entries: list[bytes]) -> None:
            held.extend(json.loads(e)["external_id"] for e in entries)
            raise _Keep  # the handler refuses: the records stay in the spool

        try:
            spool.replay(peek)
        except _Keep:
            pass
        return held.count(ext)

    with serving(stream_routes(rig, rig.cfg.http.emit_token), rig.metrics) as port:
        # Redis is stopped below: only the SSE path can show an alert.
        watch = Watch(rig, port, spooled, redis_url=None)
        blocker = lock_events(rig.pg_url)
        try:
            redis_server.stop()
            # The spool's own append lock, taken here: a real lock, the one a concurrent
            # append would wait on. The append (and so the alert after it) waits for it.
            spool_lock: threading.Lock = spool._lock
            with spool_lock:
                ext = cheer(fake, new_id("cheer-spooled"))
                # Insert cut at its bound, then the park refused by the stopped Redis: at the spool.
                assert wait_until(lambda: any("Redis refused the park" in r.getMessage()
                                              for r in caplog.records), WAIT_SECS)
                watch.assert_quiet("the spool append waited on its lock")
                assert rig.alerts.gate.holds == 1
                assert failures(rig)["parked"] == 0  # "spooled" counts as parked once appended
            assert wait_until(lambda: watch.sse.got, WAIT_SECS)
            # When the stream got the alert, the spool held the event.
            assert watch.sse.got == [(ext, 1)]
            end_cut_inserts(rig, blocker)
        finally:
            blocker.rollback()
            blocker.close()
            redis_server.ensure_running()
            watch.close()
    gate_released(rig)
    # Exactly once: in the spool once (counted parked: the local tier), nowhere else.
    assert spooled(ext) == 1
    assert rig.value("spool_records_total", kind="event", op="written") == 1
    assert failures(rig) == {"parked": 1, "rejected": 0, "lost": 0}
    assert rig.event_ids() == Counter()
    # Replayed the daemon's way: spool -> dead-letter list -> stored once.
    assert spool.replay(event_spool_handler(ingest)) == 1
    replay_parked(rig)
    assert rig.event_ids() == Counter({ext: 1})
    assert rig.value("events_persisted_total", path="replay") == 1
    assert spool.pending_bytes() == 0
