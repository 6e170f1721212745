"""The stream-status poller: the live status of every account, a safety net for the sockets.

One worker thread (`StreamStatusPoller`, a timer of the composition root).
Every `[streamstatus] interval_secs` (jittered by +-10 %) it asks each
platform of `[streamstatus] platforms` whose API client is configured which
accounts of this shard are live:

- Twitch: Helix `GET {helix_url}/streams?user_id=..` (up to 100 ids per
  request), with an app token (client-credentials grant at
  `{[twitch] oauth_url}/token`, sources/apptoken.py) and `Client-Id`. The
  token bucket's `Ratelimit-Remaining` / `Ratelimit-Reset` headers are
  honoured: an empty bucket is waited out when it refills within one request
  timeout, else the rest of the round is skipped.
- Kick: `GET {[kick] api_url}/livestreams?broadcaster_user_id=..` (up to 50
  ids per request; Kick's public API), with an app token from
  `{[kick] oauth_url}/oauth/token`. Its answer names no stream: the stream
  id is derived from the account and the start time (`kick_stream_key`), as
  the Kick socket and webhook derive theirs.

A 401 drops the token and retries once with a fresh one. Every request is
bounded by `[streamstatus] request_timeout_secs`, and a stop cuts the one in
flight (`Cancel`, from `wake()`). The first failure of a platform (timeout,
error status, no token) ends that platform's round: its remaining accounts
are polled next round, and the next platform waits at most one timeout
for it.

What a round does with the answers (per polled account):

- live: a sample (viewers, title, category) for the minute statistics
  (events/streamstats.py); a stream the poller does not track yet is stored as a
  `stream.online` event through the `EventSink` (persist_event, the live
  alert, `stream_sessions`) with the stream id as `external_id`, as the
  socket does: if the socket stored it first, it is a duplicate and nothing
  changes (counted "opened" only when taken now).
- offline: a stream the poller saw live, or an open `stream_sessions` row
  (from the socket, or from before a restart) older than
  `start_grace_secs`, is closed after `offline_polls` (2) consecutive offline
  answers: a `stream.offline` event keyed `offline_external_id(stream id)`
  (stores/sessions.py; the socket's offline gets the same key in the `EventSink`),
  at the last time the poller saw it live (or, for a session it never saw
  live, the first offline answer). One offline blip does not close it.

Nothing durable here: events are as durable as `persist_event` says, the
samples as the statistics store's flush says (`final()` writes the current
partial minute at a stop).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import OpenSession, PlatformEvent, StreamChange, offline_external_id
from lumio_ingestd.outage import Outage
from lumio_ingestd.sources import Built, SourceDeps
from lumio_ingestd.sources.apptoken import AppToken
from lumio_ingestd.sources.httpclient import Cancel, join
from lumio_ingestd.sources.interfaces import OpenSessions, StatsSink
from lumio_ingestd.sources.kick.livestreams import KickLivestreams
from lumio_ingestd.sources.sink import TAKEN, EventSink
from lumio_ingestd.sources.statusclient import LiveStream, PollError, StatusClient
from lumio_ingestd.sources.twitch.streams import HelixStreams
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.sources.streamstatus")

#: Consecutive offline answers that close a session.
OFFLINE_POLLS = 2
#: An open session the poller never saw live is left alone this long after its start:
#: the platform's status API may lag the socket's stream.online by a minute or two.
START_GRACE_SECS = 300.0
JITTER = 0.1


# --------------------------------------------------------------------------- the worker


@dataclass
class _Platform:
    client: StatusClient
    accounts: dict[str, int]  # platform user id -> account id
    cancel: Cancel = field(default_factory=Cancel)
    outage: Outage | None = None


@dataclass(slots=True)
class _Tracked:
    """A stream the poller believes live (seen live, or an open session it found)."""

    stream_id: str | None
    user_id: str
    login: str | None = None
    name: str | None = None
    last_live: datetime | None = None
    offline_polls: int = 0
    first_offline: datetime | None = None


class StreamStatusPoller(Worker):
    def __init__(self, clients: Sequence[tuple[StatusClient, Mapping[str, int]]], *,
                 sink: EventSink, stats: StatsSink, metrics: Metrics, interval_secs: float,
                 sessions: OpenSessions | None = None, offline_polls: int = OFFLINE_POLLS,
                 start_grace_secs: float = START_GRACE_SECS, final_budget_secs: float = 3.0,
                 jitter: float = JITTER, rng: random.Random | None = None,
                 wall: Callable[[], datetime] | None = None,
                 name: str = "stream-status") -> None:
        super().__init__(name, metrics)
        self._platforms = [
            _Platform(c, dict(accounts), outage=Outage(f"stream status: {c.platform} API", log))
            for c, accounts in clients if accounts]
        self._sink = sink
        self._stats = stats
        self._sessions = sessions
        self.interval_secs = interval_secs
        self._offline_polls = max(1, offline_polls)
        self._grace = start_grace_secs
        self._final_budget = final_budget_secs
        self._jitter = jitter
        self._rng = rng or random.Random()
        self._wall = wall or (lambda: datetime.now(UTC))
        self._tracked: dict[tuple[str, int], _Tracked] = {}
        self._next_poll = time.monotonic() + self._rng.uniform(0, jitter * interval_secs)
        self.rounds = 0
        # A round may wait out a rate limit and a request per platform, plus the database.
        timeouts = sum(2 * p.client.timeout_secs for p in self._platforms)
        self.max_turn_secs = max(self.max_turn_secs, 2 * timeouts + 30.0)

    @property
    def platforms(self) -> list[str]:
        return [p.client.platform for p in self._platforms]

    # -- the loop ----------------------------------------------------------------

    def run_once(self) -> float:
        if time.monotonic() >= self._next_poll:
            try:
                self.poll_round()
            finally:
                spread = self._rng.uniform(1 - self._jitter, 1 + self._jitter)
                self._next_poll = time.monotonic() + self.interval_secs * spread
        self._stats.flush_due()
        now = self._wall()
        to_minute = 60.0 - (now.second + now.microsecond / 1e6) + 0.05
        return max(0.0, min(self._next_poll - time.monotonic(), to_minute))

    def wake(self) -> None:
        for platform in self._platforms:
            platform.cancel.cancel()
        self._stats.cut_calls_of(self.ident)

    def final(self) -> None:
        written = self._stats.flush_all(self._final_budget)
        if written:
            log.info("stream stats: %d window(s) taken at the stop (the current minute included)",
                     written)

    def poll_round(self) -> None:
        """Poll every platform once, one after the other (each bounded on its own)."""
        for platform in self._platforms:
            if self.stop_event.is_set():
                return
            try:
                self._poll_platform(platform)
            except Exception:
                # One platform's bug must not cost the others their round.
                log.exception("stream status: the %s round failed", platform.client.platform)
                self.metrics.worker_errors.labels(self.role).inc()
        self.rounds += 1

    # -- one platform ------------------------------------------------------------

    def _poll_platform(self, p: _Platform) -> None:
        client = p.client
        ids = list(p.accounts)
        found: dict[str, LiveStream] = {}
        polled: list[str] = []
        for start in range(0, len(ids), client.batch):
            chunk = ids[start:start + client.batch]
            wait = client.rate_wait()
            if wait > 0:
                if wait > client.timeout_secs:
                    self._failed(p, PollError("rate_limited", f"{client.platform} status API: "
                                              f"rate limit empty for {wait:.0f}s more"))
                    break
                if self.stop_event.wait(wait):
                    return
            try:
                answer = client.fetch(chunk, p.cancel)
            except PollError as exc:
                if self.stop_event.is_set():
                    return
                self._failed(p, exc)
                break  # the rest of this platform waits for the next round
            self.metrics.source_status_polls.labels(client.platform).inc()
            if answer.refused:
                self.metrics.source_status_poll_errors.labels(
                    client.platform, "bad_response").inc(len(answer.refused))
                log.warning("stream status: %s answered %d malformed item(s), refused (the "
                            "others are used): %s", client.platform, len(answer.refused),
                            "; ".join(answer.refused[:3]))
            found.update(answer.live)
            # An account whose item was refused is neither live nor offline this round.
            polled.extend(u for u in chunk if u in answer.live or u not in answer.unsure)
        else:
            if p.outage is not None:
                p.outage.ok()
        self._apply(p, polled, found)

    def _failed(self, p: _Platform, exc: PollError) -> None:
        self.metrics.source_status_poll_errors.labels(p.client.platform, exc.reason).inc()
        if p.outage is not None:
            p.outage.failed(str(exc))

    def _apply(self, p: _Platform, polled: list[str], found: Mapping[str, LiveStream]) -> None:
        platform = p.client.platform
        now = self._wall()
        untracked = [p.accounts[u] for u in polled
                     if u not in found and (platform, p.accounts[u]) not in self._tracked]
        open_sessions: dict[int, OpenSession] = {}
        if untracked and self._sessions is not None:
            try:
                open_sessions = self._sessions.open_streams(platform, untracked)
            except Exception as exc:  # noqa: BLE001 - only the safety net waits a round
                log.warning("stream status: cannot read the open %s sessions (%s: %s); "
                            "looked at again next round", platform, type(exc).__name__, exc)
        for user_id in polled:
            account = p.accounts[user_id]
            key = (platform, account)
            live = found.get(user_id)
            tracked = self._tracked.get(key)
            if live is not None:
                self._stats.add(account, platform, live.viewers, title=live.title,
                                category=live.category, at=now)
                stream_id = p.client.session_key(account, live)
                if tracked is None or tracked.stream_id != stream_id:
                    tracked = self._tracked[key] = _Tracked(stream_id, user_id, live.login,
                                                            live.name)
                    self._online(account, platform, live, stream_id, now)
                tracked.last_live, tracked.offline_polls, tracked.first_offline = now, 0, None
                continue
            if tracked is None:
                session = open_sessions.get(account)
                if session is None or (now - session.started_at).total_seconds() < self._grace:
                    continue
                tracked = self._tracked[key] = _Tracked(session.stream_id, user_id)
            tracked.offline_polls += 1
            tracked.first_offline = tracked.first_offline or now
            if tracked.offline_polls >= self._offline_polls:
                del self._tracked[key]
                self._offline(account, platform, tracked)

    def _online(self, account: int, platform: str, live: LiveStream, stream_id: str,
                now: datetime) -> None:
        started = live.started_at or now
        payload = {"id": stream_id, "broadcaster_user_id": live.user_id,
                   "broadcaster_user_login": live.login, "broadcaster_user_name": live.name,
                   "type": "live", "started_at": started.isoformat(), "viewer_count": live.viewers,
                   "title": live.title, "category": live.category, "detected_by": "poll"}
        ev = PlatformEvent.new(account_id=account, platform=platform, type="stream.online",
                               payload=payload, created_at=started, external_id=stream_id)
        result = self._sink.persist(ev, StreamChange("online", stream_id, ev.created_at, platform))
        if result.outcome in TAKEN:
            self.metrics.events_stream_sessions_by_poll.labels("opened").inc()
            log.info("stream %s of account %d (%s) found live by polling: the socket had not "
                     "reported it; session opened", stream_id, account, platform)

    def _offline(self, account: int, platform: str, tracked: _Tracked) -> None:
        at = tracked.last_live or tracked.first_offline or self._wall()
        payload = {"broadcaster_user_id": tracked.user_id,
                   "broadcaster_user_login": tracked.login, "broadcaster_user_name": tracked.name,
                   "stream_id": tracked.stream_id, "detected_by": "poll"}
        ev = PlatformEvent.new(
            account_id=account, platform=platform, type="stream.offline", payload=payload,
            created_at=at,
            external_id=offline_external_id(tracked.stream_id) if tracked.stream_id else None)
        result = self._sink.persist(ev, StreamChange("offline", tracked.stream_id, ev.created_at,
                                                     platform))
        if result.outcome in TAKEN:
            self.metrics.events_stream_sessions_by_poll.labels("closed").inc()
            log.info("stream %s of account %d (%s) found offline by polling: the socket had not "
                     "reported it; session closed at %s", tracked.stream_id, account, platform,
                     at.isoformat())


# --------------------------------------------------------------------------- composition


def build(cfg: Config, deps: SourceDeps) -> Built:
    """The poller (a timer) for the accounts of this shard, when a platform can be polled."""
    built = Built()
    metrics = deps.metrics
    ss = cfg.streamstatus
    mine = [a for a in cfg.accounts if cfg.owns(a.account_id)]
    clients: list[tuple[StatusClient, dict[str, int]]] = []
    timeout = ss.request_timeout_secs
    if "twitch" in ss.platforms:
        token = AppToken(join(cfg.twitch.oauth_url, "token"), cfg.twitch.client_id,
                         cfg.twitch.client_secret, timeout_secs=timeout)
        accounts = {a.twitch_user_id: a.account_id for a in mine if a.twitch_user_id}
        client: StatusClient = HelixStreams(cfg.twitch.helix_url, cfg.twitch.client_id, token,
                                            metrics, timeout_secs=timeout)
        if client.configured and accounts:
            clients.append((client, accounts))
    if "kick" in ss.platforms:
        token = AppToken(join(cfg.kick.oauth_url, "oauth/token"), cfg.kick.client_id,
                         cfg.kick.client_secret, timeout_secs=timeout)
        accounts = {a.kick_broadcaster_user_id: a.account_id for a in mine
                    if a.kick_broadcaster_user_id}
        client = KickLivestreams(cfg.kick.api_url, cfg.kick.client_id, token, metrics,
                                 timeout_secs=timeout)
        if client.configured and accounts:
            clients.append((client, accounts))
    if not clients:
        return built
    if deps.stats is None:
        raise ValueError("the stream-status poller needs a statistics sink")
    sink = EventSink(deps.persist_event, alerts=deps.alerts, sessions=deps.sessions)
    poller = StreamStatusPoller(clients, sink=sink, stats=deps.stats, metrics=metrics,
                                interval_secs=ss.interval_secs, sessions=deps.sessions)
    built.timers.append(poller)
    log.info("stream status: polling %s every %.0fs", ", ".join(
        f"{c.platform} ({len(a)} accounts)" for c, a in clients), ss.interval_secs)
    return built
