"""Several chat flush threads in one process (`[chat] flush_workers`), against real servers.

Each thread ("lane") claims into its own in-flight list per account, so two
of them hold batches of the same account at once; what a lane leaves in flight
is resumed by that lane, put back by lane 0 when no thread of the process runs
that lane any more, and left alone by other replicas while the instance lives.
Every test ends with the exactly-once check.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.chat.flusher import flush_lanes
from lumio_ingestd.chat.lists import ChatLists, lane_owner, owner_instance, owner_lane
from lumio_ingestd.cluster.instances import Heartbeat
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.chat import ChatRig, assert_exactly_once, make_messages, make_rig
from support.harness.servers import PostgresServer, wait_until

ACCOUNT = 7


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   chat={"flush_batch_size": 100, "flush_workers": 2})
    try:
        yield rig
    finally:
        rig.close()


def park_in_flight(rig: ChatRig, owner: str, n: int, *, token: str) -> list[str]:
    """`n` messages claimed into `owner`'s in-flight list of ACCOUNT by a process with
    claim token `token` that then vanished (what a killed process leaves)."""
    msgs = make_messages(n, account=ACCOUNT)
    assert sum(rig.ingest().persist_batch(msgs).values()) == n
    entries, resumed = ChatLists(rig.client, token).claim(
        rediskeys.chat_buffer(ACCOUNT), rediskeys.chat_inflight(ACCOUNT, owner), n)
    assert (len(entries), resumed) == (n, False)
    return [m.message_id for m in msgs]


def test_owner_ids_name_their_instance_and_lane() -> None:
    assert [lane_owner("web-1", n) for n in (0, 1, 15)] == ["web-1", "web-1.f1", "web-1.f15"]
    assert [owner_instance(o) for o in ("web-1", "web-1.f1", "web-1.f15", "web-1.dl")] == ["web-1"] * 4
    assert [owner_lane(o) for o in ("web-1", "web-1.f1", "web-1.f15", "web-1.dl")] == [0, 1, 15, None]
    # Not lane suffixes: an instance id may end in ".f" or ".f0" (config.py refuses only .fN).
    assert owner_instance("web.f0") == "web.f0" and owner_lane("web.f") == 0


@pytest.mark.parametrize(("workers", "pool", "lanes"), [(2, 5, 2), (2, 3, 2), (2, 2, 1), (1, 1, 1),
                                                        (4, 3, 2), (16, 5, 4)])
def test_the_pool_keeps_one_connection_for_everything_else(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        workers: int, pool: int, lanes: int) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   chat={"flush_workers": workers}, timescale={"pool_size": pool})
    try:
        assert flush_lanes(rig.cfg) == lanes
        threads = rig.flush_threads()
        assert [t.name for t in threads] == ["chat-flush"] + [f"chat-flush-{n}" for n in range(1, lanes)]
        assert [t.owner for t in threads] == [lane_owner("test-1", n) for n in range(lanes)]
        assert {t.role for t in threads} == {"chat-flush"}  # one metric label for all of them
    finally:
        rig.close()


def test_two_lanes_hold_batches_of_one_account_at_once_and_store_each_message_once(
        rig: ChatRig) -> None:
    msgs = make_messages(1000, account=ACCOUNT)
    assert sum(rig.ingest().persist_batch(msgs).values()) == 1000
    inflight_then: list[list[str]] = []
    oracle = rig.oracle_redis()
    # The action runs once both lanes hold a batch, before either may go on.
    both_claimed = threading.Barrier(
        2, timeout=10, action=lambda: inflight_then.append(
            sorted(str(k, "utf-8") if isinstance(k, bytes) else k
                   for k in oracle.keys("lumio:chat:inflight:*"))))
    met: dict[str, int] = {}

    def failpoint(step: str) -> None:
        # Each lane's first claimed batch waits for the other lane's: only two
        # threads claiming side by side get past this (one would time out).
        name = threading.current_thread().name
        if step != "chat.flush.claimed" or name in met:
            return
        met[name] = len(met)
        both_claimed.wait()

    threads = rig.flush_threads(failpoint=failpoint)
    assert len(threads) == 2
    for t in threads:
        t.start()
    assert wait_until(lambda: len(rig.stored()) == 1000, timeout=30)
    assert sorted(met) == ["chat-flush", "chat-flush-1"]
    assert inflight_then == [[rediskeys.chat_inflight(ACCOUNT, "test-1"),
                              rediskeys.chat_inflight(ACCOUNT, "test-1.f1")]]
    assert_exactly_once(rig.stored(), [m.message_id for m in msgs])


def test_a_lane_this_process_no_longer_runs_is_put_back_and_stored_once(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    # The previous process ran two lanes and was killed holding a batch in lane 1;
    # this one runs one lane (flush_workers lowered): lane 0 returns it to the buffer.
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url,
                   chat={"flush_batch_size": 100, "flush_workers": 1})
    try:
        sent = park_in_flight(rig, "test-1.f1", 60, token="host-gone|1|aaaa")
        [lane0] = rig.flush_threads()
        lane0.tick()
        assert rig.oracle_redis().exists(rediskeys.chat_inflight(ACCOUNT, "test-1.f1")) == 0
        lane0.tick()
        assert_exactly_once(rig.stored(), sent)
    finally:
        rig.close()


def test_a_lane_this_process_runs_resumes_its_own_batch(rig: ChatRig) -> None:
    sent = park_in_flight(rig, "test-1.f1", 60, token="host-gone|1|bbbb")
    lane0, lane1 = rig.flush_threads()
    lane0.tick()  # not lane 0's to put back: lane 1 exists and resumes it
    assert rig.oracle_redis().llen(rediskeys.chat_inflight(ACCOUNT, "test-1.f1")) == 60
    assert rig.stored() == {}
    lane1.tick()
    assert rig.oracle_redis().exists(rediskeys.chat_inflight(ACCOUNT, "test-1.f1")) == 0
    assert_exactly_once(rig.stored(), sent)


def test_another_replica_leaves_a_live_instances_lane_alone_and_recovers_it_once_dead(
        rig: ChatRig) -> None:
    sent = park_in_flight(rig, "replica-a.f1", 40, token="host-a|1|cccc")
    heartbeat = Heartbeat(rig.client, "replica-a", 30.0)
    heartbeat.beat(force=True)  # replica-a lives: its lane 1 is still writing
    other = rig.flusher(instance="replica-b")
    other.tick()
    assert rig.oracle_redis().llen(rediskeys.chat_inflight(ACCOUNT, "replica-a.f1")) == 40
    assert rig.stored() == {}
    heartbeat.stop()  # replica-a is gone: its lane's batch is replica-b's to recover
    other.tick()
    other.tick()
    assert rig.oracle_redis().exists(rediskeys.chat_inflight(ACCOUNT, "replica-a.f1")) == 0
    assert_exactly_once(rig.stored(), sent)


def test_the_last_lane_to_stop_deletes_the_heartbeat(rig: ChatRig) -> None:
    lane0, lane1 = rig.flush_threads()
    for t in (lane0, lane1):
        t.start()
    key = rediskeys.instance_heartbeat("test-1")
    assert wait_until(lambda: rig.oracle_redis().exists(key) == 1, timeout=5)
    lane0.request_stop()
    assert lane0.join(10)
    assert rig.oracle_redis().exists(key) == 1  # lane 1 may still be storing a batch
    lane1.request_stop()
    assert lane1.join(10)
    assert rig.oracle_redis().exists(key) == 0
