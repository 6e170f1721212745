"""Leader leases against a real Redis: exclusivity, expiry, compare-and-delete."""

from __future__ import annotations

import threading
import time

import redis

from lumio_ingestd.cluster.lease import Lease
from lumio_ingestd.metrics import Metrics
from support.harness.servers import RedisServer, wait_until


def _lease(url: str, owner: str, ttl: float = 0.5) -> tuple[Lease, Metrics]:
    metrics = Metrics()
    return Lease(redis.Redis.from_url(url), "lumio:test:leader", ttl, metrics, owner), metrics


def test_only_one_holder_at_a_time(redis_url: str) -> None:
    a, ma = _lease(redis_url, "a")
    b, _ = _lease(redis_url, "b")
    assert a.acquire()
    assert not b.acquire()
    assert a.held and not b.held
    assert ma.lease_held.labels("lumio:test:leader")._value.get() == 1
    a.release()
    assert ma.lease_held.labels("lumio:test:leader")._value.get() == 0
    assert b.acquire()


def test_expired_holder_cannot_extend_or_delete_the_next_holders_lease(redis_url: str) -> None:
    a, _ = _lease(redis_url, "a", ttl=0.3)
    b, _ = _lease(redis_url, "b", ttl=5)
    assert a.acquire()
    assert wait_until(lambda: b.acquire(), timeout=3)  # a's key expired
    assert not a.extend()
    assert not a.still_held()
    a.release()  # compare-and-delete: must not remove b's key
    assert redis.Redis.from_url(redis_url).get("lumio:test:leader") is not None
    assert b.still_held()


def test_still_held_extends_before_expiry(redis_url: str) -> None:
    a, _ = _lease(redis_url, "a", ttl=0.4)
    assert a.acquire()
    pause = threading.Event()
    deadline = time.monotonic() + 1.2  # three TTLs, kept alive by still_held()
    while time.monotonic() < deadline:
        assert a.still_held()
        pause.wait(0.1)
    b, _ = _lease(redis_url, "b")
    assert not b.acquire()


def test_redis_down_means_not_held(private_redis: RedisServer) -> None:
    a, _ = _lease(private_redis.url, "a", ttl=5)
    assert a.acquire()
    private_redis.kill()
    assert not a.extend()
    assert not a.held
    private_redis.start()
    assert a.acquire()
