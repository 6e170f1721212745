"""When each source path was last known connected and subscribed: `lumio:sourceseen:{A}`.

A hash per account, field `platform:source`, value epoch milliseconds. The
gaps ledger (events/gaps.py) writes it every `seen_interval_secs` for every
path that is up, at the moment a path goes down, and (through a stopping
source) at a graceful stop; it reads a path's value once, when the path comes
up, to find the gap since. The hash has no expiry: a path that never comes
back keeps its last moment, and its gap is found whenever it does.

Durable when `record` returns: the values, in Redis (with its AOF).
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from lumio_ingestd.model import GapKey
from lumio_ingestd.stores import rediskeys


class SourceSeen:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def record(self, keys: Iterable[GapKey], at_ms: int) -> None:
        """Every key's path was up at `at_ms` (one pipelined round trip); raises on a Redis error."""
        pipe = self._redis.pipeline(transaction=False)
        n = 0
        for key in keys:
            pipe.hset(rediskeys.source_seen(key.account_id), key.field, str(int(at_ms)))
            n += 1
        if n:
            pipe.execute()

    def last(self, key: GapKey) -> int | None:
        """The last moment `key` was recorded up, or None (never: a first start)."""
        value = self._redis.hget(rediskeys.source_seen(key.account_id), key.field)
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            return None  # not ours: treated as no record (no gap rather than a wrong one)
