"""The chat dead-letter drain: replays `lumio:chat:deadletter:{ACCOUNT}` lists.

Every `deadletter_drain_interval_secs`, one replica (the holder of the lease
`lumio:chat:deadletter:drain:leader`) drains the dead-letter lists of all
accounts, batch by batch:

1. check with Redis that the lease is still ours (stop at once if not);
2. resume our own drain in-flight list, else claim up to `flush_batch_size`
   entries atomically from the dead-letter list into
   `lumio:chat:inflight:{ACCOUNT}:INSTANCE.dl` (its own list, never mixed with
   the flusher's `...:INSTANCE`);
3. insert idempotently with poison isolation, then quarantine the culprits
   and delete the in-flight list in one atomic step, after the commit.

A pass ends after `pass_budget_secs` (a long backlog then continues in the
next turn at once, so one turn never looks like a hung worker). At the first
retryable database failure the batch goes back to its
dead-letter list (keeping the list's TTL, or setting it if the list had
vanished) and the pass ends: the remaining accounts wait for the next pass, so
a replay never competes with live ingest while the database is unhealthy.

Crash safety: a process killed mid-batch leaves the batch in its `.dl`
in-flight list. The same instance resumes it on its next pass; if the
instance is gone, the flusher of the account's shard sees no heartbeat and
moves the list to the account's *buffer* (not back to the dead-letter list):
the messages then take the normal flush path, and a repeat insert is a no-op.
The drain refreshes the instance heartbeat itself, so it is covered even in a
process without a flusher.

Nothing is durable here beyond what `batch.store_batch` commits.
"""

from __future__ import annotations

import logging
import time

import redis

from lumio_ingestd.chat.batch import BatchDeferred, Failpoint, no_failpoint, record_db_failure, store_batch
from lumio_ingestd.chat.flusher import default_heartbeat_ttl
from lumio_ingestd.chat.lists import DRAIN_SUFFIX, ChatLists
from lumio_ingestd.cluster.instances import PROCESS_TOKEN, Heartbeat, InstanceClaim
from lumio_ingestd.cluster.lease import Lease
from lumio_ingestd.config import Config
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.outage import Outage, describe_redis_error
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.replicas import replica_acks
from lumio_ingestd.worker import STOP_GRACE_SECS, IntervalWorker

log = logging.getLogger("lumio_ingestd.chat.deadletter")


class ChatDeadLetterDrain(IntervalWorker):
    def __init__(self, client: redis.Redis, pool: Pool, metrics: Metrics, cfg: Config, *,
                 instance: str | None = None, lease_ttl_secs: float | None = None,
                 heartbeat_ttl_secs: float | None = None, batch_timeout_secs: float = 10.0,
                 pass_budget_secs: float = 20.0, failpoint: Failpoint = no_failpoint,
                 claim_token: str = PROCESS_TOKEN, name: str = "chat-deadletter-drain") -> None:
        super().__init__(name, metrics, cfg.chat.deadletter_drain_interval_secs)
        self.instance = instance or cfg.daemon.instance_id
        self.owner = self.instance + DRAIN_SUFFIX
        self.batch_timeout_secs = batch_timeout_secs
        self.pass_budget_secs = pass_budget_secs
        self._cfg = cfg
        self._pool = pool
        hb_ttl = heartbeat_ttl_secs or default_heartbeat_ttl(cfg)
        claim = InstanceClaim(client, self.instance, hb_ttl, claim_token)
        self._lists = ChatLists(client, claim_token, claim,
                                acks=replica_acks(client, cfg.redis, metrics))
        # The lease outlives the interval, so a healthy leader keeps it from
        # pass to pass; a dead leader's lease lapses within lease_ttl.
        ttl = lease_ttl_secs or 2.0 * cfg.chat.deadletter_drain_interval_secs + 10.0
        self.lease = Lease(client, rediskeys.CHAT_DRAIN_LEADER, ttl, metrics, owner=self.instance)
        self._heartbeat = Heartbeat(client, self.instance, hb_ttl, metrics, claim)
        self._failpoint = failpoint
        self._redis = Outage("Redis (chat dead-letter drain)", log)
        self._db = Outage("database (chat dead-letter drain)", log)
        self._more = False
        self._pass_deadline = 0.0

    def run_once(self) -> float:
        self.tick()
        # A pass cut short by its budget (not by a failure) goes on at once.
        return 0.0 if self._more else self.interval_secs

    def tick(self) -> None:
        self._more = False
        self._pass_deadline = time.monotonic() + self.pass_budget_secs
        try:
            self._heartbeat.beat(force=True)
            if not self.lease.acquire():
                self._hand_back_own()
                return
            keys = self._lists.scan()
            accounts = set(keys.deadletters)
            accounts.update(a for a, owner, _ in keys.inflight if owner == self.owner)
            for account in sorted(accounts):
                if not self._drain_account(account):
                    break
            self._redis.ok()
        except REDIS_ERRORS as exc:
            # A claimed batch stays in our .dl in-flight list: resumed next pass.
            self._redis.failed(describe_redis_error(exc))

    def _hand_back_own(self) -> None:
        """Put this instance's own drain in-flight lists back on their dead-letter lists.

        Only a pass that failed midway (a Redis blip between claim and finish)
        leaves one; the flusher's orphan recovery skips lists whose owner's
        heartbeat lives, so without this a replica that lost the lease would
        strand them until it leads again.
        """
        for account, owner, key in self._lists.scan().inflight:
            if owner != self.owner:
                continue
            moved = self._lists.move_all(key, rediskeys.chat_deadletter(account),
                                         ttl_secs=self._cfg.chat.deadletter_ttl_hours * 3600.0,
                                         only_if_no_ttl=True)
            if moved:
                log.warning("chat dead-letter drain: handed %d message(s) of account %d back to "
                            "the dead-letter list (not the leader any more)", moved, account)

    def wake(self) -> None:
        # A call stuck on a dead database must not run to its own deadline
        # once a stop is asked for: it would eat the shutdown budget.
        self._pool.expire_calls_of(self.ident, STOP_GRACE_SECS)

    def final(self) -> None:
        self.lease.release()

    def _drain_account(self, account: int) -> bool:
        """Drain one account's list; False when the whole pass must stop."""
        inflight = rediskeys.chat_inflight(account, self.owner)
        source = rediskeys.chat_deadletter(account)
        while True:
            if self.stopping:
                return False
            if time.monotonic() >= self._pass_deadline:
                self._more = True
                return False
            # Asking Redis (extend compares the token) rather than trusting the
            # local expiry estimate: a lease taken over is noticed before the
            # next batch, not half a TTL later.
            if not (self.lease.still_held() and self.lease.extend()):
                log.info("chat dead-letter drain: lease lost, stopping the pass")
                return False
            self._heartbeat.beat()
            entries, _ = self._lists.claim(source, inflight, self._cfg.chat.flush_batch_size)
            if not entries:
                return True
            self._failpoint("chat.drain.claimed")
            try:
                outcome = store_batch(
                    self._lists, self._pool, self.metrics, account=account, inflight=inflight,
                    entries=entries, deadline=time.monotonic() + self.batch_timeout_secs,
                    failpoint=self._failpoint, step="chat.drain")
            except BatchDeferred as deferred:
                record_db_failure(self.metrics, self._db, deferred.cause, deferred.verdict)
                self._lists.move_all(inflight, source,
                                     ttl_secs=self._cfg.chat.deadletter_ttl_hours * 3600.0,
                                     only_if_no_ttl=True)
                return False
            self._db.ok()
            self.metrics.chat_dead_letters_replayed.inc(outcome.stored)
