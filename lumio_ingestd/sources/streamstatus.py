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
  (streamstats.py); a stream the poller does not track yet is stored as a
  `stream.online` event through the `EventSink` (persist_event, the live
  alert, `stream_sessions`) with the stream id as `external_id`, as the
  socket does: if the socket stored it first, it is a duplicate and nothing
  changes (counted "opened" only when taken now).
- offline: a stream the poller saw live, or an open `stream_sessions` row
  (from the socket, or from before a restart) older than
  `start_grace_secs`, is closed after `offline_polls` (2) consecutive offline
  answers: a `stream.offline` event keyed `offline_external_id(stream id)`
  (sessions.py; the socket's offline gets the same key in the `EventSink`),
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
from typing import Any
from urllib.parse import urlencode

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import OpenSession, PlatformEvent, StreamChange, offline_external_id, parse_time
from lumio_ingestd.outage import Outage
from lumio_ingestd.sources.apptoken import AppToken, AppTokenError
from lumio_ingestd.sources.httpclient import Cancel, HttpResult, HttpUnavailable, join, request
from lumio_ingestd.sources.interfaces import OpenSessions, StatsSink
from lumio_ingestd.sources.kick.mapping import stream_key
from lumio_ingestd.sources.sink import TAKEN, EventSink
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.sources.streamstatus")

#: Consecutive offline answers that close a session.
OFFLINE_POLLS = 2
#: An open session the poller never saw live is left alone this long after its start:
#: the platform's status API may lag the socket's stream.online by a minute or two.
START_GRACE_SECS = 300.0
JITTER = 0.1


class PollError(Exception):
    """One status request failed; `reason` is a label of `source_status_poll_errors`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LiveStream:
    """One live stream as a status API reported it."""

    user_id: str
    stream_id: str  # the platform's own id of the stream; for Kick, see KickLivestreams
    viewers: int
    title: str | None = None
    category: str | None = None
    started_at: datetime | None = None
    login: str | None = None
    name: str | None = None


@dataclass(slots=True)
class Answer:
    """What one status request said: the live streams; the ids it left unsure; refused items."""

    live: dict[str, LiveStream] = field(default_factory=dict)
    unsure: set[str] = field(default_factory=set)
    refused: list[str] = field(default_factory=list)






# --------------------------------------------------------------------------- API clients


class StatusClient:
    """A platform's live-status endpoint: app token, one bounded GET, rate-limit bookkeeping."""

    platform = ""
    batch = 100

    def __init__(self, api_url: str, client_id: str, token: AppToken, metrics: Metrics, *,
                 timeout_secs: float, wall: Callable[[], float] = time.time) -> None:
        self._api_url = api_url
        self._client_id = client_id
        self._token = token
        self._metrics = metrics
        self.timeout_secs = timeout_secs
        self._wall = wall
        self._remaining: int | None = None
        self._reset_at = 0.0

    @property
    def configured(self) -> bool:
        return self._token.configured

    def url(self, ids: Sequence[str]) -> str:
        raise NotImplementedError

    def headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def user_of(self, item: Mapping[str, Any]) -> str:
        """The platform user id an answer item is about; raises KeyError/ValueError."""
        raise NotImplementedError

    def item(self, user_id: str, item: Mapping[str, Any]) -> LiveStream | None:
        """One answer item as a live stream (None: listed but not live); raises on bad shape."""
        raise NotImplementedError

    def parse(self, obj: Any, ids: Sequence[str]) -> Answer:
        """The answer to a request for `ids`; a malformed item is refused on its own."""
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
            raise PollError("bad_response", f"{self.platform} status API: the answer is not "
                                            "an object with a data list")
        answer = Answer()
        for i, item in enumerate(obj["data"]):
            user_id: str | None = None
            try:
                if not isinstance(item, dict):
                    raise TypeError(f"item is a {type(item).__name__}")
                user_id = self.user_of(item)
                live = self.item(user_id, item)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                answer.refused.append(f"data[{i}]" + (f" (user {user_id})" if user_id else "")
                                      + f": {type(exc).__name__}: {exc}"[:200])
                # Whose item it was is unknown: no account of the request is offline for sure.
                answer.unsure.update([user_id] if user_id else ids)
                continue
            if live is not None:
                answer.live[user_id] = live
        return answer

    def session_key(self, account_id: int, live: LiveStream) -> str:
        """The stream id `stream_sessions` and `stream.online` use (the socket's own rule)."""
        return live.stream_id

    def rate_wait(self) -> float:
        """Seconds until the rate-limit bucket has a point again (0: go ahead)."""
        if self._remaining is not None and self._remaining <= 0:
            return max(0.0, self._reset_at - self._wall())
        return 0.0

    def fetch(self, ids: Sequence[str], cancel: Cancel) -> Answer:
        """Which of `ids` are live (and which the answer left unsure); raises PollError."""
        token = self._get_token(cancel)
        result = self._get(ids, token, cancel)
        if result.status == 401:
            # One retry with a fresh token: an app token can be revoked at any time.
            self._token.invalidate(token)
            result = self._get(ids, self._get_token(cancel), cancel)
        if result.status == 429:
            raise PollError("rate_limited", f"{self.platform} status API answered 429 (rate limit)")
        if result.status != 200:
            raise PollError("status", f"{self.platform} status API answered {result.status}: "
                                      f"{result.message()}")
        return self.parse(result.json(), ids)

    def _get_token(self, cancel: Cancel) -> str:
        try:
            return self._token.get(cancel)
        except AppTokenError as exc:
            raise PollError("token", f"{self.platform} app token: {exc}") from None

    def _get(self, ids: Sequence[str], token: str, cancel: Cancel) -> HttpResult:
        started = time.monotonic()
        try:
            result = request("GET", self.url(ids), headers=self.headers(token),
                             timeout=self.timeout_secs, cancel=cancel)
        except HttpUnavailable as exc:
            raise PollError("unavailable", f"{self.platform} status API: {exc}") from None
        finally:
            self._metrics.source_status_poll_duration.labels(self.platform).observe(
                time.monotonic() - started)
        self._note_limits(result)
        return result

    def _note_limits(self, result: HttpResult) -> None:
        remaining = _int(result.headers.get("ratelimit-remaining"))
        reset = _float(result.headers.get("ratelimit-reset"))
        retry_after = _float(result.headers.get("retry-after"))
        if result.status == 429:
            remaining = 0
            if reset is None and retry_after is not None:
                reset = self._wall() + retry_after
            if reset is None:
                reset = self._wall() + 60.0  # no hint: one bucket period
        if remaining is not None:
            self._remaining = remaining
            self._reset_at = reset if reset is not None else self._wall() + 60.0


class HelixStreams(StatusClient):
    """Twitch Helix `GET /streams` by `user_id`."""

    platform = "twitch"
    batch = 100

    def url(self, ids: Sequence[str]) -> str:
        query = urlencode([("user_id", i) for i in ids] + [("first", "100")])
        return join(self._api_url, "streams") + "?" + query

    def headers(self, token: str) -> dict[str, str]:
        return {**super().headers(token), "Client-Id": self._client_id}

    def user_of(self, item: Mapping[str, Any]) -> str:
        return _id(item["user_id"], "user_id")

    def item(self, user_id: str, item: Mapping[str, Any]) -> LiveStream | None:
        stream_id = _id(item["id"], "id")
        viewers = _viewers(item.get("viewer_count"))
        if item.get("type", "live") != "live":
            return None  # only a live stream is a session (not a rerun or a premiere)
        return LiveStream(
            user_id=user_id, stream_id=stream_id, viewers=viewers, title=_text(item.get("title")),
            category=_text(item.get("game_name")), started_at=_time(item.get("started_at")),
            login=_text(item.get("user_login")), name=_text(item.get("user_name")))


class KickLivestreams(StatusClient):
    """Kick public API `GET /livestreams` by `broadcaster_user_id`."""

    platform = "kick"
    batch = 50

    def url(self, ids: Sequence[str]) -> str:
        query = urlencode([("broadcaster_user_id", i) for i in ids] + [("limit", "100")])
        return join(self._api_url, "livestreams") + "?" + query

    def user_of(self, item: Mapping[str, Any]) -> str:
        return _id(item["broadcaster_user_id"], "broadcaster_user_id")

    def item(self, user_id: str, item: Mapping[str, Any]) -> LiveStream | None:
        category = item.get("category")
        started = _time(item.get("started_at"))
        if started is None:
            raise ValueError("a livestream without a usable started_at")
        own = item.get("stream_id") or item.get("id")
        return LiveStream(
            user_id=user_id, stream_id=str(own) if isinstance(own, (str, int)) and str(own) else "",
            viewers=_viewers(item.get("viewer_count")), title=_text(item.get("stream_title")),
            category=_text(category.get("name")) if isinstance(category, dict) else None,
            started_at=started, login=_text(item.get("slug")), name=_text(item.get("slug")))

    def session_key(self, account_id: int, live: LiveStream) -> str:
        # Kick's /livestreams names no stream: the key comes from the start time, as
        # the Kick socket and webhook derive it, so all three meet on one row.
        assert live.started_at is not None
        return kick_stream_key(account_id, live.started_at)


#: The id of one Kick stream, from its account and start: the Kick mapping's own rule.
kick_stream_key = stream_key


def _id(value: object, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value):
        raise ValueError(f"{what} {value!r} is not an id")
    return str(value)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _viewers(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"viewer count {value!r} is not an integer")
    return max(0, value)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


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


def build_stream_status(cfg: Config, metrics: Metrics, *, sink: EventSink, stats: StatsSink,
                        sessions: OpenSessions | None) -> StreamStatusPoller | None:
    """The poller for the accounts of this shard, or None when no platform can be polled."""
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
        return None
    poller = StreamStatusPoller(clients, sink=sink, stats=stats, metrics=metrics,
                                interval_secs=ss.interval_secs, sessions=sessions)
    log.info("stream status: polling %s every %.0fs", ", ".join(
        f"{c.platform} ({len(a)} accounts)" for c, a in clients), ss.interval_secs)
    return poller
