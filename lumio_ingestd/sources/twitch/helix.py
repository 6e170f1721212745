"""Creating EventSub subscriptions through Helix, with the conditions Twitch's reference names.

`SUBSCRIPTIONS` is what every account subscribes to; `condition_for` fills
the condition from the broadcaster's user id (docs/platforms.rst, "Subscriptions"): the two chat
types read as the broadcaster (`user_id` = the broadcaster), `channel.follow`
v2 moderates as the broadcaster, `channel.raid` is about raids *to* the
channel. The WebSocket transport needs the user token of that broadcaster.

`HelixClient.create_subscription` POSTs one subscription; a 401 refreshes the
token once (through `TokenStore.refresh`) and retries once. 202 is success,
409 means "exists already" (success too); anything else raises `HelixError`
with Twitch's message. Nothing durable here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lumio_ingestd.sources.httpclient import Cancel, HttpUnavailable, join, request
from lumio_ingestd.sources.twitch.oauth import TokenStore


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
        token = self._tokens.access_token
        result = self._post(body, token, timeout)
        if result[0] == 401:
            token = self._tokens.refresh(token)  # raises TokenError when it cannot
            result = self._post(body, token, timeout)
        status, data, message = result
        if status in (202, 409):
            return status, data
        raise HelixError(status, message)

    def _post(self, body: bytes, token: str, timeout: float) -> tuple[int, Mapping[str, Any], str]:
        try:
            result = request("POST", self._url, body=body, timeout=timeout, cancel=self.cancel, headers={
                "Authorization": f"Bearer {token}", "Client-Id": self._client_id,
                "Content-Type": "application/json"})
        except HttpUnavailable as exc:
            raise HelixError(None, str(exc)) from None
        obj = result.json()
        data: Mapping[str, Any] = {}
        if isinstance(obj, dict) and isinstance(obj.get("data"), list) and obj["data"]:
            first = obj["data"][0]
            data = first if isinstance(first, dict) else {}
        return result.status, data, result.message()
