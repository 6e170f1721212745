"""The event retry worker: replays parked events into the database.

Every `[events] retry_interval_secs` each replica refreshes its heartbeat
(`lumio:instance:INSTANCE`) and tries the lease
`lumio:events:deadletter:drain:leader`; only the holder replays. A pass:

1. Recovers in-flight lists (`lumio:events:inflight:{A}:INSTANCE`) whose owner
   has no heartbeat any more (it died between claim and settle), and its own
   (left by an earlier incarnation with the same instance id, or by a pass
   that raised): they go back to the head of their dead-letter list in order.
   The durable copies of gift bombs a dead process held in memory
   (`events/held.py`) are parked the same way.
2. One SCAN over `lumio:events:deadletter:{*}` lists the accounts; the sum of
   their lengths is the `events_dead_letter_depth` gauge (non-holders measure
   it too, so every replica exports it).
3. Per account (ascending id), at most the entries it held at the scan: claim
   a batch into our in-flight list (one Lua script), then insert its entries
   with their ORIGINAL id and created_at, several per transaction (one WAL
   flush for up to `MAX_TX_ENTRIES` events) in groups under one SAVEPOINT
   each (a failing group is rolled back and redone one entry per savepoint,
   so a failing entry is rolled back alone), each transaction under a deadline
   of `insert_timeout_secs`, and only after the commit remove them from the
   in-flight list (one pipeline). "Already stored" counts `recovered`; a new
   row counts `events_persisted{path="replay"}`. The first three
   transactions of a pass hold one entry each, then the size doubles up to
   the cap; any failure starts the ramp again.

At the first transient error the claimed remainder goes back to the head of
the list in its order and the WHOLE pass ends: the other accounts wait for
the next cycle, so replay never competes with live ingest while the database
is unhealthy. An entry that no retry can store goes to
`lumio:events:quarantine:{A}` instead of blocking its account:

- "undecodable": not an entry this code can read;
- "expired": its original created_at is older than the dead-letter TTL (72 h;
  counted `events_persist_failures{outcome="lost"}` too, as a dropped entry's
  would have been, but kept for an operator);
- "permanent": the database refuses it (SQLSTATE class 22/23/...);
- "stuck": the same retryable-but-not-a-health-problem failure (an
  environmental SQLSTATE such as 42501, or an unclassified one such as XX000)
  on the same entry `stuck_after` passes in a row, while a canary insert of a
  bare event for the same account and time (rolled back) succeeds. Such a
  failure ends the pass like a transient one until then. The canary keeps a
  problem of the whole table (a missing table or grant: every entry fails the
  same way) from emptying the dead-letter lists into the quarantine; those
  entries wait, and `db_environmental_errors` alerts.

Parked records (`records`: a minute of viewer statistics, say) share the
lists and this pass: an entry marked with a record kind is written by the
writer registered for it instead of `insert_event`, under the same deadline,
settle and quarantine rules (a kind without a writer: "undecodable").

With a `breaker` (the inline path's, db/breaker.py) a committed transaction
tells it the database answers again, and a pass stopped by a failure of the
database's health (not an entry's own) tells it the database is unwell: the
live path then parks at once instead of waiting for a timeout.

The lease is checked before every entry; when it is lost (or a stop is
requested) the remainder is put back and the pass ends at once. A pass also
ends after `pass_budget_secs` (the rest put back, the next turn starts at
once), so a large backlog never holds one turn past the watchdog's limit. Work stays
correct without it: inserts are idempotent and each claim is private to its
instance, so two replayers cost load, never a second row.

Durable when a pass returns: every entry it settled is committed in the
database or in the quarantine list; every other entry is in a dead-letter or
in-flight list.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis

from lumio_ingestd.cluster.instances import heartbeat_value
from lumio_ingestd.cluster.lease import Lease
from lumio_ingestd.config import Config
from lumio_ingestd.db.breaker import DatabaseBreaker
from lumio_ingestd.db.errors import classify, describe_db_error
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.events import store
from lumio_ingestd.events.deadletter import DEADLETTER_TTL_SECS, DeadLetters
from lumio_ingestd.events.held import HeldGifts
from lumio_ingestd.events.records import RecordWriter, RecordWriters, record_kind
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import Classified, EntryError, EventChild, Kind, PlatformEvent
from lumio_ingestd.outage import Outage, describe_redis_error
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.replicas import replica_acks
from lumio_ingestd.worker import STOP_GRACE_SECS, IntervalWorker

log = logging.getLogger("lumio_ingestd.events.retry")

Failpoint = Callable[[str], None]

# SQLSTATE classes and codes that say "the database is unhealthy" rather
# than "this entry has a problem": they never count toward "stuck".
_HEALTH_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_HEALTH_CODES = frozenset({"55P03", "55006", "25006", "25P03"})

_DEADLETTER_PATTERN = "lumio:events:deadletter:{*}"
_INFLIGHT_PATTERN = "lumio:events:inflight:{*}:*"

# The prefix of a replay transaction's savepoints, one per entry (numbered:
# the RELEASE of one rides with the next entry's first statement, and a
# ROLLBACK TO a savepoint that was never taken must fail rather than reach an
# earlier one).
_SAVEPOINT = "lumio_replay"

# The most entries one replay transaction stores: one commit (one WAL flush,
# a few ms with fsync on) for all of them. A transaction is also bounded by its
# claim batch (the daemon's 100), a third of its deadline and _MAX_SAVEPOINTS.
# A live commit waits behind the replay's WAL flush, so a smaller one keeps the
# live p99 down: bench/bench_events.py part (b), 100 / 50, three pairs, live
# persist_event p99 during the replay 3.63 / 3.49, 3.27 / 2.97, 3.64 / 3.22 ms,
# for 9,300-9,500 / 8,300-8,900 replayed events/s.
MAX_TX_ENTRIES = 50

# The most savepoints one replay transaction takes. Each savepoint that writes
# is a subtransaction with an xid of its own; PostgreSQL caches 64 of them per
# backend, beyond which every other session's snapshots fall back to
# pg_subtrans lookups (subxid overflow). A group takes one, a lone entry
# (the ramp, a group's redo one by one, a record) one each.
_MAX_SAVEPOINTS = 56

# The most entries whose statements go in one round trip (one multi-statement
# query, one savepoint around them all). Each round trip costs the client a
# few syscalls and interpreter-lock hand-offs; with groups of 8 a replayed
# event cost ~90-105 us of this process's CPU, with 50 ~65-80 us
# (bench/bench_events.py, back to back), and the live paths' wait for the
# lock did not grow (the group's decoding and formatting is ~1 ms). A failing
# group is rolled back whole and redone one entry per round trip, each in a
# savepoint of its own, once.
_GROUP = 50

# Entries decoded between two releases of the interpreter lock. A group's
# decoding is the longest stretch of Python the replay runs without a round
# trip (~20 us an entry); bench/bench_events.py part (b), A/B, four runs each:
# live persist_event p99 during the replay 2.67, 2.51, 1.81 and 1.84x idle
# without a release, 1.53, 1.62, 1.62 and 1.41x with one every 10 entries.
# On a later machine, every 10 / every 5, three pairs: 1.83 / 1.82, 2.05 / 1.91,
# 1.85 / 1.56x (p99 during 3.7-4.0 / 3.6-3.7 ms), for 8.8-9.2k / 8.0-8.2k
# replayed events/s: the live p99 is what this is for, the rate has room.
_YIELD_EVERY = 5

# A decoded parked entry: its raw bytes, its event, and its record writer (None: an event).
_Ready = tuple[bytes, PlatformEvent, RecordWriter | None]

# Bound on the in-memory strike table (entry id -> consecutive failures).
_MAX_STRIKES = 10_000


def _no_failpoint(name: str) -> None:
    """Failpoints are off in production."""


@dataclass(slots=True)
class PassReport:
    """What one tick did (for logs, tests and the benchmark)."""

    leader: bool = False
    depth: int = 0
    stored: int = 0
    recovered: int = 0
    quarantined: int = 0
    inflight_recovered: int = 0
    # Why a pass ended early: "transient", "lease", "stopping", or "budget" (its
    # time is up; the next turn continues at once).
    stopped: str | None = None


class _Stop(Exception):
    """Ends the pass; `reason` goes to PassReport.stopped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EventRetryWorker(IntervalWorker):
    def __init__(self, client: redis.Redis, pool: Pool, metrics: Metrics, cfg: Config, *,
                 instance: str | None = None, lease_ttl_secs: float | None = None,
                 heartbeat_ttl_secs: float | None = None, batch_size: int = 100,
                 stuck_after: int = 5, entry_ttl_secs: float = DEADLETTER_TTL_SECS,
                 pass_budget_secs: float = 20.0, failpoint: Failpoint | None = None,
                 name: str = "event-retry", records: RecordWriters | None = None,
                 tx_entries: int = MAX_TX_ENTRIES, breaker: DatabaseBreaker | None = None) -> None:
        interval = cfg.events.retry_interval_secs
        super().__init__(name, metrics, interval)
        self.instance = instance if instance is not None else cfg.daemon.instance_id
        self._client = client
        self._pool = pool
        self._insert_timeout = cfg.events.insert_timeout_secs
        self._dl = DeadLetters(client, acks=replica_acks(client, cfg.redis, metrics))
        self._held = HeldGifts(client, self.instance)
        # A few intervals: a holder between two ticks keeps it; a dead holder
        # is replaced within about one TTL plus one interval.
        self.lease = Lease(client, rediskeys.EVENTS_DRAIN_LEADER,
                           lease_ttl_secs if lease_ttl_secs is not None else 3 * interval,
                           metrics, owner=self.instance)
        self._heartbeat_ms = max(1, int(1000 * (
            heartbeat_ttl_secs if heartbeat_ttl_secs is not None else 3 * interval)))
        self._batch = max(1, batch_size)
        self._stuck_after = max(1, stuck_after)
        self._entry_ttl = timedelta(seconds=entry_ttl_secs)
        self._failpoint = failpoint or _no_failpoint
        self._records = records if records is not None else RecordWriters()
        self._strikes: dict[str, tuple[str | None, int]] = {}
        self._tx_max = max(1, min(tx_entries, MAX_TX_ENTRIES))
        self._tx_commits = 0  # transactions committed in a row this pass (the ramp)
        self._replayed = metrics.events_persisted.labels("replay")
        self._recovered = metrics.events_persist_failures.labels("recovered")
        # A pass ends after this long and the next turn continues at once, so
        # a large backlog never looks like a hung worker to the watchdog (a
        # turn may overrun the budget by one insert and its Redis steps).
        self._pass_budget = pass_budget_secs
        self._pass_deadline = float("inf")
        self._more = False
        self.max_turn_secs = max(self.max_turn_secs, pass_budget_secs + 4 * self._insert_timeout)
        self._redis_outage = Outage("event retry: Redis", log)
        # The inline path's breaker (events/persist.py): a committed replay closes it, a
        # pass stopped by the database's health opens it.
        self._breaker = breaker

    # -- the loop ----------------------------------------------------------------

    def run_once(self) -> float:
        self.tick()
        return 0.0 if self._more else self.interval_secs

    def tick(self) -> None:
        try:
            self.run_pass()
        except REDIS_ERRORS as exc:
            # Redis down is an outage to report once, not a bug to trace
            # every turn; the parked events wait in Redis for its return.
            self._redis_outage.failed(describe_redis_error(exc))
            return
        self._redis_outage.ok()

    def wake(self) -> None:
        # A call stuck on a dead database must not run to its own deadline
        # once a stop is asked for: it would eat the shutdown budget.
        self._pool.expire_calls_of(self.ident, STOP_GRACE_SECS)

    def final(self) -> None:
        self.lease.release()

    def run_pass(self) -> PassReport:
        """One cycle: heartbeat, lease, recovery, scan, replay (if leader)."""
        report = PassReport()
        self._more = False
        self._tx_commits = 0
        self._pass_deadline = time.monotonic() + self._pass_budget
        self._heartbeat()
        if not self.lease.acquire():
            # Our own in-flight list can only be left over from a pass (or a
            # process with our id) that failed midway; the leader leaves it
            # alone while our heartbeat lives, so we hand it back ourselves.
            report.inflight_recovered = self._recover_inflight(only_own=True)
            report.depth = sum(self._scan().values())
            self.metrics.events_dead_letter_depth.set(report.depth)
            return report
        report.leader = True
        report.inflight_recovered = self._recover_inflight()
        # Gift bombs a dead process held in memory: their copies are parked now.
        report.inflight_recovered += self._held.recover()
        depths = self._scan()
        report.depth = sum(depths.values())
        self.metrics.events_dead_letter_depth.set(report.depth)
        try:
            for account in sorted(depths):
                if depths[account] > 0:
                    self._replay_account(account, depths[account], report)
        except _Stop as stop:
            report.stopped = stop.reason
            self._more = stop.reason == "budget"
        finally:
            removed = report.stored + report.recovered + report.quarantined
            self.metrics.events_dead_letter_depth.set(max(0, report.depth - removed))
        if removed or report.stopped or report.inflight_recovered:
            log.info("event replay: %d stored, %d already stored, %d quarantined, "
                     "%d of %d parked settled%s", report.stored, report.recovered,
                     report.quarantined, removed, report.depth,
                     f"; stopped early ({report.stopped})" if report.stopped else "")
        return report

    # -- steps -------------------------------------------------------------------

    def _heartbeat(self) -> None:
        # Shared with the other workers of this instance: any of them keeping
        # the key alive says "this instance lives, leave its in-flight lists".
        self._client.set(rediskeys.instance_heartbeat(self.instance), heartbeat_value(),
                         px=self._heartbeat_ms)
        self.metrics.instance_heartbeat.set(time.time())

    def _recover_inflight(self, *, only_own: bool = False) -> int:
        moved_total = 0
        for raw_key in self._client.scan_iter(match=_INFLIGHT_PATTERN, count=1000):
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            try:
                account = rediskeys.account_of(key)
                owner = rediskeys.instance_of_inflight(key)
            except ValueError:
                log.warning("ignoring a key that looks like an in-flight list but is not: %r", key)
                continue
            # Our own list is empty between passes unless an earlier pass (or
            # process with our instance id) died holding it.
            if owner != self.instance and (
                    only_own or self._client.exists(rediskeys.instance_heartbeat(owner))):
                continue
            moved = self._dl.put_back(account, owner)
            if moved:
                log.warning("recovered %d in-flight event(s) of instance %s (account %d)",
                            moved, owner, account)
                moved_total += moved
        return moved_total

    def _scan(self) -> dict[int, int]:
        """Account -> dead-letter length, from one SCAN."""
        keys: list[tuple[int, bytes]] = []
        for raw_key in self._client.scan_iter(match=_DEADLETTER_PATTERN, count=1000):
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            try:
                keys.append((rediskeys.account_of(key), raw_key))
            except ValueError:
                log.warning("ignoring a key that looks like a dead-letter list but is not: %r", key)
        if not keys:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for _, key_bytes in keys:
            pipe.llen(key_bytes)
        lengths = pipe.execute()
        return {account: int(n) for (account, _), n in zip(keys, lengths, strict=True)}

    def _check_going(self, report: PassReport) -> None:
        if self.stop_event.is_set():
            raise _Stop("stopping")
        settled = report.stored + report.recovered + report.quarantined
        if settled and time.monotonic() >= self._pass_deadline:  # a pass always progresses
            raise _Stop("budget")
        if not self.lease.still_held():
            log.warning("event replay: lease lost; stopping the pass")
            raise _Stop("lease")

    def _replay_account(self, account: int, budget: int, report: PassReport) -> None:
        left = budget
        while left > 0:
            self._check_going(report)
            self._heartbeat()
            batch = self._dl.claim(account, self.instance, min(self._batch, left))
            if not batch:
                return
            left -= len(batch)
            self._failpoint("events.retry.claimed")
            try:
                self._replay_batch(account, batch, report)
            except _Stop:
                self._tx_commits = 0
                self._dl.put_back(account, self.instance)
                raise

    def _replay_batch(self, account: int, batch: list[bytes], report: PassReport) -> None:
        """Store one claimed batch, in its order, in as few transactions as the ramp allows."""
        pending = deque(batch)
        ready: deque[_Ready] = deque()
        while pending or ready:
            self._check_going(report)
            self._fill(account, pending, ready, 1, report)
            if ready:
                self._replay_transaction(account, pending, ready, self._tx_size(), report)

    def _fill(self, account: int, pending: deque[bytes], ready: deque[_Ready], want: int,
              report: PassReport) -> None:
        """Decode entries from `pending` until `ready` holds `want` (or none are left).

        Only what the next round trip stores, just before it: a long burst
        of decoding would hold the interpreter lock away from the live paths.
        """
        decoded = 0
        while pending and len(ready) < want:
            item = self._decode(account, pending.popleft(), report)
            if item is not None:
                ready.append(item)
            decoded += 1
            if decoded % _YIELD_EVERY == 0:
                time.sleep(0)  # lets a waiting live path have the interpreter lock

    def _tx_size(self) -> int:
        # The first entries of a pass are committed one at a time: a pass that
        # meets a sick database fails on one entry, not on a batch, and each
        # settles as soon as it is stored. Then the size doubles up to the cap.
        commits = self._tx_commits
        return 1 if commits < 3 else min(self._tx_max, 1 << min(commits - 2, 16))

    def _decode(self, account: int, raw: bytes, report: PassReport) -> _Ready | None:
        """The event of a parked entry and its writer; None when it went to the quarantine."""
        try:
            ev = PlatformEvent.from_entry(raw)
        except EntryError as exc:
            log.error("parked event entry of account %d cannot be decoded (%s); quarantined",
                      account, exc)
            self._quarantine(account, raw, "undecodable", None, report)
            return None
        if datetime.now(UTC) - ev.created_at > self._entry_ttl:
            log.error("parked event %s (account %d, %s) is older than the %s dead-letter TTL; "
                      "quarantined as expired, counted lost", ev.id, account, ev.type,
                      self._entry_ttl)
            self._quarantine(account, raw, "expired", None, report)
            self.metrics.events_persist_failures.labels("lost").inc()
            return None
        kind = record_kind(raw)
        writer = self._records.get(kind) if kind is not None else None
        if kind is not None and writer is None:
            log.error("parked entry %s of account %d is a record of kind %r that this build "
                      "cannot store; quarantined", ev.id, account, kind[:40])
            self._quarantine(account, raw, "undecodable", None, report)
            return None
        return raw, ev, writer

    def _replay_transaction(self, account: int, pending: deque[bytes], ready: deque[_Ready],
                            size: int, report: PassReport) -> None:
        """Insert up to `size` entries from the head of `ready` in one transaction.

        Entries go in groups of up to `_GROUP` under one SAVEPOINT; a group
        that fails is rolled back to it and its entries are redone one per
        SAVEPOINT, so every failure below is one entry's alone. Then
        "already stored" (a unique
        violation) is rolled back alone and counts recovered; any other failure
        is rolled back alone, the entries before it are committed and settled,
        and then it is judged by `_failed` exactly as a lone insert would be
        (quarantined, or the pass stops). When the transaction as a whole fails
        (its connection, its commit), nothing of it is settled: a transaction of
        several entries is retried one entry per transaction, so the failing
        entry is judged alone; a lone entry is judged at once.
        """
        started = time.monotonic()
        done: list[tuple[_Ready, bool]] = []
        failure: tuple[_Ready, Exception] | None = None
        soft_limit = started + self._insert_timeout / 3
        release: str | None = None  # the previous entry's savepoint, released with the next one
        taken = 0  # savepoints taken in this transaction: names never repeat
        singles = 0  # entries to store one per round trip (after a group failed)
        grouped = False  # a group's rollback failed: the transaction is lost
        try:
            with self._pool.transaction(deadline=started + self._insert_timeout) as cur:
                store.prepare_replay(cur)
                while len(done) < size:
                    # Later entries of a transaction get what is left of its one
                    # deadline; stop adding well before it (the first always runs).
                    if done and (time.monotonic() > soft_limit or self.stop_event.is_set()
                                 or time.monotonic() >= self._pass_deadline
                                 or taken >= _MAX_SAVEPOINTS):
                        break
                    self._fill(account, pending, ready, min(_GROUP, size - len(done)), report)
                    if not ready:
                        break
                    group = [] if singles else self._group(ready, size - len(done))
                    if len(group) > 1:
                        savepoint = f"{_SAVEPOINT}_{taken}"
                        taken += 1
                        try:
                            news = store.insert_events_in_one_savepoint(
                                cur, [ev for _, ev, _ in group], savepoint, release)
                        except Exception:  # noqa: BLE001 - each is retried alone below
                            grouped = True
                            cur.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
                            grouped = False
                            release, singles = savepoint, len(group)
                            continue
                        for new in news:
                            done.append((ready.popleft(), new))
                        release = savepoint
                        continue
                    singles = max(0, singles - 1)
                    raw, ev, writer = ready[0]
                    savepoint = f"{_SAVEPOINT}_{taken}"
                    taken += 1
                    try:
                        if writer is None:
                            new = store.insert_event_in_savepoint(cur, ev, savepoint, release)
                        else:
                            cur.execute((f"RELEASE SAVEPOINT {release}; " if release else "")
                                        + f"SAVEPOINT {savepoint}")
                            new = writer(cur, ev)
                    except Exception as exc:  # noqa: BLE001 - classify() judges it below
                        # Fails in turn when the savepoint was never taken: then
                        # the whole transaction is lost (the outer handler).
                        cur.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
                        if not store.already_stored(exc):
                            failure = (ready.popleft(), exc)
                            break
                        new = False
                    release = savepoint
                    done.append((ready.popleft(), new))
        except Exception as exc:  # noqa: BLE001 - classify() judges every failure
            # Nothing of this transaction is committed: everything goes back in order.
            if failure is not None:
                ready.appendleft(failure[0])
            ready.extendleft(reversed([item for item, _ in done]))
            self._tx_commits = 0
            if len(done) + (failure is not None) > 1 or grouped:
                log.info("event replay: a transaction of %d entries failed (%s); retrying them "
                         "one per transaction", len(done) + (failure is not None),
                         type(exc).__name__)
                return
            raw, ev, _ = ready[0]
            self._failed(account, raw, ev, exc, classify(exc), report)
            ready.popleft()  # quarantined (else _failed raised _Stop)
            return
        if self._breaker is not None:
            self._breaker.ok()  # committed: the database answers
        self._settle(account, done, report)
        if failure is not None:
            (raw, ev, _), error = failure
            # An entry's own failure says nothing about the database: the
            # ramp goes on (a transient one raises _Stop, which resets it).
            self._failed(account, raw, ev, error, classify(error), report)
            return
        self._tx_commits += 1

    @staticmethod
    def _group(ready: deque[_Ready], room: int) -> list[_Ready]:
        """The entries at the head of `ready` that can go in one round trip.

        Events (not records), at most `_GROUP` and `room`, none with the
        (platform, external id) of an earlier one in the group: the probe of
        the second would not see the first's row, written by the same query.
        """
        group: list[_Ready] = []
        seen: set[tuple[str, str]] = set()
        for item in ready:
            _, ev, writer = item
            if len(group) >= min(room, _GROUP) or writer is not None:
                break
            if ev.external_id is not None:
                key = (ev.platform, ev.external_id)
                if key in seen:
                    break
                seen.add(key)
            group.append(item)
        return group

    def _settle(self, account: int, done: list[tuple[_Ready, bool]], report: PassReport) -> None:
        """After the commit: drop the entries from our in-flight list, count them."""
        if not done:
            return
        for _ in done:
            self._failpoint("events.retry.inserted")
        self._dl.settle_many(account, self.instance, [raw for (raw, _, _), _ in done])
        stored = recovered = 0
        for (_, ev, writer), new in done:
            self._strikes.pop(str(ev.id), None)
            if new:
                stored += 1
                if writer is None:  # a record's writer counts its own kind
                    self._replayed.inc()
            else:
                recovered += 1
                if writer is None:
                    self._recovered.inc()
        report.stored += stored
        report.recovered += recovered
        for _ in done:
            self._failpoint("events.retry.deleted")

    def _failed(self, account: int, raw: bytes, ev: PlatformEvent, exc: Exception,
                why: Classified, report: PassReport) -> None:
        if why.kind is Kind.ENVIRONMENTAL:
            self.metrics.db_environmental_errors.inc()
        if why.kind is Kind.PERMANENT:
            log.error("parked event %s (account %d, %s) refused by the database (%s); "
                      "quarantined", ev.id, account, ev.type, why.reason)
            self._quarantine(account, raw, "permanent", why.sqlstate, report)
            return
        if self._entry_specific(why):
            key = str(ev.id)
            last_state, count = self._strikes.get(key, (why.sqlstate, 0))
            count = count + 1 if last_state == why.sqlstate else 1
            if count >= self._stuck_after and self._only_this_entry_fails(ev, record_kind(raw)):
                self._strikes.pop(key, None)
                log.error("parked event %s (account %d, %s) failed %d passes in a row with %s; "
                          "quarantined as stuck", ev.id, account, ev.type, count, why.reason)
                self._quarantine(account, raw, "stuck", why.sqlstate, report)
                return
            if len(self._strikes) >= _MAX_STRIKES:
                self._strikes.clear()
            self._strikes[key] = (why.sqlstate, count)
        elif self._breaker is not None:  # the database's health, not this entry's problem
            self._breaker.failed(describe_db_error(exc, why))
        log.warning("event replay stopped at a %s error (%s: %s); the rest waits for the next pass",
                    why.kind.value, why.reason, type(exc).__name__)
        raise _Stop("transient")

    def _only_this_entry_fails(self, ev: PlatformEvent, kind: str | None = None) -> bool:
        """Whether a bare event of the same account and time can be inserted (then rolled back).

        A missing table or a revoked grant fails every entry the same way; quarantining
        them one by one would only empty the dead-letter lists into the quarantine.
        Only a failure the canary does not meet is this entry's own.
        """
        if kind is not None:
            return self._record_canary_passes(ev, kind)
        # Same shape as the entry (an external id takes the dedup path, children
        # touch event_children), so a table-wide problem on either shows here too.
        canary = PlatformEvent.new(
            account_id=ev.account_id, platform=ev.platform, type="lumio.canary", payload={},
            created_at=ev.created_at,
            external_id=f"lumio-canary-{uuid.uuid4()}" if ev.external_id else None,
            children=tuple(EventChild("lumio.canary") for _ in ev.children))
        try:
            with self._pool.connection(deadline=time.monotonic() + self._insert_timeout) as conn:
                store.insert_canary(conn, canary)
        except Exception as exc:  # noqa: BLE001 - any failure: not provably this entry's
            log.warning("event replay: a canary insert fails too (%s); the problem is not "
                        "event %s's own, it stays parked", classify(exc).reason, ev.id)
            return False
        return True

    def _record_canary_passes(self, ev: PlatformEvent, kind: str) -> bool:
        """`_only_this_entry_fails` for a parked record: its writer's canary, on its table."""
        canary = self._records.canary(kind)
        if canary is None:
            return False  # no way to tell the table's problem from the entry's: it waits
        try:
            with self._pool.connection(deadline=time.monotonic() + self._insert_timeout) as conn:
                try:
                    with conn.cursor() as cur:
                        canary(cur, ev)
                finally:
                    conn.rollback()
        except Exception as exc:  # noqa: BLE001 - any failure: not provably this entry's
            log.warning("record replay: a canary write of kind %r fails too (%s); record %s "
                        "stays parked", kind, classify(exc).reason, ev.id)
            return False
        return True

    @staticmethod
    def _entry_specific(why: Classified) -> bool:
        """A retryable failure that may be this entry's own (never a health problem)."""
        state = why.sqlstate
        if state is None or state in _HEALTH_CODES or state[:2] in _HEALTH_CLASSES:
            return False
        return why.kind is not Kind.PERMANENT

    def _quarantine(self, account: int, raw: bytes, reason: str, sqlstate: str | None,
                    report: PassReport) -> None:
        self._dl.quarantine(account, self.instance, raw, reason, sqlstate)
        self.metrics.events_quarantined.labels(reason).inc()
        report.quarantined += 1
