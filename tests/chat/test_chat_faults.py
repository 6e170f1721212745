"""The chat rows of the fault table, each fault real, each ending with the exactly-once oracle.

database down / slow / out of connections -> messages stay in Redis, dead-lettered
after max_flush_failures; database back -> buffers flush and dead letters replay;
Redis refusing writes -> direct insert; both down -> spooled, replayed when either
is back; the spool full too -> counted lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.chat.ingest import ChatQueue, ReplayDeferred, chat_spool_handler
from lumio_ingestd.model import ChatMessage
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.chat import (
    ChatRig,
    assert_exactly_once,
    counter_value,
    make_messages,
    make_rig,
)
from support.harness.servers import PostgresServer, RedisServer, wait_until


def _ids(msgs: list[ChatMessage]) -> list[str]:
    return [m.message_id for m in msgs]


@pytest.fixture
def private_rig(tmp_path: Path, private_pg: PostgresServer, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, private_pg.url("postgres"), private_pg.dsn("postgres"), redis_url)
    yield r
    r.close()


def test_database_down_then_back(private_rig: ChatRig, private_pg: PostgresServer) -> None:
    rig = private_rig
    ingest = rig.ingest()
    sent = make_messages(250, account=7) + make_messages(50, account=8)
    assert ingest.persist_batch(sent) == {"buffered": 300}

    private_pg.stop()
    flusher = rig.flusher()
    failures = rig.cfg.chat.max_flush_failures
    for _ in range(failures):
        flusher.tick()
    late = make_messages(40, account=7)  # chat keeps arriving while the database is down
    assert ingest.persist_batch(late) == {"buffered": 40}
    sent += late

    # Each account's batch failed `failures` passes in a row and moved to its dead-letter list.
    client = rig.oracle_redis()
    assert client.llen(rediskeys.chat_deadletter(7)) == 100
    assert client.llen(rediskeys.chat_deadletter(8)) == 50
    ttl = client.ttl(rediskeys.chat_deadletter(7))
    assert 71 * 3600 < ttl <= 72 * 3600
    assert client.llen(rediskeys.chat_buffer(7)) == 190
    assert not client.exists(rediskeys.chat_buffer(8))
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "failed"}) == 2 * failures
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "deadlettered"}) == 2
    assert counter_value(rig.metrics, "chat_dead_letter_depth") == 150

    # Database back: the flusher empties the buffers, the drain replays the dead
    # letters within its interval plus one flush.
    private_pg.start()
    drain = rig.drain()
    flusher.start()
    drain.start()
    within = rig.cfg.chat.deadletter_drain_interval_secs + rig.cfg.chat.flush_interval_secs
    assert wait_until(lambda: len(rig.stored()) == len(sent), timeout=within + 10)
    assert_exactly_once(rig.stored(), _ids(sent))
    assert wait_until(lambda: rig.chat_keys() == [], timeout=5), rig.chat_keys()
    assert counter_value(rig.metrics, "chat_dead_letters_replayed_total") == 150
    assert wait_until(lambda: counter_value(rig.metrics, "chat_dead_letter_depth") == 0, timeout=5)


def test_database_slow_statement_timeout(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   timescale={"statement_timeout_secs": 1})
    try:
        sent = make_messages(120)
        assert rig.ingest().persist_batch(sent) == {"buffered": 120}
        flusher = rig.flusher()
        with rig.db() as locker, locker.cursor() as cur:
            cur.execute("BEGIN; LOCK TABLE chat_messages IN ACCESS EXCLUSIVE MODE")
            flusher.tick()  # the insert waits for the lock until statement_timeout: 57014
            cur.execute("ROLLBACK")
        assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "failed"}) == 1
        assert rig.stored() == {}
        assert flusher.consecutive_failures == {7: 1}
        flusher.tick()
        assert_exactly_once(rig.stored(), _ids(sent))
        assert rig.chat_keys() == []
        assert flusher.consecutive_failures == {}
    finally:
        rig.close()


def test_database_out_of_connections_pool_exhausted(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   timescale={"pool_size": 2, "acquire_timeout_secs": 0.3})
    held = threading.Barrier(3, timeout=10)
    release = threading.Event()

    def hold() -> None:
        with rig.pool.connection():
            held.wait()
            release.wait(10)

    holders = [threading.Thread(target=hold, name=f"holder-{i}") for i in range(2)]
    try:
        for t in holders:
            t.start()
        held.wait()
        sent = make_messages(80)
        ingest = rig.ingest()
        assert ingest.persist_batch(sent) == {"buffered": 80}
        flusher = rig.flusher()
        flusher.tick()
        assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "failed"}) == 1
        release.set()
        for t in holders:
            t.join(10)
        flusher.tick()
        assert_exactly_once(rig.stored(), _ids(sent))
        assert rig.chat_keys() == []
    finally:
        release.set()
        rig.close()


def test_database_out_of_connections_max_connections(tmp_path: Path, redis_url: str) -> None:
    server = PostgresServer(tmp_path / "pg_small",
                            settings={"max_connections": "4", "superuser_reserved_connections": "0"})
    server.start()
    hogs: list[psycopg2.extensions.connection] = []
    try:
        rig = make_rig(tmp_path, server.url("postgres"), server.dsn("postgres"), redis_url,
                       timescale={"pool_size": 1})
        sent = make_messages(60)
        assert rig.ingest().persist_batch(sent) == {"buffered": 60}
        rig.pool.close()  # no idle connection: the flusher must open a new one
        from lumio_ingestd.db.pool import Pool

        rig.pool = Pool(rig.cfg.timescale)
        while True:  # take every slot the server has: "sorry, too many clients already"
            try:
                hogs.append(server.connect())
            except psycopg2.OperationalError:
                break
        assert len(hogs) >= 1
        flusher = rig.flusher()
        flusher.tick()
        assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "failed"}) == 1
        for conn in hogs:
            conn.close()
        hogs.clear()
        wait_until(lambda: _can_connect(server), timeout=5)
        flusher.tick()
        assert_exactly_once(rig.stored(), _ids(sent))
        rig.close()
    finally:
        for conn in hogs:
            conn.close()
        server.close()


def _can_connect(server: PostgresServer) -> bool:
    try:
        server.connect().close()
    except psycopg2.OperationalError:
        return False
    return True


def test_redis_refusing_writes_takes_the_direct_path(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, private_redis: RedisServer) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, private_redis.url)
    try:
        admin = private_redis.client()
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")  # every write now fails with OOM
        ingest = rig.ingest(retry_after_secs=0.0)
        queue = ChatQueue(ingest, rig.metrics, max_batch=50)
        sent = make_messages(175, account=7) + make_messages(25, account=9)
        for msg in sent:
            queue.add(msg)
        queue.drain()
        assert queue.totals == {"direct": 200}
        assert counter_value(rig.metrics, "chat_messages_total", {"path": "direct"}) == 200
        assert_exactly_once(rig.stored(), _ids(sent))

        admin.config_set("maxmemory", "0")  # writes accepted again: back to the buffer
        more = make_messages(30)
        assert ingest.persist_batch(more) == {"buffered": 30}
        rig.flusher().tick()
        assert_exactly_once(rig.stored(), _ids(sent + more))
        admin.close()
    finally:
        rig.close()


@pytest.mark.parametrize("first_back", ["redis", "database"])
def test_both_down_spooled_then_replayed(
        tmp_path: Path, private_pg: PostgresServer, private_redis: RedisServer, first_back: str) -> None:
    rig = make_rig(tmp_path, private_pg.url("postgres"), private_pg.dsn("postgres"), private_redis.url)
    try:
        spool = rig.spool()
        ingest = rig.ingest(spool, retry_after_secs=0.0)
        handler = chat_spool_handler(ingest)
        private_redis.stop()
        private_pg.stop()

        sent = make_messages(140, account=7) + make_messages(60, account=8)
        queue = ChatQueue(ingest, rig.metrics, max_batch=40)
        for msg in sent:
            queue.add(msg)
        queue.drain()
        assert queue.totals == {"spooled": 200}
        assert counter_value(rig.metrics, "chat_messages_total", {"path": "spooled"}) == 200
        # While both are down a replay fails and keeps everything.
        with pytest.raises(ReplayDeferred):
            spool.replay(handler)
        assert spool.pending_bytes() > 0

        if first_back == "redis":
            private_redis.start()
            while spool.replay(handler):
                pass
            assert spool.pending_bytes() == 0
            client = rig.oracle_redis()
            assert client.llen(rediskeys.chat_buffer(7)) == 140
            private_pg.start()
            rig.flusher().tick()
        else:
            private_pg.start()
            while spool.replay(handler):
                pass
            assert spool.pending_bytes() == 0
            private_redis.start()
        assert_exactly_once(rig.stored(), _ids(sent))
        assert rig.chat_keys() == []
        assert counter_value(rig.metrics, "chat_messages_total", {"path": "lost"}) == 0
    finally:
        rig.close()


def test_both_down_and_spool_full_is_counted_lost(
        tmp_path: Path, private_pg: PostgresServer, private_redis: RedisServer,
        caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(tmp_path, private_pg.url("postgres"), private_pg.dsn("postgres"), private_redis.url)
    try:
        spool = rig.spool(max_bytes=20_000)
        ingest = rig.ingest(spool, retry_after_secs=0.0)
        private_redis.stop()
        private_pg.stop()
        sent = make_messages(120)
        counts = {"spooled": 0, "lost": 0}
        lost: list[str] = []
        for i in range(0, 120, 10):
            batch = sent[i:i + 10]
            got = ingest.persist_batch(batch)
            assert sum(got.values()) == 10 and len(got) == 1
            path = next(iter(got))
            counts[path] += 10
            if path == "lost":
                lost += _ids(batch)
        assert counts["spooled"] > 0 and counts["lost"] > 0
        assert counter_value(rig.metrics, "chat_messages_total", {"path": "lost"}) == counts["lost"]
        assert any(r.levelno == logging.ERROR and "LOST" in r.getMessage() for r in caplog.records)
        assert not any("tab\there" in r.getMessage() for r in caplog.records)  # no chat text logged

        private_pg.start()
        while spool.replay(chat_spool_handler(ingest)):
            pass
        assert_exactly_once(rig.stored(), _ids(sent), lost=lost)
    finally:
        rig.close()
