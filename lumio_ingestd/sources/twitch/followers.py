"""Healing Twitch follows: the follows of a gap, read back from Helix.

`FollowerHistory.heal(window)` pages `GET {helix_url}/channels/followers?
broadcaster_id=ID&first=100&after=CURSOR` (newest first: `data[] {user_id,
user_login, user_name, followed_at}`) until a follow is older than the window
or the cursor ends. Each follow inside the window becomes the `channel.follow`
row EventSub gives it: the same type, payload fields, time (`followed_at`),
and the content-derived `external_id` `follow:<user_id>:<followed_at epoch s>`
(mapping.follow_external_id), so a follow seen on both paths is one row. It
goes through `persist_event`, never the live alert (it is late).

The account's `TokenStore` is shared with its EventSub source: a 401 refreshes
the token once (as the subscription calls do) and asks again; a second 401
fails the gap for good. Helix's 429 carries `Ratelimit-Reset`, which the retry
waits for (sources/history.py).

Durable when `heal` returns: every follow of the window went through
`persist_event`; a failure part-way leaves those before it stored (the next
try finds them as duplicates).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from lumio_ingestd.config import AccountConfig, TwitchConfig
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import (
    HealFailed,
    HealOutcome,
    HealRetry,
    HealWindow,
    PlatformEvent,
    parse_time,
)
from lumio_ingestd.sources.history import HistoryClient, Unauthorized
from lumio_ingestd.sources.httpclient import join
from lumio_ingestd.sources.interfaces import PersistEvent
from lumio_ingestd.sources.sink import TAKEN
from lumio_ingestd.sources.twitch.mapping import FOLLOW_TYPE, PLATFORM, follow_external_id
from lumio_ingestd.sources.twitch.oauth import TokenError, TokenStore

log = logging.getLogger("lumio_ingestd.sources.twitch.followers")

PAGE = 100
MAX_PAGES = 1000


class FollowerHistory:
    """The `Healer` of one account's Twitch follows."""

    def __init__(self, account: AccountConfig, twitch: TwitchConfig, tokens: TokenStore,
                 persist_event: PersistEvent, metrics: Metrics, *, timeout_secs: float = 10.0) -> None:
        if account.twitch_user_id is None:
            raise ValueError(f"account {account.account_id} has no twitch_user_id")
        self.account_id = account.account_id
        self.broadcaster_id = account.twitch_user_id
        self._url = join(twitch.helix_url, "channels/followers")
        self._client_id = twitch.client_id
        self._tokens = tokens
        self._persist = persist_event
        self._metrics = metrics
        self.client = HistoryClient(PLATFORM, metrics, timeout_secs=timeout_secs)

    def cancel(self) -> None:
        self.client.cancel.cancel()

    def heal(self, window: HealWindow) -> HealOutcome:
        self.client.cancel.reset()
        start = self.client.requests
        rows = seen = 0
        try:
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                page, cursor = self._page(cursor)
                older = False
                for item in page:
                    ev = self._event(item)
                    if ev is None:
                        continue
                    at_ms = int(ev.created_at.timestamp() * 1000)
                    if at_ms < window.since_ms:
                        older = True  # newest first: everything after this is older still
                        break
                    if at_ms > window.until_ms:
                        continue
                    seen += 1
                    result = self._persist(ev)
                    if result.outcome in TAKEN:
                        rows += 1
                    elif not result.durable:
                        raise HealRetry(f"a follow could not be kept ({result.outcome}: {result.error})")
                if older or not cursor or not page:
                    return HealOutcome(rows, seen, self.client.requests - start)
            raise HealRetry(f"more than {MAX_PAGES} pages of followers")
        except HealRetry as exc:
            raise HealRetry(str(exc), after_secs=exc.after_secs, rows=rows,
                            requests=self.client.requests - start) from None
        except HealFailed as exc:
            raise HealFailed(str(exc), rows=rows, requests=self.client.requests - start) from None

    def _page(self, cursor: str | None) -> tuple[list[dict[str, Any]], str | None]:
        params = {"broadcaster_id": self.broadcaster_id, "first": str(PAGE)}
        if cursor:
            params["after"] = cursor
        url = self._url + "?" + urlencode(params)
        try:
            token = self._tokens.access_token
        except TokenError as exc:
            raise HealFailed(f"no token: {exc}") from None
        try:
            obj = self.client.get_json(url, self._headers(token))
        except Unauthorized:
            try:
                token = self._tokens.refresh(token)
            except TokenError as exc:
                raise HealFailed(f"the token is refused and cannot be refreshed: {exc}") from None
            try:
                obj = self.client.get_json(url, self._headers(token))
            except Unauthorized as again:
                raise HealFailed(f"the token is refused ({again})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
            raise HealRetry("followers: the answer has no data list")
        pagination = obj.get("pagination")
        nxt = pagination.get("cursor") if isinstance(pagination, dict) else None
        return [d for d in obj["data"] if isinstance(d, dict)], nxt if isinstance(nxt, str) else None

    def _headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "Client-Id": self._client_id}

    def _event(self, item: dict[str, Any]) -> PlatformEvent | None:
        user_id, followed = item.get("user_id"), item.get("followed_at")
        if not isinstance(user_id, str) or not user_id or not isinstance(followed, str):
            self._metrics.source_bad_frames.labels(PLATFORM, "shape").inc()
            log.warning("twitch: account %d: a follower without user_id or followed_at skipped",
                        self.account_id)
            return None
        try:
            at = parse_time(followed)
        except ValueError:
            self._metrics.source_bad_frames.labels(PLATFORM, "time").inc()
            return None
        # The payload EventSub's channel.follow event carries, from what Helix gives.
        payload = {"user_id": user_id, "user_login": item.get("user_login"),
                   "user_name": item.get("user_name"), "broadcaster_user_id": self.broadcaster_id,
                   "followed_at": followed, "healed": True}
        return PlatformEvent.new(account_id=self.account_id, platform=PLATFORM, type=FOLLOW_TYPE,
                                 payload=payload, created_at=at,
                                 external_id=follow_external_id(user_id, at), user_id=user_id)
