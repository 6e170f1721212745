"""The chat flush worker: Redis buffers into `chat_messages`, every few seconds.

Each pass, for every account of this replica's shard
(`account_id % shard_count == shard_index`) that has a buffer or an
in-flight list of ours:

1. refresh this instance's heartbeat (`lumio:instance:INSTANCE`, with a TTL);
2. recover the in-flight lists of dead instances (no heartbeat) back into
   their buffers, so nothing a killed process had claimed stays stranded;
3. resume our own in-flight batch if one is left from a failed try, else claim
   up to `flush_batch_size` entries atomically from the buffer into it (up to
   `CLAIMS_PER_TRIP` accounts' claims in one pipelined round trip);
4. insert the batch idempotently with poison isolation (`batch.store_batches`;
   consecutive accounts' batches share a transaction while their total stays
   within `flush_batch_size`, so a full batch is alone) and, only after the
   commit, quarantine the culprits and delete the in-flight list in one atomic
   step per account;
5. on a retryable database failure keep the batch in flight and count the
   account's consecutive failures; after `max_flush_failures` move the batch to
   the account's dead-letter list (TTL `deadletter_ttl_hours`) and reset the count.

An account with more than one batch waiting gets further batches in later
rounds of the same pass (round robin), until the pass budget runs out; then
the next pass starts at once instead of after the interval.

Once one account met a retryable database failure in a pass, the database is
not asked again in that pass: the other accounts' batches are claimed and
counted as failed too. So "N failed flushes" means N passes in a row that
could not store the account's batch, and a black-holed database costs one
timeout per pass, not one per account.

A process runs `[chat] flush_workers` of these threads (`flush_threads`), at
most one fewer than the pool's connections. Each claims into its own
in-flight list per account (`lists.lane_owner`: the instance id, then
`INSTANCE.f1`, ...), so they take disjoint batches of the same accounts: while
one waits on the database, another claims and stores the next. One thread
could not keep up with one busy socket (measured: ~52 ms per 1,000-row batch,
40 of them waiting on the database), nor with 16 sockets, whose source threads
win the interpreter lock from it after each of its waits. The first thread
(lane 0) also puts back the in-flight lists of lanes this process no longer
runs (`flush_workers` lowered across a restart) and sets the depth gauges; the
last one to stop deletes the heartbeat.

Two flushers on the same account (several lanes, a shard misconfiguration, a
rolling deploy) claim disjoint batches, so nothing is stored twice or lost. A flusher
whose heartbeat lapsed while it was alive only causes a repeat insert, which
the idempotent insert absorbs.

What is durable: a message is in the database once its batch's in-flight list
is gone (unless it was quarantined); before that it is in a Redis list.
`final()` makes one last pass bounded to `final_budget_secs`; whatever it
does not finish stays in Redis for the next process, and the heartbeat is
deleted so another replica recovers it at once. While `db_unwell()` (the
event path's breaker, db/breaker.py) says the database is known unwell, the
last pass is not made at all: it could only wait for its bound, and
everything it would take stays in Redis the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from lumio_ingestd.chat.batch import (
    BatchDeferred,
    BatchOutcome,
    Claimed,
    Failpoint,
    no_failpoint,
    record_db_failure,
    store_batches,
)
from lumio_ingestd.chat.lists import ChatKeys, ChatLists, lane_owner, owner_instance, owner_lane
from lumio_ingestd.cluster.instances import PROCESS_TOKEN, Heartbeat, InstanceClaim
from lumio_ingestd.config import Config
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.outage import Outage, describe_redis_error
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.replicas import replica_acks
from lumio_ingestd.worker import STOP_GRACE_SECS, IntervalWorker

log = logging.getLogger("lumio_ingestd.chat.flusher")

#: Accounts claimed per round trip to Redis. Bounded so that a round over many
#: accounts with full buffers holds at most this many batches (`flush_batch_size`
#: entries each) in memory.
CLAIMS_PER_TRIP = 16


_Claim = tuple[Claimed, bool]  # a claimed batch, and whether it was resumed


def transactions(claims: list[_Claim], batch_size: int) -> list[list[_Claim]]:
    """The claimed batches cut into transactions, in account order: consecutive batches
    share one while their total stays within `batch_size` (so a full batch is alone)."""
    groups: list[list[_Claim]] = []
    group: list[_Claim] = []
    held = 0
    for claim in claims:
        size = len(claim[0].entries)
        if group and held + size > batch_size:
            groups.append(group)
            group, held = [], 0
        group.append(claim)
        held += size
    if group:
        groups.append(group)
    return groups


def default_heartbeat_ttl(cfg: Config) -> float:
    """A few flush intervals, at least 15 s: outlives one slow pass."""
    return max(15.0, 3.0 * cfg.chat.flush_interval_secs)


def flush_lanes(cfg: Config) -> int:
    """How many flush threads run: `flush_workers`, leaving the pool one connection
    for everything else (a live event's insert must not wait for a flush)."""
    return max(1, min(cfg.chat.flush_workers, cfg.timescale.pool_size - 1))


class _Lanes:
    """The flush threads of one process, for the one decision they share: the last
    to stop deletes the instance's heartbeat (earlier, another replica could
    recover a batch the others are still storing; harmless, but a repeat)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._stopped: set[int] = set()
        self._lock = threading.Lock()

    def stopped(self, lane: int) -> bool:
        """Lane `lane` ran its final pass; True when it was the last one."""
        with self._lock:
            self._stopped.add(lane)
            return len(self._stopped) == self.count


def flush_threads(client: redis.Redis, pool: Pool, metrics: Metrics, cfg: Config,
                  **kwargs: Any) -> list[ChatFlusher]:
    """The process's chat flush threads (`flush_lanes(cfg)` of them); `kwargs` as for
    `ChatFlusher`. Thread 0 is named "chat-flush", thread N "chat-flush-N"."""
    count = flush_lanes(cfg)
    if count < cfg.chat.flush_workers:
        log.info("chat flush: %d thread(s), not the %d of flush_workers: the pool's %d "
                 "connection(s) keep one for everything else", count, cfg.chat.flush_workers,
                 cfg.timescale.pool_size)
    lanes = _Lanes(count)
    return [ChatFlusher(client, pool, metrics, cfg, lane=lane, lanes=lanes,
                        name="chat-flush" if lane == 0 else f"chat-flush-{lane}", **kwargs)
            for lane in range(count)]


class ChatFlusher(IntervalWorker):
    def __init__(self, client: redis.Redis, pool: Pool, metrics: Metrics, cfg: Config, *,
                 instance: str | None = None, heartbeat_ttl_secs: float | None = None,
                 final_budget_secs: float = 3.0, batch_timeout_secs: float = 10.0,
                 pass_budget_secs: float = 10.0, failpoint: Failpoint = no_failpoint,
                 claim_token: str = PROCESS_TOKEN, name: str = "chat-flush",
                 owns: Callable[[int], bool] | None = None, lane: int = 0,
                 lanes: _Lanes | None = None, step_aside: Callable[[], None] | None = None,
                 db_unwell: Callable[[], bool] | None = None) -> None:
        super().__init__(name, metrics, cfg.chat.flush_interval_secs, role="chat-flush")
        self.instance = instance or cfg.daemon.instance_id
        self.lane = lane
        #: Whose in-flight lists this thread claims into and resumes (`lists.lane_owner`).
        self.owner = lane_owner(self.instance, lane)
        self._lanes = lanes or _Lanes(1)
        self.final_budget_secs = final_budget_secs
        self.batch_timeout_secs = batch_timeout_secs
        self.pass_budget_secs = pass_budget_secs
        self._cfg = cfg
        self._pool = pool
        ttl = heartbeat_ttl_secs or default_heartbeat_ttl(cfg)
        claim = InstanceClaim(client, self.instance, ttl, claim_token)
        self._lists = ChatLists(client, claim_token, claim,
                                acks=replica_acks(client, cfg.redis, metrics))
        self._heartbeat = Heartbeat(client, self.instance, ttl, metrics, claim)
        self._failpoint = failpoint
        self._account_failures: dict[int, int] = {}
        self._redis = Outage("Redis (chat flush)", log)
        self._db = Outage("database (chat flush)", log)
        self._backlog = False
        # `shard = auto`: the membership's rendezvous decides (cluster/membership.py).
        self._owns = owns
        #: Between rows and before each claim: waits while an event is on its way (eventgate.py).
        self._step_aside = step_aside
        self._db_unwell = db_unwell

    # -- the worker --------------------------------------------------------------

    def run_once(self) -> float:
        self.tick()
        # A pass cut short by its budget left work behind: go on at once.
        return 0.0 if self._backlog else self.interval_secs

    def tick(self) -> None:
        self._pass(time.monotonic() + self.pass_budget_secs, final=False)

    def wake(self) -> None:
        # A call stuck on a dead database must not run to its own deadline
        # once a stop is asked for: it would eat the shutdown budget.
        self._pool.expire_calls_of(self.ident, STOP_GRACE_SECS)

    def final(self) -> None:
        """One last pass bounded to `final_budget_secs`; the rest stays in Redis."""
        if self._db_unwell is not None and self._db_unwell():
            log.info("chat flush: the database is unavailable; no last flush, the buffers wait "
                     "in Redis for the next process")
        else:
            self._pass(time.monotonic() + self.final_budget_secs, final=True)
        if not self._lanes.stopped(self.lane):
            return  # another lane still writes: the heartbeat must cover its batches
        try:
            self._heartbeat.stop()
        except REDIS_ERRORS as exc:  # it expires by itself
            log.debug("chat flush: cannot delete the heartbeat: %s", describe_redis_error(exc))

    def owns(self, account: int) -> bool:
        if self._owns is not None:
            return self._owns(account)
        return account % self._cfg.daemon.shard_count == self._cfg.daemon.shard_index

    @property
    def consecutive_failures(self) -> dict[int, int]:
        return dict(self._account_failures)

    # -- one pass ----------------------------------------------------------------

    def _pass(self, budget_deadline: float, *, final: bool) -> None:
        started = time.monotonic()
        self._backlog = False
        try:
            self._heartbeat.beat(force=True)
            keys = self._lists.scan()
            self._recover_orphans(keys)
            self._flush_accounts(keys, budget_deadline, final)
            if self.lane == 0:  # one lane is enough: each would count the same lists
                self._update_gauges(keys)
            self._redis.ok()
        except REDIS_ERRORS as exc:
            # Claimed batches stay in flight and are resumed by the next pass.
            self._redis.failed(describe_redis_error(exc))
            self._backlog = False
        finally:
            self.metrics.chat_flush_duration.observe(time.monotonic() - started)

    def _accounts(self, keys: ChatKeys) -> list[int]:
        accounts = {a for a in keys.buffers if self.owns(a)}
        accounts.update(a for a, owner, _ in keys.inflight if owner == self.owner and self.owns(a))
        return sorted(accounts)

    def _flush_accounts(self, keys: ChatKeys, budget_deadline: float, final: bool) -> None:
        pending = self._accounts(keys)
        db_failed = False
        while pending and not db_failed:
            more: list[int] = []
            for first in range(0, len(pending), CLAIMS_PER_TRIP):
                if time.monotonic() >= budget_deadline or (self.stopping and not final):
                    self._backlog = not final and not self.stopping
                    return
                self._heartbeat.beat()
                if self._step_aside is not None:
                    self._step_aside()
                claims = self._claim(pending[first:first + CLAIMS_PER_TRIP])
                if db_failed:
                    for claimed, _ in claims:
                        self._failed(claimed.account, claimed.inflight)
                elif claims:
                    db_failed = not self._store_claims(claims, more, budget_deadline, final)
            pending = more

    def _claim(self, accounts: list[int]) -> list[_Claim]:
        """The accounts' next batches, claimed in one round trip: (batch, whether it
        was already in flight) for each account that had something waiting."""
        inflights = [rediskeys.chat_inflight(account, self.owner) for account in accounts]
        replies = self._lists.claim_many(
            [(rediskeys.chat_buffer(account), inflight)
             for account, inflight in zip(accounts, inflights, strict=True)],
            self._cfg.chat.flush_batch_size)
        claims: list[_Claim] = []
        for account, inflight, (entries, resumed) in zip(accounts, inflights, replies, strict=True):
            if not entries:
                self.metrics.chat_flush_batches.labels("empty").inc()
                continue
            claims.append((Claimed(account, inflight, entries), resumed))
        if claims:
            self._failpoint("chat.flush.claimed")
        return claims

    def _store_claims(self, claims: list[_Claim], more: list[int],
                      budget_deadline: float, final: bool) -> bool:
        """Store one claim round trip's batches; False once the database failed (that
        transaction's batches and every later one counted failed and left in flight).

        Batches share a transaction while their total stays within `flush_batch_size`
        (the most rows a transaction takes): many accounts with a few messages each,
        the many-sockets case, cost one commit. With 16 busy source threads each wait on the
        database or Redis cost the flusher thread 60-370 ms to win the interpreter
        lock back (measured), so one commit per account made it fall behind.
        """
        groups = transactions(claims, self._cfg.chat.flush_batch_size)
        for index, group in enumerate(groups):
            if not self._store(group, more, budget_deadline, final):
                for rest in groups[index + 1:]:
                    for claimed, _ in rest:
                        self._failed(claimed.account, claimed.inflight)
                return False
        return True

    def _store(self, group: list[_Claim], more: list[int], budget_deadline: float,
               final: bool) -> bool:
        """Store the batches of `group` in one transaction (batch.store_batches); False when
        the database failed (each of them counted failed and left in flight). Accounts
        that may have more waiting (a full or a resumed batch) go to `more`."""
        deadline = time.monotonic() + self.batch_timeout_secs
        if final:
            deadline = min(deadline, budget_deadline)
        batch_size = self._cfg.chat.flush_batch_size
        resumed = {claimed.account for claimed, was_resumed in group if was_resumed}

        def finished(claimed: Claimed, outcome: BatchOutcome) -> None:
            self._account_failures.pop(claimed.account, None)
            self.metrics.chat_flush_batches.labels("ok").inc()
            self.metrics.chat_messages_flushed.inc(outcome.stored)
            # A resumed batch says nothing about the buffer behind it: look again.
            if claimed.account in resumed or len(claimed.entries) >= batch_size:
                more.append(claimed.account)

        try:
            store_batches(self._lists, self._pool, self.metrics, [c for c, _ in group],
                          deadline=deadline, finished=finished, failpoint=self._failpoint,
                          step="chat.flush", step_aside=self._step_aside)
        except BatchDeferred as deferred:
            record_db_failure(self.metrics, self._db, deferred.cause, deferred.verdict)
            for claimed, _ in group:
                self._failed(claimed.account, claimed.inflight)
            return False
        self._db.ok()
        return True

    def _failed(self, account: int, inflight: str) -> None:
        self.metrics.chat_flush_batches.labels("failed").inc()
        failures = self._account_failures.get(account, 0) + 1
        if failures < self._cfg.chat.max_flush_failures:
            self._account_failures[account] = failures
            return
        moved = self._lists.move_all(inflight, rediskeys.chat_deadletter(account),
                                     ttl_secs=self._cfg.chat.deadletter_ttl_hours * 3600.0)
        self._account_failures.pop(account, None)
        self.metrics.chat_flush_batches.labels("deadlettered").inc()
        log.warning("chat flush: account %d: %d messages moved to the dead-letter list after "
                    "%d failed flushes in a row", account, moved, failures)

    # -- recovery and gauges -------------------------------------------------

    def _recover_orphans(self, keys: ChatKeys) -> None:
        """Move in-flight lists of dead instances (ours to flush) back to their buffers."""
        if self.lane == 0:
            self._recover_idle_lanes(keys)
        foreign = [(account, owner, key) for account, owner, key in keys.inflight
                   if self.owns(account) and owner_instance(owner) != self.instance]
        if not foreign:
            return
        alive = self._lists.alive(owner_instance(owner) for _, owner, _ in foreign)
        for account, owner, key in foreign:
            if alive[owner_instance(owner)]:
                continue
            # Not atomic with the heartbeat check: an owner that comes back
            # meanwhile finishes its batch, and the repeat insert is a no-op.
            self._put_back(keys, account, key, f"the dead instance {owner}")

    def _recover_idle_lanes(self, keys: ChatKeys) -> None:
        """Put back this instance's in-flight lists of flush lanes that no thread of this
        process runs (an earlier process ran more): nobody else would, since the
        instance's heartbeat lives."""
        if self._lists.instance_claim is not None and not self._lists.instance_claim.held:
            return  # another live process runs as this instance: its lanes, not ours
        for account, owner, key in keys.inflight:
            lane = owner_lane(owner)
            if (lane is None or lane < self._lanes.count or not self.owns(account)
                    or owner_instance(owner) != self.instance):
                continue
            self._put_back(keys, account, key, f"flush thread {lane} (not run by this process)")

    def _put_back(self, keys: ChatKeys, account: int, key: str, whose: str) -> None:
        """Move the in-flight list `key` (another owner's) back to the account's buffer."""
        moved = self._lists.move_all(key, rediskeys.chat_buffer(account), any_owner=True)
        if moved:
            log.info("chat flush: account %d: %d in-flight messages of %s returned to the buffer",
                     account, moved, whose)
            keys.buffers.add(account)

    def _update_gauges(self, keys: ChatKeys) -> None:
        """Depths of this shard's lists (so the sum over replicas is the total).

        Measured after the pass, on the SCAN's accounts: lists this pass
        created (an in-flight batch, a dead-letter list) are included.
        """
        mine = set(self._accounts(keys))
        mine.update(a for a in keys.deadletters if self.owns(a))
        mine.update(a for a, _, _ in keys.inflight if self.owns(a))
        buffers = {rediskeys.chat_buffer(a) for a in mine}
        buffers.update(rediskeys.chat_inflight(a, lane_owner(self.instance, lane))
                       for a in mine for lane in range(self._lanes.count))
        buffers.update(key for account, _, key in keys.inflight if self.owns(account))
        deadletters = {rediskeys.chat_deadletter(a) for a in mine}
        self.metrics.chat_buffer_depth.set(self._lists.lengths(buffers))
        self.metrics.chat_dead_letter_depth.set(self._lists.lengths(deadletters))
