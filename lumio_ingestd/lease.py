"""Leader leases on Redis: one replica at a time runs a drain.

A lease is a key holding a random token, set with NX and a TTL. Extending
and releasing compare the token first (in Lua, atomically), so a replica
whose lease expired cannot extend or delete the next holder's. A holder checks
`still_held()` before each unit of work and stops at once when it lost the lease.

Nothing durable lives here; a lease only says who may drain.
"""

from __future__ import annotations

import logging
import secrets
import time

import redis

from .metrics import Metrics
from .redisclient import REDIS_ERRORS

log = logging.getLogger(__name__)

_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease:
    def __init__(self, client: redis.Redis, key: str, ttl_secs: float, metrics: Metrics,
                 owner: str) -> None:
        self.key = key
        self._client = client
        self._ttl_ms = max(1, int(ttl_secs * 1000))
        self._metrics = metrics
        self._owner = owner
        self._token: bytes | None = None
        self._expires_at = 0.0  # monotonic; what we may assume without asking Redis
        self._extend = client.register_script(_EXTEND)
        self._release = client.register_script(_RELEASE)

    @property
    def held(self) -> bool:
        return self._token is not None and time.monotonic() < self._expires_at

    def acquire(self) -> bool:
        """Take the lease if free, or extend it if ours. False when another holds it."""
        if self._token is not None:
            return self.extend()
        token = f"{self._owner}:{secrets.token_hex(8)}".encode()
        started = time.monotonic()
        try:
            ok = self._client.set(self.key, token, nx=True, px=self._ttl_ms)
        except REDIS_ERRORS as exc:
            log.debug("lease %s: acquire failed: %s", self.key, exc)
            return self._lost()
        if not ok:
            return self._lost()
        self._token = token
        self._expires_at = started + self._ttl_ms / 1000
        self._metrics.lease_held.labels(self.key).set(1)
        log.info("lease %s acquired", self.key)
        return True

    def extend(self) -> bool:
        if self._token is None:
            return False
        started = time.monotonic()
        try:
            ok = self._extend(keys=[self.key], args=[self._token, self._ttl_ms])
        except REDIS_ERRORS as exc:
            log.warning("lease %s: extend failed: %s", self.key, exc)
            return self._lost()
        if not ok:
            log.warning("lease %s lost to another holder", self.key)
            return self._lost()
        self._expires_at = started + self._ttl_ms / 1000
        return True

    def still_held(self, margin_secs: float = 0.0) -> bool:
        """Held, with at least `margin_secs` left; extends when less than half is left."""
        if self._token is None:
            return False
        remaining = self._expires_at - time.monotonic()
        if remaining < self._ttl_ms / 2000 and not self.extend():
            return False
        return self._expires_at - time.monotonic() > margin_secs

    def release(self) -> None:
        if self._token is None:
            return
        token, self._token = self._token, None
        self._metrics.lease_held.labels(self.key).set(0)
        try:
            self._release(keys=[self.key], args=[token])
            log.info("lease %s released", self.key)
        except REDIS_ERRORS as exc:  # it expires by itself
            log.warning("lease %s: release failed (%s); it expires on its own", self.key, exc)

    def _lost(self) -> bool:
        if self._token is not None:
            self._metrics.lease_held.labels(self.key).set(0)
        self._token = None
        self._expires_at = 0.0
        return False
