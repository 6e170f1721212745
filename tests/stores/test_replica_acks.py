"""`[redis] min_replicas_acked`: writes confirmed by WAIT on a real primary and its replica.

A private primary with one replica (`--replicaof`). While the replica runs,
a park, a chat push and a dead-letter move return once it holds them; while
it is stopped (SIGSTOP), each raises `NotReplicated` after
`replica_ack_timeout_ms`, which the callers handle as a refused write, and is
counted in `redis_replica_ack_failures_total{write}`. With 0 no WAIT is sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lumio_ingestd.chat.lists import ChatLists
from lumio_ingestd.config import RedisConfig
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.replicas import NotReplicated, ReplicaAcks, replica_acks
from support.harness import RedisServer
from support.harness.servers import wait_until

TIMEOUT_MS = 200


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, RedisServer]]:
    base = tmp_path_factory.mktemp("replica_pair")
    primary = RedisServer(Path(base) / "primary")
    primary.start()
    replica = RedisServer(Path(base) / "replica", extra_args=(
        "--replicaof", "127.0.0.1", str(primary.port)))
    try:
        replica.start()
        client = replica.client()
        assert wait_until(lambda: client.info("replication").get("master_link_status") == "up", 20)
        client.close()
        yield primary, replica
    finally:
        replica.close()
        primary.close()


def _acks(primary: RedisServer, metrics: Metrics, n: int = 1) -> tuple[redis.Redis, ReplicaAcks]:
    client = primary.client()
    return client, ReplicaAcks(client, RedisConfig(url=primary.url, min_replicas_acked=n,
                                                   replica_ack_timeout_ms=TIMEOUT_MS), metrics)


def _failures(metrics: Metrics, write: str) -> float:
    return float(metrics.redis_replica_ack_failures.labels(write)._value.get())


def test_writes_wait_for_the_replica_and_fail_when_it_cannot_confirm(
        pair: tuple[RedisServer, RedisServer]) -> None:
    primary, replica = pair
    metrics = Metrics()
    client, acks = _acks(primary, metrics)
    client.delete("lumio:events:deadletter:{3}", "lumio:chat:buffer:{3}")
    dl = DeadLetters(client, acks=acks)
    dl.park(3, [b"e1", b"e2"])
    replica_client = replica.client()
    # Returned only once the replica holds it: read from the replica at once.
    assert replica_client.lrange("lumio:events:deadletter:{3}", 0, -1) == [b"e1", b"e2"]
    assert client.pttl("lumio:events:deadletter:{3}") > 0

    replica.pause()
    try:
        started = time.monotonic()
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            dl.park(3, [b"e3"])
        assert time.monotonic() - started >= TIMEOUT_MS / 1000 * 0.9
        assert _failures(metrics, "event") == 1
        with pytest.raises(NotReplicated):
            acks.run("lumio:chat:buffer:{3}",
                     lambda pipe: pipe.rpush("lumio:chat:buffer:{3}", b"m1"), write="chat")
        assert _failures(metrics, "chat") == 1
        lists = ChatLists(client, "tok", acks=acks)
        client.rpush("lumio:chat:inflight:{3}:x", b"m2")
        with pytest.raises(NotReplicated):
            lists.move_all("lumio:chat:inflight:{3}:x", "lumio:chat:deadletter:{3}", any_owner=True)
        assert _failures(metrics, "chat_move") == 1
    finally:
        replica.resume()
    # A write that WAIT did not confirm may well be in Redis: it is never counted done,
    # and its next tier stores it again (an idempotent repeat).
    assert client.lrange("lumio:events:deadletter:{3}", 0, -1) == [b"e1", b"e2", b"e3"]
    client.delete("lumio:events:deadletter:{3}", "lumio:chat:buffer:{3}",
                  "lumio:chat:deadletter:{3}")
    replica_client.close()
    client.close()


def test_more_replicas_than_there_are_never_confirm(pair: tuple[RedisServer, RedisServer]) -> None:
    primary, _ = pair
    metrics = Metrics()
    client, acks = _acks(primary, metrics, n=2)
    with pytest.raises(NotReplicated, match="1 of 2 replica"):
        DeadLetters(client, acks=acks).park(4, [b"e"])
    client.delete(rediskeys.events_deadletter(4))
    client.close()


def test_off_sends_no_wait(pair: tuple[RedisServer, RedisServer]) -> None:
    primary, replica = pair
    client = primary.client()
    assert replica_acks(client, RedisConfig(url=primary.url)) is None
    acks = ReplicaAcks(client, RedisConfig(url=primary.url), Metrics())
    replica.pause()
    try:
        started = time.monotonic()
        assert acks.run("k", lambda pipe: pipe.rpush("k", b"x"), write="chat") == [1]
        assert time.monotonic() - started < TIMEOUT_MS / 1000
    finally:
        replica.resume()
    client.delete("k")
    client.close()
