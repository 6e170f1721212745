"""The flusher and the drain under the conditions around them: shards, other
instances, lost leases, Redis going away, a database failing mid-drain."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from lumio_ingestd.chat.flusher import ChatFlusher
from lumio_ingestd.chat.ingest import chat_spool_handler
from lumio_ingestd.model import ChatMessage
from lumio_ingestd.stores import rediskeys
from support import dbname_of, make_config
from support.chat import (
    ChatRig,
    assert_exactly_once,
    counter_value,
    make_messages,
    make_rig,
)
from support.harness.servers import PostgresServer, RedisServer


def _ids(msgs: list[ChatMessage]) -> list[str]:
    return [m.message_id for m in msgs]


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    yield r
    r.close()


def test_flusher_keeps_to_its_shard_and_recovers_only_dead_instances(
        tmp_path: Path, rig: ChatRig) -> None:
    (tmp_path / "shard").mkdir()
    cfg = make_config(tmp_path / "shard", pg_url=rig.cfg.timescale.dsn, redis_url=rig.redis_url,
                      sections={"daemon": {"instance_id": "me", "shard": "1/2",
                                           "state_dir": tmp_path / "state"},
                                "chat": {"flush_batch_size": 100}})
    client = rig.oracle_redis()
    mine, other = make_messages(40, account=7), make_messages(40, account=8)
    orphan, alive = make_messages(10, account=7), make_messages(10, account=9)
    rig.ingest().persist_batch(mine + other)
    client.rpush(rediskeys.chat_inflight(7, "gone"), *[m.to_entry() for m in orphan])
    client.rpush(rediskeys.chat_inflight(9, "alive"), *[m.to_entry() for m in alive])
    client.set(rediskeys.instance_heartbeat("alive"), b"1", ex=60)

    flusher = ChatFlusher(rig.client, rig.pool, rig.metrics, cfg)
    flusher.tick()

    # 7 and 9 are odd (shard 1 of 2); 8 belongs to the other replica.
    assert_exactly_once(rig.stored(), _ids(mine + orphan))
    assert client.llen(rediskeys.chat_buffer(8)) == 40
    assert client.llen(rediskeys.chat_inflight(9, "alive")) == 10  # its owner is alive
    assert counter_value(rig.metrics, "chat_buffer_depth") == 10  # shard 1's lists only


def test_flusher_survives_redis_going_away(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str,
                                           private_redis: RedisServer,
                                           caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, private_redis.url)
    try:
        flusher = rig.flusher()
        private_redis.stop()
        with caplog.at_level(logging.INFO, logger="lumio_ingestd.chat"):
            for _ in range(3):
                flusher.tick()  # never raises
            private_redis.start()
            sent = make_messages(30)
            assert rig.ingest().persist_batch(sent) == {"buffered": 30}
            flusher.tick()
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "Redis (chat flush) unavailable" in warnings[0].getMessage()
        assert any("available again" in r.getMessage() for r in caplog.records)
        assert_exactly_once(rig.stored(), _ids(sent))
    finally:
        rig.close()


def test_drain_does_nothing_without_the_lease(rig: ChatRig) -> None:
    client = rig.oracle_redis()
    sent = make_messages(20)
    client.rpush(rediskeys.chat_deadletter(7), *[m.to_entry() for m in sent])
    client.set(rediskeys.CHAT_DRAIN_LEADER, b"another-replica", px=60_000)
    rig.drain().tick()
    assert rig.stored() == {}
    assert client.llen(rediskeys.chat_deadletter(7)) == 20
    client.delete(rediskeys.CHAT_DRAIN_LEADER)
    drain = rig.drain()
    drain.tick()
    assert_exactly_once(rig.stored(), _ids(sent))
    drain.final()
    assert not client.exists(rediskeys.CHAT_DRAIN_LEADER)  # released on the way out


def test_drain_stops_at_once_when_the_lease_is_taken_over(rig: ChatRig) -> None:
    client = rig.oracle_redis()
    first, second = make_messages(250, account=7), make_messages(50, account=8)
    client.rpush(rediskeys.chat_deadletter(7), *[m.to_entry() for m in first])
    client.rpush(rediskeys.chat_deadletter(8), *[m.to_entry() for m in second])

    def steal(step: str) -> None:
        if step == "chat.drain.deleted":
            client.set(rediskeys.CHAT_DRAIN_LEADER, b"new-leader", px=60_000)

    rig.drain(failpoint=steal).tick()
    # One batch was done when the lease went; nothing after it.
    assert len(rig.stored()) == 100
    assert client.llen(rediskeys.chat_deadletter(7)) == 150
    assert client.llen(rediskeys.chat_deadletter(8)) == 50
    assert [k for k in rig.chat_keys() if "inflight" in k] == []
    client.delete(rediskeys.CHAT_DRAIN_LEADER)
    rig.drain(instance="next").tick()
    assert_exactly_once(rig.stored(), _ids(first + second))
    assert counter_value(rig.metrics, "chat_dead_letters_replayed_total") == 300


def test_drain_puts_the_batch_back_and_ends_the_pass_on_a_database_failure(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   timescale={"pool_size": 1, "acquire_timeout_secs": 0.3})
    client = rig.oracle_redis()
    try:
        first, second = make_messages(120, account=7), make_messages(30, account=8)
        client.rpush(rediskeys.chat_deadletter(7), *[m.to_entry() for m in first])
        client.rpush(rediskeys.chat_deadletter(8), *[m.to_entry() for m in second])
        client.expire(rediskeys.chat_deadletter(7), 3600)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with rig.pool.connection():
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold, name="holder")
        holder.start()
        assert held.wait(10)
        drain = rig.drain()
        drain.tick()  # no connection within acquire_timeout: a transient failure
        release.set()
        holder.join(10)

        assert rig.stored() == {}
        assert client.llen(rediskeys.chat_deadletter(7)) == 120  # the batch is back
        assert 3500 < client.ttl(rediskeys.chat_deadletter(7)) <= 3600  # its TTL kept
        assert client.llen(rediskeys.chat_deadletter(8)) == 30  # the pass ended: not even tried
        assert [k for k in rig.chat_keys() if "inflight" in k] == []
        drain.tick()
        assert_exactly_once(rig.stored(), _ids(first + second))
    finally:
        rig.close()


def test_spool_handler_refuses_other_kinds(rig: ChatRig) -> None:
    with pytest.raises(ValueError):
        chat_spool_handler(rig.ingest())("event", [b"{}"])


def test_direct_path_keeps_a_refused_row_until_it_can_be_quarantined(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, private_redis: RedisServer) -> None:
    """Redis down: the direct insert stores the good rows and isolates the one the
    database refuses; with no quarantine reachable it is spooled, and once Redis is
    back it travels buffer -> flusher -> quarantine."""
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, private_redis.url)
    try:
        good = make_messages(30)
        bad = replace(good[0], message_id="too-big", account_id=2**70)
        spool = rig.spool()
        ingest = rig.ingest(spool, retry_after_secs=0.0)
        private_redis.stop()
        assert ingest.persist_batch([*good[:10], bad, *good[10:]]) == {"direct": 30, "spooled": 1}
        private_redis.start()
        assert spool.replay(chat_spool_handler(ingest)) == 1
        rig.flusher().tick()
        quarantined = rig.quarantined(2**70)
        assert [(q["message_id"], q["sqlstate"]) for q in quarantined] == [("too-big", "22003")]
        assert_exactly_once(rig.stored(), _ids([*good, bad]), quarantined=["too-big"])
    finally:
        rig.close()


def test_drain_pass_budget_continues_at_once(rig: ChatRig) -> None:
    client = rig.oracle_redis()
    sent = make_messages(250)
    client.rpush(rediskeys.chat_deadletter(7), *[m.to_entry() for m in sent])
    drain = rig.drain(pass_budget_secs=0.0)
    assert drain.run_once() == 0.0  # budget spent before the first batch: go on at once
    assert rig.stored() == {}
    drain.pass_budget_secs = 60.0
    assert drain.run_once() == drain.interval_secs
    assert_exactly_once(rig.stored(), _ids(sent))


def test_a_drain_that_lost_the_lease_hands_back_its_stranded_inflight(rig: ChatRig) -> None:
    """A drain pass that failed between claim and finish leaves its `.dl` list; the flusher's
    orphan recovery skips it while this instance's heartbeat lives, so the drain itself must
    hand it back when another replica leads."""
    client = rig.oracle_redis()
    sent = make_messages(15, account=9)
    drain = rig.drain()
    stranded = rediskeys.chat_inflight(9, drain.owner)
    client.rpush(stranded, *[m.to_entry() for m in sent])
    client.set(rediskeys.CHAT_DRAIN_LEADER, b"another-replica", px=60_000)
    drain.tick()
    assert client.llen(stranded) == 0
    assert client.llen(rediskeys.chat_deadletter(9)) == 15
    assert client.pttl(rediskeys.chat_deadletter(9)) > 0  # a dead-letter list keeps its TTL
    client.delete(rediskeys.CHAT_DRAIN_LEADER)
    rig.drain(instance="leader").tick()
    assert_exactly_once(rig.stored(), _ids(sent))
