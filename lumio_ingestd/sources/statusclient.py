"""A platform's live-status API, as the stream-status poller asks it: the shared client.

`StatusClient` holds what every status endpoint shares: the app token (a 401
drops it and retries once), one bounded GET, and the rate-limit bookkeeping
of `Ratelimit-Remaining` / `Ratelimit-Reset`. Each platform subclasses it
with its URL and the reading of one answer item: `sources/twitch/streams.py`
(Helix) and `sources/kick/livestreams.py`. Nothing durable here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import parse_time
from lumio_ingestd.sources.apptoken import AppToken, AppTokenError
from lumio_ingestd.sources.httpclient import Cancel, HttpResult, HttpUnavailable, request


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


def as_id(value: object, what: str) -> str:
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


def as_viewers(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"viewer count {value!r} is not an integer")
    return max(0, value)


def as_text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def as_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None
