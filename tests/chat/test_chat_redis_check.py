"""The start-up check of Redis durability settings, against a real redis-server.

Under `volatile-*` eviction policies Redis evicts the keys that carry a TTL
first, which are exactly the chat dead-letter lists: the daemon must warn
loudly and export the setting.
"""

from __future__ import annotations

import logging

import pytest

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.redisclient import check_durability
from support.harness.servers import RedisServer


def _gauge(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def test_volatile_lru_warns_and_exports_zero(private_redis: RedisServer,
                                             caplog: pytest.LogCaptureFixture) -> None:
    client = private_redis.client()
    client.config_set("maxmemory-policy", "volatile-lru")
    metrics = Metrics()
    with caplog.at_level(logging.WARNING):
        warnings = check_durability(client, metrics)
    assert any("volatile-lru" in w and "noeviction" in w for w in warnings)
    assert any("volatile-lru" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert _gauge(metrics, "redis_maxmemory_policy_noeviction") == 0
    client.close()


def test_noeviction_exports_one(private_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    client = private_redis.client()
    client.config_set("maxmemory-policy", "noeviction")
    metrics = Metrics()
    warnings = check_durability(client, metrics)
    assert not any("maxmemory-policy" in w for w in warnings)
    assert _gauge(metrics, "redis_maxmemory_policy_noeviction") == 1
    # The harness runs Redis without AOF: that is warned about, separately.
    assert any("appendonly" in w for w in warnings)
    assert _gauge(metrics, "redis_aof_enabled") == 0
    client.config_set("appendonly", "yes")
    assert check_durability(client, metrics) == []
    assert _gauge(metrics, "redis_aof_enabled") == 1
    client.close()


def test_unreachable_redis_is_reported_not_raised(private_redis: RedisServer) -> None:
    client = private_redis.client()
    private_redis.stop()
    metrics = Metrics()
    warnings = check_durability(client, metrics)
    assert warnings and "unreadable" in warnings[0]
    assert _gauge(metrics, "redis_maxmemory_policy_noeviction") == 0
    client.close()
