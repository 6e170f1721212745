"""The composition root: `build()` makes and wires every part of the daemon.

The spool, the Redis client and the database pool, chat and event ingest, the
stores, the sources of every platform, the timer workers, the chat flush
threads and the HTTP routes. Each platform has one `build(cfg, deps)` (under
`sources/<platform>/`); `PLATFORMS` lists them and `_account_parts` calls
them in a loop with one `SourceDeps`, the implementations of
`sources/interfaces.py` made here. What depends on the accounts is built again
on SIGHUP (runtime/reconcile.py).

Contacts no server but for one bounded Redis call: the instance claim. Nothing
durable is held here: what the parts hold is theirs (chat/, events/, stores/).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lumio_ingestd import exitcodes
from lumio_ingestd.config import Config
from lumio_ingestd.eventgate import EventGate
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.health import ReadinessProbe
from lumio_ingestd.runtime.reconcile import AccountParts, AccountWorkers
from lumio_ingestd.sources import Build, SourceDeps, streamstatus, synthetic
from lumio_ingestd.sources import jetstream as jetstream_platform
from lumio_ingestd.sources import kick as kick_platform
from lumio_ingestd.sources import seventv as seventv_platform
from lumio_ingestd.sources import streamelements as streamelements_platform
from lumio_ingestd.sources import twitch as twitch_platform
from lumio_ingestd.sources.base import Source
from lumio_ingestd.web.server import Routes
from lumio_ingestd.worker import Worker

if TYPE_CHECKING:
    import redis

    from lumio_ingestd.cluster.instances import ClaimKeeper, InstanceClaim
    from lumio_ingestd.cluster.membership import Membership

log = logging.getLogger("lumio_ingestd.app")

#: Every platform's build, in the order their workers start (and stop).
PLATFORMS: tuple[Build, ...] = (twitch_platform.build, streamelements_platform.build, kick_platform.build,
                                jetstream_platform.build, seventv_platform.build, streamstatus.build)
#: `shard = auto`: the lease of a one-replica timer (a dead holder's lapses within it).
LEADER_LEASE_TTL_SECS = 30.0
#: How often the spool is replayed while it holds anything.
SPOOL_REPLAY_INTERVAL_SECS = 5.0
#: Threads that heal gaps from the platforms' history APIs (each gap is one job at a time).
HEAL_THREADS = 2


class StartupError(Exception):
    """The daemon cannot start (a port taken, the spool unusable); `code` is the exit code."""

    def __init__(self, message: str, code: int = exitcodes.UNAVAILABLE) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Parts:
    """What `build()` made: the workers by role, the routes, what to close at the end."""

    sources: list[Worker] = field(default_factory=list)
    timers: list[Worker] = field(default_factory=list)
    flushers: list[Worker] = field(default_factory=list)
    routes: Routes = field(default_factory=Routes)
    probe: ReadinessProbe | None = None
    #: The account-dependent workers and routes, which SIGHUP reconciles (reconcile.py).
    accounts: AccountWorkers | None = None
    #: `shard = auto` only: the live replicas and the accounts this one runs.
    membership: Membership | None = None
    #: INDEX/COUNT only: the instance claim; the accounts run only while it is held.
    claim_keeper: ClaimKeeper | None = None
    #: Closed in this order after the shutdown stages, each with its name for the log.
    closers: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    #: Told when the shutdown begins, with the sources' deadline (monotonic): the event path
    #: then parks rather than waits (events/persist.py, `EventIngest.stopping`).
    stopping: list[Callable[[float], None]] = field(default_factory=list)
    #: Events whose insert is still in flight on the given threads (counted lost at exit
    #: when a source did not stop in time).
    events_in_progress: Callable[[set[int]], int] = lambda threads: 0


Builder = Callable[[Config, Metrics], Parts]


def _claim_instance(cfg: Config, client: redis.Redis) -> InstanceClaim:
    """Refuse to start while another live process runs with the same instance id.

    Two such processes would share every in-flight key and every owner key; the
    claim tokens keep them from deleting each other's batches, and this keeps the
    second one from running at all. Redis unreachable: started all the same, but
    with no account (the claim's `held` is False) until the claim is taken: by
    the membership with `shard = auto`, by a `ClaimKeeper` otherwise. A process
    that finds the claim held then runs none (cluster/instances.py).
    """
    from lumio_ingestd.chat.flusher import default_heartbeat_ttl
    from lumio_ingestd.cluster.instances import InstanceClaim
    from lumio_ingestd.stores.redisclient import REDIS_ERRORS

    claim = InstanceClaim(client, cfg.daemon.instance_id, default_heartbeat_ttl(cfg))
    try:
        holder = claim.take()
    except REDIS_ERRORS as exc:
        log.warning("cannot check whether instance id %r is in use (Redis: %s); starting with no "
                    "account until this process holds the instance claim", cfg.daemon.instance_id,
                    type(exc).__name__)
        return claim
    if holder is not None:
        raise StartupError(
            f"instance id {cfg.daemon.instance_id!r} is in use by another running process "
            f"({holder}); give each replica its own [daemon] instance_id (or leave it empty for "
            f"hostname:pid). A crashed process's claim expires within "
            f"{default_heartbeat_ttl(cfg):.0f}s")
    return claim


def build(cfg: Config, metrics: Metrics) -> Parts:
    """Make and wire every part of the daemon. Contacts no server (no reachability gate)
    but for one bounded Redis call: the instance claim (`_claim_instance`)."""
    # Imported here so that the runtime above stays importable on its own.
    from lumio_ingestd.chat.deadletter import ChatDeadLetterDrain
    from lumio_ingestd.chat.flusher import default_heartbeat_ttl, flush_threads
    from lumio_ingestd.chat.ingest import ChatIngest, ChatQueue, chat_spool_handler
    from lumio_ingestd.cluster.instances import ClaimKeeper
    from lumio_ingestd.cluster.lease import Lease, LeaseGated
    from lumio_ingestd.cluster.membership import Membership
    from lumio_ingestd.db.pool import Pool
    from lumio_ingestd.events import EventIngest, EventRetryWorker, event_spool_handler
    from lumio_ingestd.events.alerts import STREAM_PATH, AlertPublisher, stream_handler
    from lumio_ingestd.events.gaps import GapLedgerWorker, HealQueue, HealWorker
    from lumio_ingestd.events.held import HeldGifts
    from lumio_ingestd.events.probe import InsertProbe
    from lumio_ingestd.events.records import RecordWriters
    from lumio_ingestd.events.streamstats import KIND as STATS_KIND
    from lumio_ingestd.events.streamstats import StreamStats, canary_record
    from lumio_ingestd.lifecycle.backfill import StartupBackfill
    from lumio_ingestd.lifecycle.compression import CompressionWorker
    from lumio_ingestd.lifecycle.retention import RetentionWorker
    from lumio_ingestd.sources.kick import webhook_key
    from lumio_ingestd.sources.kick.signature import KeyFormatError
    from lumio_ingestd.stores import rediskeys, refused_frames
    from lumio_ingestd.stores.gaps import GapTable
    from lumio_ingestd.stores.jetstream import JetstreamStore
    from lumio_ingestd.stores.redisclient import connect
    from lumio_ingestd.stores.replicas import replica_acks
    from lumio_ingestd.stores.seen import SeenDeliveries
    from lumio_ingestd.stores.sessions import StreamSessions
    from lumio_ingestd.stores.seventv import SetStateStore
    from lumio_ingestd.stores.sourceseen import SourceSeen
    from lumio_ingestd.stores.spool import Spool, SpoolError, SpoolReplayer
    from lumio_ingestd.web.emit import MAX_BODY_BYTES as EMIT_MAX_BODY
    from lumio_ingestd.web.emit import PATH as EMIT_PATH
    from lumio_ingestd.web.emit import emit_handler

    # Checked before anything is opened: a bad key file is a configuration error.
    try:
        kick_key = webhook_key(cfg)
    except KeyFormatError as exc:
        raise StartupError(str(exc), exitcodes.CONFIG) from exc
    parts = Parts()
    client = connect(cfg.redis)
    try:
        claim = _claim_instance(cfg, client)
    except StartupError:
        client.close()
        raise
    spool = Spool(cfg.daemon.state_dir / "spool", cfg.daemon.spool_max_bytes, metrics)
    try:
        spool.open()
    except SpoolError as exc:
        client.close()
        raise StartupError(f"cannot open the spool: {exc}") from exc
    pool = Pool(cfg.timescale)
    # Closed last: every part above may still write into them while it stops.
    parts.closers += [("spool", spool.close), ("database pool", pool.close), ("redis", client.close)]

    chat = ChatIngest(client, pool, spool, metrics, cfg)
    # Writers of parked records (non-event rows on the events' park/spool path).
    records = RecordWriters()
    # One breaker for the whole process (events.breaker): every source's inline insert, the
    # webhooks, the retry worker, the probe and the stream sessions share it.
    events = EventIngest(client, pool, spool, metrics, cfg, records=records)
    parts.stopping.append(events.stopping)
    parts.events_in_progress = events.in_progress
    stats = StreamStats(pool, events.deadletters, spool, metrics,
                        timeout_secs=cfg.events.insert_timeout_secs)
    records.register(STATS_KIND, stats.write_record, canary_record)
    spool_handlers = {"chat": chat_spool_handler(chat), "event": event_spool_handler(events)}

    def replay(kind: str, entries: list[bytes]) -> None:
        spool_handlers[kind](kind, entries)

    # Live alerts: Redis PUBLISH on its own thread, SSE clients on the HTTP port.
    # Under a chat flood an event goes first: chat steps aside while it is on its way.
    gate = EventGate()
    alerts = AlertPublisher(client, metrics, gate=gate)
    seen = {platform: SeenDeliveries(client, platform) for platform in ("twitch", "kick")}
    # The gaps ledger: every source's paths say when they are up; gaps heal on their own threads.
    heal_queue = HealQueue()
    gap_table = GapTable(pool)
    ledger = GapLedgerWorker(SourceSeen(client), gap_table, metrics, heal_queue,
                             seen_interval_secs=cfg.daemon.seen_interval_secs)
    heal_workers = [HealWorker(f"gap-heal-{n}", heal_queue, gap_table, metrics,
                               heal_max_hours=cfg.daemon.heal_max_hours)
                    for n in range(1, HEAL_THREADS + 1)]
    deps = SourceDeps(
        metrics=metrics,
        chat_queue=lambda name: ChatQueue(chat, metrics, step_aside=gate.step_aside),
        persist_chat=chat.buffer_or_persist,
        persist_event=events.persist_event,
        alerts=alerts,
        sessions=StreamSessions(pool, metrics, breaker=events.breaker),
        seen=seen.__getitem__,
        # Refused frames keep their raw bytes (docs/operating.rst, "Refused frames").
        frames=refused_frames.for_config(cfg, metrics),
        held_gifts=HeldGifts(client, cfg.daemon.instance_id,
                             acks=replica_acks(client, cfg.redis, metrics)),
        set_states=SetStateStore(pool),
        jetstream=JetstreamStore(pool),
        stats=stats,
        kick_webhook_key=kick_key,
        gaps=ledger,
    )
    parts.sources = synthetic.build(cfg, deps).sources

    def account_parts(cfg: Config, metrics: Metrics) -> AccountParts:
        """Everything made from cfg.accounts; run again on SIGHUP (see reconcile.py)."""
        out = AccountParts()
        for platform_build in PLATFORMS:
            built = platform_build(cfg, deps)
            for worker in built.sources:
                if isinstance(worker, Source):
                    worker.gaps = deps.gaps  # one place for every platform (sources/base.py)
            out.sources += built.sources
            out.timers += built.timers
            for method, pattern, handler, max_body in built.routes:
                out.routes.add(method, pattern, handler, max_body_bytes=max_body)
            for timer in built.leader_timers:
                # With `shard = auto` every replica builds it and a lease picks the one that runs it.
                out.timers.append(LeaseGated(timer, Lease(
                    client, rediskeys.leader_key(timer.name), LEADER_LEASE_TTL_SECS, metrics,
                    owner=cfg.daemon.instance_id), LEADER_LEASE_TTL_SECS)
                    if cfg.daemon.shard_auto else timer)
        return out

    parts.accounts = AccountWorkers(account_parts, metrics)
    heartbeat_ttl = default_heartbeat_ttl(cfg)
    if cfg.daemon.shard_auto:
        # Nothing runs until the membership's first turn hands accounts out.
        parts.membership = Membership(client, cfg.daemon.instance_id, heartbeat_ttl, metrics,
                                      claim=claim)
        parts.membership.set_accounts(a.account_id for a in cfg.accounts)
        initial = parts.accounts.initial(replace(cfg, owned=frozenset()))
    else:
        parts.claim_keeper = ClaimKeeper(claim, metrics)
        initial = parts.accounts.initial(cfg if claim.held else replace(cfg, owned=frozenset()))
    parts.sources += initial.sources
    parts.accounts.add_routes(parts.routes)
    parts.routes.add("POST", EMIT_PATH, emit_handler(events.insert_event, alerts, cfg.http.emit_token,
                                                     metrics), max_body_bytes=EMIT_MAX_BODY)
    parts.routes.add("GET", STREAM_PATH, stream_handler(alerts, cfg.http.emit_token, metrics))
    parts.flushers = list(flush_threads(
        client, pool, metrics, cfg, heartbeat_ttl_secs=heartbeat_ttl,
        owns=parts.membership.flushes if parts.membership is not None else None,
        step_aside=gate.step_aside, db_unwell=lambda: events.breaker.open))
    parts.timers = [
        ChatDeadLetterDrain(client, pool, metrics, cfg),
        EventRetryWorker(client, pool, metrics, cfg, records=records, breaker=events.breaker),
        InsertProbe(events, metrics),
        SpoolReplayer(spool, replay, metrics, SPOOL_REPLAY_INTERVAL_SECS),
        alerts,
        RetentionWorker(pool, cfg, metrics),
        StartupBackfill(cfg, metrics),
        ledger,
        *heal_workers,
    ]
    if cfg.leads:
        # One replica compresses: shard 0, or with `shard = auto` the lease holder.
        compression = CompressionWorker(cfg, metrics)
        parts.timers.append(LeaseGated(compression, Lease(
            client, rediskeys.leader_key(compression.name), LEADER_LEASE_TTL_SECS, metrics,
            owner=cfg.daemon.instance_id), LEADER_LEASE_TTL_SECS)
            if cfg.daemon.shard_auto else compression)
    parts.timers += initial.timers
    if parts.membership is not None:
        parts.timers.append(parts.membership)
    if parts.claim_keeper is not None:
        parts.timers.append(parts.claim_keeper)
    parts.probe = ReadinessProbe(client, pool, metrics)
    return parts
