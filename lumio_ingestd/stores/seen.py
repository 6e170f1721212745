"""Delivery ids already handled: an in-memory window, and one backed by Redis keys with a TTL.

Platforms redeliver (at-least-once sockets, webhooks retried until a 2xx).
`RecentIds` remembers the last N ids of one socket; `SeenDeliveries` does the
same for one platform's webhook receiver and also records each id in Redis
(`lumio:webhooks:PLATFORM:seen:ID`, with a TTL), so a retry that reaches
another replica, or this one after a restart, is recognised too.

Nothing here is the guarantee against duplicates (the database keys are):
it only spares the database the repeats. A Redis failure therefore answers
"not seen" and is logged at debug level. Durable when `mark` returns: the
key was written, or Redis was unreachable and only memory knows.
"""

from __future__ import annotations

import logging
import threading

import redis

from lumio_ingestd.recent import RecentIds
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS

log = logging.getLogger("lumio_ingestd.seen")

SEEN_TTL_SECS = 3600




class SeenDeliveries:
    """One platform's handled webhook delivery ids (thread-safe; `client` None = memory only)."""

    def __init__(self, client: redis.Redis | None, platform: str, *, ttl_secs: int = SEEN_TTL_SECS,
                 recent: int = 50_000) -> None:
        self._redis = client
        self._platform = platform
        self._ttl = ttl_secs
        self._recent = RecentIds(recent)
        self._lock = threading.Lock()

    def seen(self, message_id: str) -> bool:
        with self._lock:
            if message_id in self._recent:
                return True
        if self._redis is None:
            return False
        try:
            return bool(self._redis.exists(rediskeys.webhook_seen(self._platform, message_id)))
        except REDIS_ERRORS:
            return False  # the database keys still make a repeat harmless

    def mark(self, message_id: str) -> None:
        with self._lock:
            self._recent.add(message_id)
        if self._redis is None:
            return
        try:
            self._redis.set(rediskeys.webhook_seen(self._platform, message_id), b"1", ex=self._ttl)
        except REDIS_ERRORS as exc:
            log.debug("%s webhook: cannot record delivery %s in Redis: %s", self._platform,
                      message_id[:64], exc)
