"""Every Prometheus metric of the daemon, on one explicit registry.

`Metrics` is built once by the composition root and passed down; nothing uses
the global default registry, so tests build their own and read values back.
The names other services rely on are kept exactly
(`events_persist_failures_total{outcome}`, `events_dead_letter_depth`,
`chat_*`; docs/operating.rst, "Names other services rely on"). No metric carries an account label:
label values below are small fixed sets.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

CHAT_PATHS = ("buffered", "direct", "spooled", "lost")
FLUSH_RESULTS = ("ok", "failed", "deadlettered", "empty")
PERSIST_OUTCOMES = ("parked", "recovered", "lost", "rejected")
SPOOL_KINDS = ("chat", "event")
#: What a write WAIT did not confirm was (`[redis] min_replicas_acked`, stores/replicas.py).
REPLICA_ACK_WRITES = ("chat", "chat_quarantine", "chat_move", "event", "event_move", "held_gift")
JETSTREAM_OPERATIONS = ("create", "update", "delete")
STATUS_PLATFORMS = ("twitch", "kick")
GAP_PLATFORMS = ("twitch", "kick", "streamelements", "seventv", "jetstream")
GAP_STATUSES = ("healed", "partial", "not_healable")
STATUS_POLL_ERRORS = ("unavailable", "status", "token", "rate_limited", "bad_response")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class HeldChat(Protocol):
    """A source's chat queue, as the depth gauge sees it."""

    def held(self) -> int:
        """Messages in memory and not yet taken by a tier (a thread-safe read)."""
        ...


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = False) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        # prometheus_client's process collector has no thread count.
        self.daemon_threads = Gauge(
            "daemon_threads", "Python threads alive in this process", registry=r)
        self.daemon_threads.set_function(lambda: float(threading.active_count()))

        # -- chat ------------------------------------------------------------
        self.chat_messages = Counter(
            "chat_messages", "Chat messages handed to storage, by the path that took them",
            ["path"], registry=r)
        for path in CHAT_PATHS:
            self.chat_messages.labels(path)
        self.chat_flush_batches = Counter(
            "chat_flush_batches", "Chat flush batches by result", ["result"], registry=r)
        for result in FLUSH_RESULTS:
            self.chat_flush_batches.labels(result)
        self.chat_messages_flushed = Counter(
            "chat_messages_flushed", "Chat messages committed to the database by the flush worker",
            registry=r)
        self.chat_flush_duration = Histogram(
            "chat_flush_duration_seconds", "Time of one flush pass over all accounts",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.chat_buffer_depth = Gauge(
            "chat_buffer_depth", "Chat messages waiting in Redis buffers (and in flight)", registry=r)
        self.chat_dead_letter_depth = Gauge(
            "chat_dead_letter_depth", "Chat messages in Redis dead-letter lists", registry=r)
        self.chat_dead_letters_replayed = Counter(
            "chat_dead_letters_replayed", "Dead-lettered chat messages committed by the drain",
            registry=r)
        self.chat_quarantined = Counter(
            "chat_quarantined", "Chat messages moved to a quarantine list", registry=r)
        self.chat_sanitized = Counter(
            "chat_sanitized", "Chat messages whose values were repaired at the edge "
            "(NUL, lone surrogate, over-long)", registry=r)
        self.chat_persistence_queue_depth = Gauge(
            "chat_persistence_queue_depth", "Chat messages held in memory by sources", registry=r)
        # Summed from the sources' queues when scraped: exact at every scrape, and no
        # per-message `.inc()` (a lock and a float add) on the sources' hot path.
        self._chat_queues: weakref.WeakSet[HeldChat] = weakref.WeakSet()
        self._chat_queues_lock = threading.Lock()
        self.chat_persistence_queue_depth.set_function(self._chat_held)

        # -- events ----------------------------------------------------------
        self.events_persist_failures = Counter(
            "events_persist_failures", "Failed event inserts by outcome; any lost is event loss",
            ["outcome"], registry=r)
        for outcome in PERSIST_OUTCOMES:
            self.events_persist_failures.labels(outcome)
        self.events_dead_letter_depth = Gauge(
            "events_dead_letter_depth", "Parked events across all accounts", registry=r)
        self.events_persisted = Counter(
            "events_persisted", "Events stored by an inline insert or a replay", ["path"], registry=r)
        for path in ("inline", "replay", "emit"):
            self.events_persisted.labels(path)
        self.events_quarantined = Counter(
            "events_quarantined", "Events moved to a quarantine list, by reason", ["reason"], registry=r)
        for reason in ("expired", "permanent", "undecodable", "stuck"):
            self.events_quarantined.labels(reason)
        self.events_insert_duration = Histogram(
            "events_insert_duration_seconds", "Time of one inline event insert, pool wait included",
            buckets=_LATENCY_BUCKETS, registry=r)

        # -- database --------------------------------------------------------
        self.db_environmental_errors = Counter(
            "db_environmental_errors",
            "Writes that failed for a missing table, column, function or grant: "
            "a migration or GRANT is needed (data is kept, not refused)", registry=r)

        # -- spool -----------------------------------------------------------
        self.spool_records = Counter(
            "spool_records", "Records written to and replayed from the local spool",
            ["kind", "op"], registry=r)
        for kind in SPOOL_KINDS:
            for op in ("written", "replayed"):
                self.spool_records.labels(kind, op)
        self.spool_bytes = Gauge("spool_bytes", "Bytes in the local spool not yet replayed", registry=r)
        self.spool_lost = Counter(
            "spool_lost", "Records the spool could not take, by reason", ["kind", "reason"], registry=r)
        self.spool_torn_tails = Counter(
            "spool_torn_tails", "Torn or corrupt spool tails truncated at start", registry=r)

        # -- sources ---------------------------------------------------------
        self.source_connects = Counter(
            "source_connects", "Platform connections established", ["platform"], registry=r)
        self.source_connect_failures = Counter(
            "source_connect_failures", "Platform connection attempts that failed", ["platform"],
            registry=r)
        self.source_disconnects = Counter(
            "source_disconnects", "Platform connections lost (reconnected after)", ["platform"],
            registry=r)
        self.source_frames = Counter(
            "source_frames", "Frames read from platform sockets and webhooks, by what they became",
            ["platform", "kind"], registry=r)
        self.source_bad_frames = Counter(
            "source_bad_frames", "Frames refused as malformed or unsupported, or as another "
            "account's (foreign_channel, unsubscribed), by reason",
            ["platform", "reason"], registry=r)
        self.source_duplicates = Counter(
            "source_duplicates", "Frames skipped because their delivery id was handled already",
            ["platform"], registry=r)
        self.source_closes = Counter(
            "source_closes", "Platform connections closed by the peer, by close code",
            ["platform", "code"], registry=r)
        self.source_revocations = Counter(
            "source_revocations", "Platform subscriptions revoked by the platform, by status",
            ["platform", "status"], registry=r)
        self.source_subscriptions = Counter(
            "source_subscriptions", "Platform subscription requests, by result (ok, exists: held "
            "already by this or another live connection of ours, orphan_replaced: taken back from "
            "a connection lost without a clean close, failed: refused, late, retried: a refused "
            "one asked again)", ["platform", "result"],
            registry=r)
        self.source_token_refreshes = Counter(
            "source_token_refreshes", "OAuth token refreshes, by result", ["platform", "result"],
            registry=r)
        self.source_state = Gauge(
            "source_state", "Platform sources by connection state (connecting, connected, backoff: "
            "waiting to reconnect, stopped)", ["platform", "state"], registry=r)
        self.source_reconnect_handoffs = Counter(
            "source_reconnect_handoffs", "Planned connection hand-offs (session_reconnect), by result",
            ["platform", "result"], registry=r)

        # -- gaps and healing --------------------------------------------------
        self.source_gaps = Counter(
            "source_gaps", "Gaps of platform sources (a stretch not connected and subscribed) "
            "closed in the ledger, by platform and final status (healed, partial, not_healable)",
            ["platform", "status"], registry=r)
        self.source_gap_seconds = Counter(
            "source_gap_seconds", "Length of the gaps recorded in the ledger, in seconds",
            ["platform"], registry=r)
        self.source_gap_healed_rows = Counter(
            "source_gap_healed_rows", "Events stored by healing from a platform's history that "
            "the live path had not stored (late, never sent as live alerts)", ["platform"], registry=r)
        self.source_heal_requests = Counter(
            "source_heal_requests", "Requests to the platforms' history APIs made by healing, by "
            "result (ok, retry: 5xx, 429, timeout or garbage, failed: refused for good)",
            ["platform", "result"], registry=r)
        self.source_heal_duration = Histogram(
            "source_heal_duration_seconds", "Time from a gap's end to its ledger row closed by "
            "healing", ["platform"], buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
            registry=r)
        for platform in GAP_PLATFORMS:
            self.source_gap_seconds.labels(platform)
            self.source_gap_healed_rows.labels(platform)
            for status in GAP_STATUSES:
                self.source_gaps.labels(platform, status)

        # -- streamelements ----------------------------------------------------
        # Connections, frames and subscribe results are the shared source_* metrics
        # with platform="streamelements".
        self.streamelements_subscribe_errors = Counter(
            "streamelements_subscribe_errors", "Astro subscribe requests answered with an error, "
            "by error (err_unauthorized: the token or its scope is wrong)", ["error"], registry=r)
        for error in ("err_unauthorized", "err_bad_request", "invalid_message_type",
                      "err_deadline_exceeded", "err_internal_error", "rate_limit_exceeded", "other"):
            self.streamelements_subscribe_errors.labels(error)
        self.streamelements_upgrade_refused = Counter(
            "streamelements_upgrade_refused", "Astro WebSocket upgrades refused with an HTTP status "
            "(429: rate limited, Retry-After honoured; 502: draining server)", ["status"], registry=r)
        for status in ("429", "502", "503", "other"):
            self.streamelements_upgrade_refused.labels(status)
        self.streamelements_pii_removed = Counter(
            "streamelements_pii_removed", "Donor PII fields (email, geolocation, IP) removed from "
            "StreamElements documents before storage", registry=r)

        # -- gifts, alerts, webhooks, emit -----------------------------------
        self.events_gift_bombs = Counter(
            "events_gift_bombs", "Community gifts (gift bombs), each counted once however many "
            "gifted subs it has", ["platform"], registry=r)
        self.events_gift_recipients = Counter(
            "events_gift_recipients", "Gifted subs, by whether they were linked to their gift",
            ["platform", "linked"], registry=r)
        self.events_alerts_published = Counter(
            "events_alerts_published", "Live alerts handed to a sink", ["sink"], registry=r)
        for sink in ("redis", "sse"):
            self.events_alerts_published.labels(sink)
        self.events_alerts_dropped = Counter(
            "events_alerts_dropped", "Live alerts not delivered (best effort: the event itself is "
            "stored), by reason", ["reason"], registry=r)
        for reason in ("queue_full", "redis_error", "client_slow", "shutdown"):
            self.events_alerts_dropped.labels(reason)
        self.http_alert_streams = Gauge(
            "http_alert_streams", "Open alert streams (Server-Sent Events)", registry=r)
        self.http_alert_streams_dropped = Counter(
            "http_alert_streams_dropped", "Alert stream clients dropped because they fell behind",
            registry=r)
        self.http_webhook_requests = Counter(
            "http_webhook_requests", "Webhook deliveries, by platform and result",
            ["platform", "result"], registry=r)
        self.http_emit_requests = Counter(
            "http_emit_requests", "POST /v1/events/emit requests, by status code", ["status"],
            registry=r)
        self.frames_quarantined = Counter(
            "frames_quarantined", "Refused frames kept with their raw bytes in the file "
            "quarantine (kept), or only counted because it could not be written (failed)",
            ["result"], registry=r)
        for result in ("kept", "failed"):
            self.frames_quarantined.labels(result)
        self.http_refused = Counter(
            "http_refused", "HTTP connections and requests refused by the listener's limits, "
            "by reason (busy: no request slot; connections: the connection cap, the oldest "
            "unfinished one was cut; per_client: max_connections_per_client; timeout: not "
            "read within the deadline)", ["reason"], registry=r)
        for reason in ("busy", "connections", "per_client", "timeout"):
            self.http_refused.labels(reason)
        self.stream_session_writes = Counter(
            "events_stream_session_writes", "stream_sessions changes, by result (failed ones are "
            "retried)", ["result"], registry=r)

        # -- stream status and viewer statistics ----------------------------
        self.source_status_poll_duration = Histogram(
            "source_status_poll_duration_seconds", "Time of one live-status request to a "
            "platform API (failed ones included)", ["platform"], buckets=_LATENCY_BUCKETS,
            registry=r)
        self.source_status_poll_errors = Counter(
            "source_status_poll_errors", "Live-status requests that failed, by platform and "
            "reason (the accounts they covered are polled again next round)",
            ["platform", "reason"], registry=r)
        self.source_status_polls = Counter(
            "source_status_polls", "Live-status requests answered, by platform", ["platform"],
            registry=r)
        for platform in STATUS_PLATFORMS:
            self.source_status_polls.labels(platform)
            self.source_status_poll_duration.labels(platform)
            for reason in STATUS_POLL_ERRORS:
                self.source_status_poll_errors.labels(platform, reason)
        self.events_stream_sessions_by_poll = Counter(
            "events_stream_sessions_by_poll", "Stream sessions opened or closed by the "
            "stream-status poller: the sockets missed the stream.online/offline", ["change"],
            registry=r)
        for change in ("opened", "closed"):
            self.events_stream_sessions_by_poll.labels(change)
        self.stream_stats_windows = Counter(
            "events_stream_stats_windows", "Minute windows of viewer statistics: written, parked "
            "(Redis or the spool; stored later), replayed (merged from there), lost", ["outcome"],
            registry=r)
        for outcome in ("written", "parked", "replayed", "lost"):
            self.stream_stats_windows.labels(outcome)

        # -- jetstream -------------------------------------------------------
        # Reconnects and refused frames are the shared source_disconnects and
        # source_bad_frames{platform="bluesky"}.
        self.jetstream_events = Counter(
            "jetstream_events", "Jetstream events decoded, by kind and commit operation "
            "(operation is none for identity and account)", ["kind", "operation"], registry=r)
        for op in JETSTREAM_OPERATIONS:
            self.jetstream_events.labels("commit", op)
        self.jetstream_events.labels("identity", "none")
        self.jetstream_events.labels("account", "none")
        self.jetstream_records = Counter(
            "jetstream_records", "Jetstream commits by what the store did with them: written, "
            "stale (not newer than the stored state), unwanted (outside the filters), refused",
            ["result"], registry=r)
        for result in ("written", "stale", "unwanted", "refused"):
            self.jetstream_records.labels(result)
        self.jetstream_batches = Counter(
            "jetstream_batches", "Jetstream batches by result (a failed one is replayed after "
            "reconnecting)", ["result"], registry=r)
        for result in ("committed", "failed"):
            self.jetstream_batches.labels(result)
        self.jetstream_cursor_lag = Gauge(
            "jetstream_cursor_lag_seconds", "Wall clock minus the time of the last committed "
            "Jetstream cursor, at its commit", registry=r)
        self.jetstream_cursor_gaps = Counter(
            "jetstream_cursor_gaps", "Resumes from a cursor older than the server's assumed "
            "retention: events in between may be missing", registry=r)

        # -- timescaledb compression ------------------------------------------
        self.timescale_chunks = Gauge(
            "timescale_chunks", "Chunks of chat_messages and events, by table and state "
            "(compressed, uncompressed), at the last compression run", ["table", "state"], registry=r)
        self.timescale_bytes = Gauge(
            "timescale_bytes", "Bytes of chat_messages and events by table and state: "
            "compressed_before (what the compressed chunks took before), compressed_after "
            "(what they take), uncompressed (the other chunks), at the last compression run",
            ["table", "state"], registry=r)
        self.timescale_compression_runs = Counter(
            "timescale_compression_runs", "Runs of the compression policies by this process, "
            "by result (ok, failed)", ["result"], registry=r)
        for result in ("ok", "failed"):
            self.timescale_compression_runs.labels(result)

        # -- 7tv -------------------------------------------------------------
        # Connections, closes, refused frames and subscriptions are the shared
        # source_* metrics with platform="seventv".
        self.seventv_changes = Counter(
            "seventv_changes", "7TV emote changes handed to persist_event, by change (added, "
            "removed, renamed), path (eventapi, rest) and outcome (taken, duplicate, rejected, lost)",
            ["change", "via", "outcome"], registry=r)
        for change in ("added", "removed", "renamed"):
            for via in ("eventapi", "rest"):
                self.seventv_changes.labels(change, via, "taken")
        self.seventv_dispatches = Counter(
            "seventv_dispatches", "7TV dispatches by what they did: applied, unchanged (a repeat, "
            "or already known), not_followed, not_ready (no stored state yet, or the last one not "
            "saved: a heal covers it), stale (disagrees with the stored state, e.g. a rename from a "
            "name the emote no longer has: nothing of it applied, the account healed)", ["result"],
            registry=r)
        for result in ("applied", "unchanged", "not_followed", "not_ready", "stale"):
            self.seventv_dispatches.labels(result)
        self.seventv_heals = Counter(
            "seventv_heals", "7TV emote sets fetched through the REST API and compared with the "
            "stored state, by result (baseline, unchanged, changed, failed)", ["result"], registry=r)
        for result in ("baseline", "unchanged", "changed", "failed"):
            self.seventv_heals.labels(result)
        self.seventv_api_errors = Counter(
            "seventv_api_errors", "7TV REST answers not used, by endpoint (users_twitch, users, "
            "emote_sets) and reason (too_large: above the endpoint's cap; deadline: not complete "
            "within api_timeout; unavailable; status: not 200/404; shape: not the documented "
            "body); the heal is tried again later", ["endpoint", "reason"], registry=r)
        for endpoint in ("users_twitch", "users", "emote_sets"):
            for reason in ("too_large", "deadline"):
                self.seventv_api_errors.labels(endpoint, reason)
        self.seventv_state_saves = Counter(
            "seventv_state_saves", "Saves of 7TV emote set state, by result (saved, failed: retried, "
            "conflict: another writer moved it)", ["result"], registry=r)
        for result in ("saved", "failed", "conflict"):
            self.seventv_state_saves.labels(result)
        self.seventv_sockets = Gauge(
            "seventv_sockets", "7TV EventAPI connections open", registry=r)
        self.seventv_subscriptions = Gauge(
            "seventv_subscriptions", "7TV EventAPI subscriptions held, across connections", registry=r)

        # -- redis, leases, workers -----------------------------------------
        self.redis_noeviction = Gauge(
            "redis_maxmemory_policy_noeviction",
            "1 when Redis runs with maxmemory-policy noeviction, 0 when it may evict our keys",
            registry=r)
        self.redis_aof_enabled = Gauge(
            "redis_aof_enabled", "1 when Redis runs with appendonly yes", registry=r)
        self.redis_replica_ack_failures = Counter(
            "redis_replica_ack_failures", "Writes to Redis that WAIT did not confirm on "
            "min_replicas_acked replicas in time (or whose node failed), by what was written; "
            "each took its next tier (database, spool) instead of counting as done",
            ["write"], registry=r)
        for write in REPLICA_ACK_WRITES:
            self.redis_replica_ack_failures.labels(write)
        self.instance_heartbeat = Gauge(
            "instance_heartbeat_timestamp_seconds", "When this process last refreshed its "
            "instance heartbeat in Redis (Unix time)", registry=r)
        self.lease_held = Gauge("lease_held", "1 while this process holds the lease", ["lease"], registry=r)
        self.worker_errors = Counter(
            "worker_errors", "Exceptions caught at a worker's loop boundary", ["worker"], registry=r)
        self.worker_restarts = Counter(
            "worker_restarts", "Workers restarted by the supervisor after they died", ["worker"],
            registry=r)
        self.config_reloads = Counter(
            "config_reloads", "SIGHUP reloads: applied, or refused (the configuration had problems, "
            "or the accounts could not be built; nothing changed)", ["result"], registry=r)
        self.membership_instances = Gauge(
            "membership_instances", "shard = auto: live instances this replica saw at its last turn",
            registry=r)
        self.membership_accounts = Gauge(
            "membership_accounts", "shard = auto: accounts this replica runs now", registry=r)
        self.account_workers_reconciled = Counter(
            "account_workers_reconciled", "Account workers a reload stopped (removed or changed "
            "accounts) and started (added or changed accounts)", ["action"], registry=r)

    def hold_chat(self, queue: HeldChat) -> None:
        """Count `queue.held()` in `chat_persistence_queue_depth` while `queue` lives."""
        with self._chat_queues_lock:
            self._chat_queues.add(queue)

    def chat_held(self) -> int:
        """Chat messages the sources' queues hold in memory now (`chat_persistence_queue_depth`)."""
        with self._chat_queues_lock:
            queues = list(self._chat_queues)
        return sum(q.held() for q in queues)

    def _chat_held(self) -> float:
        return float(self.chat_held())
