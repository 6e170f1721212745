"""`shard = auto`: which accounts this replica runs, decided with the other live replicas.

A replica is live while its heartbeat `lumio:instance:INSTANCE` exists (the
same key the chat flusher refreshes and the in-flight recovery reads: one
notion of liveness). Every `interval_secs` the `Membership` worker beats,
lists the live instances (SCAN over `lumio:instance:*`), and gives each
configured account to the instance with the highest rendezvous score
sha256(instance, account), so a replica joining or leaving moves only the
accounts it gains or loses.

The hand-over goes through one key per account, `lumio:owner:{ACCOUNT}`,
holding the owner's instance id with the heartbeat's TTL:

- an account is started only after this replica took the key (free, or held
  under its own instance id by a dead previous process), so never while the
  previous owner still holds it;
- an account that moves away is stopped first (its sources hand their memory
  to Redis), and its key is deleted only then (`settled()`), compare-and-delete;
- the keys of the accounts held are renewed every turn; a dead replica's keys
  expire with its heartbeat, and the new owners take them on their next turn.

Claim before owning: the owner key holds an instance id, and a second process
started under the same id (while Redis was down, so the claim at start could
not refuse it) would take that key for its own. So every turn first takes
the instance claim (`InstanceClaim`, refreshed with the heartbeat); while
another live process holds it, this replica's target is empty, and it
neither takes nor renews an owner key.

The main thread (runtime/app.py) reads `target()` and moves the account workers to
it, then calls `settled()`. Nothing durable lives here.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable

import redis

from lumio_ingestd.cluster.instances import Heartbeat, InstanceClaim
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.outage import describe_redis_error
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.membership")

_INSTANCE_PATTERN = "lumio:instance:*"
_INSTANCE_PREFIX = "lumio:instance:"

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Free, or held under this instance id by a previous process of the same name
# (ids are unique among running processes, so that one is dead).
_TAKE = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def score(instance: str, account_id: int) -> int:
    digest = hashlib.sha256(f"{instance}\0{account_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def owner(account_id: int, live: Iterable[str]) -> str | None:
    """The live instance that owns the account (rendezvous hashing); None when none is live."""
    best: tuple[int, str] | None = None
    for instance in live:
        candidate = (score(instance, account_id), instance)
        if best is None or candidate > best:
            best = candidate
    return best[1] if best is not None else None


class Membership(Worker):
    """Heartbeat, live instances, and the accounts this replica may run (see the module doc)."""

    def __init__(self, client: redis.Redis, instance: str, ttl_secs: float, metrics: Metrics, *,
                 interval_secs: float = 2.0, name: str = "membership",
                 claim: InstanceClaim | None = None) -> None:
        super().__init__(name, metrics)
        self.instance = instance
        self.ttl_secs = ttl_secs
        self.interval_secs = interval_secs
        self.on_change: Callable[[], None] = lambda: None
        self._client = client
        self._claim = claim
        self._heartbeat = Heartbeat(client, instance, ttl_secs, metrics, claim)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._take = client.register_script(_TAKE)
        self._lock = threading.Lock()
        self._accounts: frozenset[int] = frozenset()
        self._running: frozenset[int] = frozenset()
        self._target: frozenset[int] | None = None
        self._live: tuple[str, ...] = ()
        self._announced = False

    # -- read by the main thread and the flusher ---------------------------------------

    def set_accounts(self, accounts: Iterable[int]) -> None:
        with self._lock:
            self._accounts = frozenset(accounts)

    def target(self) -> frozenset[int] | None:
        """The accounts to run now (None until the first turn finished)."""
        with self._lock:
            return self._target

    def live(self) -> tuple[str, ...]:
        with self._lock:
            return self._live

    def flushes(self, account_id: int) -> bool:
        """Whether this replica's flusher takes the account's buffer (any account, configured or not)."""
        with self._lock:
            live = self._live or (self.instance,)
        return owner(account_id, live) == self.instance

    def settled(self, running: frozenset[int], released: Iterable[int]) -> None:
        """The main thread now runs `running`; `released` were stopped: free their keys."""
        with self._lock:
            self._running = running
        self.metrics.membership_accounts.set(len(running))
        self._free(released)

    def release_all(self) -> None:
        with self._lock:
            held = self._running | (self._target or frozenset())
            self._running = frozenset()
        self._free(held)

    def _free(self, accounts: Iterable[int]) -> None:
        if self._claim is not None and not self._claim.held:
            return  # the keys hold this id for the process that holds the claim now: its keys
        for account in accounts:
            try:
                self._release(keys=[rediskeys.account_owner(account)], args=[self.instance])
            except REDIS_ERRORS as exc:  # it expires by itself
                log.warning("membership: cannot release account %d: %s", account, describe_redis_error(exc))

    # -- the worker -------------------------------------------------------------------

    def run_once(self) -> float:
        self._heartbeat.beat(force=True)
        live = sorted(self._scan_live() | {self.instance})
        with self._lock:
            accounts, running, previous = self._accounts, self._running, self._target
            changed_live = tuple(live) != self._live
            self._live = tuple(live)
        if changed_live:
            log.info("membership: live instances %s", ", ".join(live))
        if self._claim is not None and not self._claim.held:
            # Another live process runs as this instance id: own nothing, touch no owner key
            # (they hold this id too). What was running is stopped and released by the main thread.
            with self._lock:
                previous, self._target = self._target, frozenset()
            if previous != frozenset():
                self.on_change()
            return self.interval_secs
        if not self._announced:
            self._announced = True
            # The first turn only announces this replica: replicas started together
            # see each other before any takes an account, instead of handing over.
            return self.interval_secs
        desired = {a for a in accounts if owner(a, live) == self.instance}
        held = running | (previous or frozenset())
        ttl_ms = str(max(1, int(self.ttl_secs * 1000)))
        lost = {a for a in held
                if not self._renew(keys=[rediskeys.account_owner(a)], args=[self.instance, ttl_ms])}
        acquired = set()
        for account in sorted(desired - held):
            if self._take(keys=[rediskeys.account_owner(account)], args=[self.instance, ttl_ms]):
                acquired.add(account)
        if lost & desired:
            log.warning("membership: the ownership of account(s) %s lapsed; taken again if free",
                        ", ".join(str(a) for a in sorted(lost & desired)))
            for account in sorted(lost & desired):
                if self._take(keys=[rediskeys.account_owner(account)], args=[self.instance, ttl_ms]):
                    acquired.add(account)
        target = frozenset(((held & desired) - lost) | acquired)
        # Held but no longer desired: kept (and renewed) until the main thread stopped them.
        with self._lock:
            self._target = target
        self.metrics.membership_instances.set(len(live))
        if target != previous or changed_live:
            self.on_change()
        return self.interval_secs

    def _scan_live(self) -> set[str]:
        found: set[str] = set()
        for key in self._client.scan_iter(match=_INSTANCE_PATTERN, count=1000):
            text = key.decode() if isinstance(key, bytes) else str(key)
            found.add(text[len(_INSTANCE_PREFIX):])
        return found


__all__ = ["Membership", "owner", "score"]
