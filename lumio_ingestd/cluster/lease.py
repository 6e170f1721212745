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

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.lease")

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


class LeaseGated(Worker):
    """Runs another worker's turns only while this replica holds `lease`.

    For a one-per-deployment worker that has no lease of its own when the
    replicas are not numbered (`shard = auto`): every replica builds it, the
    lease holder runs it. The lease is renewed every `ttl / 3` however long
    the inner worker's interval, so a dead holder's lease lapses within its TTL.
    """

    def __init__(self, inner: Worker, lease: Lease, ttl_secs: float, *, retry_secs: float = 5.0) -> None:
        super().__init__(inner.name, inner.metrics, role=inner.role)
        self.inner = inner
        self.lease = lease
        self._check_secs = max(0.1, ttl_secs / 3)
        self._retry_secs = retry_secs
        self._due = 0.0
        # The inner worker's waits and checks follow this thread's stop request.
        inner.stop_event = self.stop_event

    def run_once(self) -> float:
        if not self.lease.acquire():
            self._due = 0.0  # taken over: run at once when it comes back
            return self._retry_secs
        now = time.monotonic()
        if now >= self._due:
            self._due = now + self.inner.run_once()
        return max(0.0, min(self._due - time.monotonic(), self._check_secs))

    def wake(self) -> None:
        self.inner.wake()

    def final(self) -> None:
        try:
            if self.lease.held:
                self.inner.final()
        finally:
            self.lease.release()

