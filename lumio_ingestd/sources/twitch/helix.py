"""EventSub subscriptions through Helix (create, list, delete), with the conditions Twitch names.

`SUBSCRIPTIONS` is what every account subscribes to; `condition_for` fills
the condition from the broadcaster's user id (docs/platforms.rst, "Subscriptions"): the two chat
types read as the broadcaster (`user_id` = the broadcaster), `channel.follow`
v2 moderates as the broadcaster, `channel.raid` is about raids *to* the
channel. The WebSocket transport needs the user token of that broadcaster.

`HelixClient` speaks `{helix_url}/eventsub/subscriptions`:

- `create_subscription` POSTs one subscription: 202 is created, 409 means
  some subscription of that type, version and condition exists already
  (which session holds it is for the caller to find out); both are returned.
- `list_subscriptions` GETs them with one filter (`type` or `user_id`) and
  follows `pagination.cursor` (`after=`) to the last page, as
  `HeldSubscription`s: id, type, version, status, condition and the
  transport (method, session id, connected_at, disconnected_at).
- `delete_subscription` DELETEs one by id (`?id=`): 204, and 404 (gone
  already) are both done.

Every request carries the user token and `Client-Id`; a 401 refreshes the
token once (through `TokenStore.refresh`) and asks once more. Any other
answer than the ones named raises `HelixError` with Twitch's message (a 429
among them: the caller's backoff waits). Nothing durable here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from lumio_ingestd.sources.httpclient import Cancel, HttpResult, HttpUnavailable, join, request
from lumio_ingestd.sources.twitch.oauth import TokenStore

#: Pages one listing follows at most (Twitch answers 100 a page; a token holds far fewer).
MAX_PAGES = 50


@dataclass(frozen=True, slots=True)
class Subscription:
    type: str
    version: str


SUBSCRIPTIONS: tuple[Subscription, ...] = (
    Subscription("channel.chat.message", "1"),
    Subscription("channel.chat.notification", "1"),
    Subscription("channel.subscribe", "1"),
    Subscription("channel.subscription.gift", "1"),
    Subscription("channel.subscription.message", "1"),
    Subscription("channel.cheer", "1"),
    Subscription("channel.raid", "1"),
    Subscription("channel.follow", "2"),
    Subscription("channel.channel_points_custom_reward_redemption.add", "1"),
    Subscription("stream.online", "1"),
    Subscription("stream.offline", "1"),
)


def condition_for(sub_type: str, broadcaster_id: str) -> dict[str, str]:
    if sub_type in ("channel.chat.message", "channel.chat.notification"):
        return {"broadcaster_user_id": broadcaster_id, "user_id": broadcaster_id}
    if sub_type == "channel.follow":
        return {"broadcaster_user_id": broadcaster_id, "moderator_user_id": broadcaster_id}
    if sub_type == "channel.raid":
        return {"to_broadcaster_user_id": broadcaster_id}
    return {"broadcaster_user_id": broadcaster_id}


class HelixError(Exception):
    """Helix refused or could not be reached; `status` is None when there was no answer."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status if status is not None else 'no answer'}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class HeldSubscription:
    """One subscription as `GET /eventsub/subscriptions` lists it."""

    id: str
    type: str
    version: str
    status: str
    condition: Mapping[str, str]
    method: str
    session_id: str | None  # the websocket transport's session (None for a webhook)
    connected_at: str | None
    disconnected_at: str | None

    @classmethod
    def parse(cls, item: object) -> HeldSubscription | None:
        """The item of a listing, or None when it lacks what a decision needs (id, type,
        version, condition, transport method)."""
        if not isinstance(item, dict):
            return None
        transport = item.get("transport")
        condition = item.get("condition")
        sub_id, sub_type, version = item.get("id"), item.get("type"), item.get("version")
        if not (isinstance(sub_id, str) and sub_id and isinstance(sub_type, str)
                and isinstance(version, str) and isinstance(condition, dict)
                and isinstance(transport, dict) and isinstance(transport.get("method"), str)):
            return None

        def text(obj: Mapping[str, Any], key: str) -> str | None:
            value = obj.get(key)
            return value if isinstance(value, str) and value else None

        return cls(sub_id, sub_type, version, text(item, "status") or "unknown",
                   {str(k): str(v) for k, v in condition.items() if isinstance(v, str) and v},
                   str(transport["method"]), text(transport, "session_id"),
                   text(transport, "connected_at"), text(transport, "disconnected_at"))


@dataclass(frozen=True, slots=True)
class Listing:
    """What a listing returned: the subscriptions, and how many items could not be read."""

    items: tuple[HeldSubscription, ...]
    unreadable: int
    pages: int


class HelixClient:
    def __init__(self, helix_url: str, client_id: str, tokens: TokenStore) -> None:
        self._url = join(helix_url, "eventsub/subscriptions")
        self._client_id = client_id
        self._tokens = tokens
        self.cancel = Cancel()  # another thread may cut a request in flight

    def create_subscription(self, sub: Subscription, condition: Mapping[str, str], session_id: str,
                            *, timeout: float) -> tuple[int, Mapping[str, Any]]:
        """(status, the subscription Twitch returned) for 202 or 409; raises HelixError."""
        body = json.dumps({"type": sub.type, "version": sub.version, "condition": dict(condition),
                           "transport": {"method": "websocket", "session_id": session_id}}).encode()
        result = self._call("POST", self._url, body, timeout)
        if result.status not in (202, 409):
            raise HelixError(result.status, result.message())
        obj = result.json()
        data: Mapping[str, Any] = {}
        if isinstance(obj, dict) and isinstance(obj.get("data"), list) and obj["data"]:
            first = obj["data"][0]
            data = first if isinstance(first, dict) else {}
        return result.status, data

    def list_subscriptions(self, *, timeout: float, sub_type: str | None = None,
                           user_id: str | None = None) -> Listing:
        """Every subscription matching the one filter given, all pages within `timeout`."""
        if (sub_type is None) == (user_id is None):
            raise ValueError("list_subscriptions takes exactly one of sub_type and user_id")
        query = {"type": sub_type} if sub_type is not None else {"user_id": str(user_id)}
        deadline = time.monotonic() + timeout
        items: list[HeldSubscription] = []
        unreadable = 0
        cursor: str | None = None
        for page in range(1, MAX_PAGES + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise HelixError(None, f"listing not complete within {timeout:g}s ({page - 1} page(s))")
            url = self._url + "?" + urlencode({**query, **({"after": cursor} if cursor else {})})
            result = self._call("GET", url, None, left)
            if result.status != 200:
                raise HelixError(result.status, result.message())
            obj = result.json()
            if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
                raise HelixError(result.status, "the listing has no data list")
            for raw in obj["data"]:
                held = HeldSubscription.parse(raw)
                if held is None:
                    unreadable += 1
                else:
                    items.append(held)
            pagination = obj.get("pagination")
            nxt = pagination.get("cursor") if isinstance(pagination, dict) else None
            if not isinstance(nxt, str) or not nxt or nxt == cursor:
                return Listing(tuple(items), unreadable, page)
            cursor = nxt
        raise HelixError(None, f"the listing has more than {MAX_PAGES} pages")

    def delete_subscription(self, sub_id: str, *, timeout: float) -> None:
        """Delete one subscription (done when it is gone, 204 or 404); raises HelixError."""
        result = self._call("DELETE", self._url + "?" + urlencode({"id": sub_id}), None, timeout)
        if result.status not in (204, 404):
            raise HelixError(result.status, result.message())

    def _call(self, method: str, url: str, body: bytes | None, timeout: float) -> HttpResult:
        """One request with the user token; a 401 refreshes the token once and asks again."""
        token = self._tokens.access_token
        result = self._request(method, url, body, token, timeout)
        if result.status == 401:
            token = self._tokens.refresh(token)  # raises TokenError when it cannot
            result = self._request(method, url, body, token, timeout)
        return result

    def _request(self, method: str, url: str, body: bytes | None, token: str,
                 timeout: float) -> HttpResult:
        headers = {"Authorization": f"Bearer {token}", "Client-Id": self._client_id}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            return request(method, url, body=body, timeout=timeout, cancel=self.cancel, headers=headers)
        except HttpUnavailable as exc:
            raise HelixError(None, str(exc)) from None
