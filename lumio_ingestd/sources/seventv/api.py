"""The 7TV REST API calls the source makes (`[seventv] api_url`, http:// or https://).

- `twitch_user(id)`: `GET /users/twitch/{id}` -> (7TV user id, active emote set id);
- `user_active_set(id)`: `GET /users/{id}` -> the active emote set of its Twitch connection;
- `emote_set(id)`: `GET /emote-sets/{id}` -> the set's emotes.

Each endpoint has its own cap on the answer's size, from what the real v3
API returns: an emote in a set answer (`ActiveEmote` with its `data`: the
owner and eight host files) is about 1.6 KB, so a set of 1,000 emotes is
about 1.6 MB. `users/twitch/{id}` embeds the active set with its emotes,
`emote-sets/{id}` is the set; both may be as large as the largest set
(`MAX_SET_EMOTES`) at `MAX_EMOTE_BYTES` each. `users/{id}` carries the user's
connections and set summaries, and gets the same bound (a connection may
embed its set). Anything above its cap is refused, counted in
`seventv_api_errors{reason="too_large"}` and retried later.

404 is an answer: no such user (`NotOnSevenTv`) or set (`None`); anything
else that is not a 200 with the documented shape raises `ApiError` (the
caller retries later).
Each call is bounded by `timeout_secs`; `cancel` cuts the call in flight
from another thread (a stopping source). Nothing durable here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.httpclient import (
    Cancel,
    DeadlineExceeded,
    HttpUnavailable,
    ResponseTooLarge,
    join,
    request,
)
from lumio_ingestd.sources.seventv.protocol import BadResponse, Entry, emote_set, twitch_user, user_active_set


class ApiError(Exception):
    """The call did not give an answer (network, 5xx, 429, a body of the wrong shape)."""


class NotOnSevenTv(ApiError):
    """7TV answered: this Twitch user has no 7TV account (or the 7TV user is gone)."""


#: The most emotes one set answer is sized for (7TV's set capacities stay well below it).
MAX_SET_EMOTES = 2500
#: The most bytes one emote of a set answer is sized for (real ones: about 1.6 KB).
MAX_EMOTE_BYTES = 4096
#: The rest of an answer: the user or set record around the emotes.
RECORD_BYTES = 256 * 1024
#: The cap of each endpoint's answer, in bytes.
MAX_BYTES: dict[str, int] = {
    "users_twitch": MAX_SET_EMOTES * MAX_EMOTE_BYTES + RECORD_BYTES,
    "users": MAX_SET_EMOTES * MAX_EMOTE_BYTES + RECORD_BYTES,
    "emote_sets": MAX_SET_EMOTES * MAX_EMOTE_BYTES + RECORD_BYTES,
}


class SevenTvApi:
    def __init__(self, base_url: str, *, timeout_secs: float = 5.0, metrics: Metrics | None = None) -> None:
        self.base_url = base_url
        #: The whole-request deadline of each call.
        self.timeout_secs = timeout_secs
        self.cancel = Cancel()
        self.requests = 0
        self._metrics = metrics

    def _failed(self, endpoint: str, reason: str, message: str) -> ApiError:
        if self._metrics is not None:
            self._metrics.seventv_api_errors.labels(endpoint, reason).inc()
        return ApiError(message)

    def _get(self, endpoint: str, path: str) -> Any | None:
        self.requests += 1
        try:
            result = request("GET", join(self.base_url, path),
                             headers={"Accept": "application/json", "User-Agent": "lumio-ingestd"},
                             timeout=self.timeout_secs, cancel=self.cancel,
                             max_bytes=MAX_BYTES[endpoint])
        except ResponseTooLarge as exc:
            raise self._failed(endpoint, "too_large", str(exc)) from None
        except DeadlineExceeded as exc:
            raise self._failed(endpoint, "deadline", str(exc)) from None
        except HttpUnavailable as exc:
            raise self._failed(endpoint, "unavailable", str(exc)) from None
        if result.status == 404:
            return None
        if result.status != 200:
            raise self._failed(endpoint, "status", f"GET {path}: HTTP {result.status}: {result.message()}")
        obj = result.json()
        if obj is None:
            raise self._failed(endpoint, "shape", f"GET {path}: the body is not JSON")
        return obj

    def twitch_user(self, twitch_id: str) -> tuple[str, str | None]:
        obj = self._get("users_twitch", f"users/twitch/{quote(twitch_id, safe='')}")
        if obj is None:
            raise NotOnSevenTv(f"no 7TV user is connected to Twitch user {twitch_id}")
        try:
            return twitch_user(obj)
        except BadResponse as exc:
            raise ApiError(f"GET users/twitch/{twitch_id}: {exc}") from None

    def user_active_set(self, user_id: str) -> str | None:
        obj = self._get("users", f"users/{quote(user_id, safe='')}")
        if obj is None:
            raise NotOnSevenTv(f"7TV has no user {user_id}")
        try:
            return user_active_set(obj)
        except BadResponse as exc:
            raise ApiError(f"GET users/{user_id}: {exc}") from None

    def emote_set(self, set_id: str) -> dict[str, Entry] | None:
        obj = self._get("emote_sets", f"emote-sets/{quote(set_id, safe='')}")
        if obj is None:
            return None
        try:
            got_id, emotes = emote_set(obj)
        except BadResponse as exc:
            raise ApiError(f"GET emote-sets/{set_id}: {exc}") from None
        if got_id != set_id:
            raise ApiError(f"GET emote-sets/{set_id}: answered with set {got_id}")
        return emotes
