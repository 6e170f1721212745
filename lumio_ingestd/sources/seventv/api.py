"""The 7TV REST API calls the source makes (`[seventv] api_url`, http:// or https://).

- `twitch_user(id)`: `GET /users/twitch/{id}` -> (7TV user id, active emote set id);
- `user_active_set(id)`: `GET /users/{id}` -> the active emote set of its Twitch connection;
- `emote_set(id)`: `GET /emote-sets/{id}` -> the set's emotes.

404 is an answer: no such user (`NotOnSevenTv`) or set (`None`); anything
else that is not a 200 with the documented shape raises `ApiError` (the
caller retries later).
Each call is bounded by `timeout_secs`; `cancel` cuts the call in flight
from another thread (a stopping source). Nothing durable here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from lumio_ingestd.sources.httpclient import Cancel, HttpUnavailable, join, request
from lumio_ingestd.sources.seventv.protocol import BadResponse, Entry, emote_set, twitch_user, user_active_set


class ApiError(Exception):
    """The call did not give an answer (network, 5xx, 429, a body of the wrong shape)."""


class NotOnSevenTv(ApiError):
    """7TV answered: this Twitch user has no 7TV account (or the 7TV user is gone)."""


class SevenTvApi:
    def __init__(self, base_url: str, *, timeout_secs: float = 5.0) -> None:
        self.base_url = base_url
        self.timeout_secs = timeout_secs
        self.cancel = Cancel()
        self.requests = 0

    def _get(self, path: str) -> Any | None:
        self.requests += 1
        try:
            result = request("GET", join(self.base_url, path),
                             headers={"Accept": "application/json", "User-Agent": "lumio-ingestd"},
                             timeout=self.timeout_secs, cancel=self.cancel)
        except HttpUnavailable as exc:
            raise ApiError(str(exc)) from None
        if result.status == 404:
            return None
        if result.status != 200:
            raise ApiError(f"GET {path}: HTTP {result.status}: {result.message()}")
        obj = result.json()
        if obj is None:
            raise ApiError(f"GET {path}: the body is not JSON")
        return obj

    def twitch_user(self, twitch_id: str) -> tuple[str, str | None]:
        obj = self._get(f"users/twitch/{quote(twitch_id, safe='')}")
        if obj is None:
            raise NotOnSevenTv(f"no 7TV user is connected to Twitch user {twitch_id}")
        try:
            return twitch_user(obj)
        except BadResponse as exc:
            raise ApiError(f"GET users/twitch/{twitch_id}: {exc}") from None

    def user_active_set(self, user_id: str) -> str | None:
        obj = self._get(f"users/{quote(user_id, safe='')}")
        if obj is None:
            raise NotOnSevenTv(f"7TV has no user {user_id}")
        try:
            return user_active_set(obj)
        except BadResponse as exc:
            raise ApiError(f"GET users/{user_id}: {exc}") from None

    def emote_set(self, set_id: str) -> dict[str, Entry] | None:
        obj = self._get(f"emote-sets/{quote(set_id, safe='')}")
        if obj is None:
            return None
        try:
            got_id, emotes = emote_set(obj)
        except BadResponse as exc:
            raise ApiError(f"GET emote-sets/{set_id}: {exc}") from None
        if got_id != set_id:
            raise ApiError(f"GET emote-sets/{set_id}: answered with set {got_id}")
        return emotes
