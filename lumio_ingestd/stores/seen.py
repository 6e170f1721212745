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
from collections import deque

import redis

from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS

log = logging.getLogger("lumio_ingestd.stores.seen")

SEEN_TTL_SECS = 3600


class RecentIds:
    """The last `size` message ids, oldest forgotten first (not thread-safe: one owner).

    A set answers `in`, a deque keeps the order: a new id (the sources add
    one per message, after `in` said no) costs a set insert and a deque
    append, against an OrderedDict's linked-list upkeep. A repeat is moved to
    the newest end, which costs a scan of the deque; the sources never add
    one (they skip an id already here), so that scan is off the hot path.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._known: set[str] = set()
        self._ids: deque[str] = deque()  # oldest first; the same ids as `_known`

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._known

    def __len__(self) -> int:
        return len(self._known)

    def add(self, message_id: str) -> None:
        if message_id in self._known:
            ids = self._ids
            ids.remove(message_id)
            ids.append(message_id)
            return
        if self._size <= 0:
            return
        self._known.add(message_id)
        ids = self._ids
        ids.append(message_id)
        if len(ids) > self._size:
            self._known.discard(ids.popleft())


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
