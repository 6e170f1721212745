"""Kick webhook subscriptions kept in line with the configured accounts (`manage_webhooks = true`).

`KickSubscriptions` is a timer worker: at start and every `interval_secs`
(an hour) it lists the app's subscriptions (`GET {api_url}/events/subscriptions`,
with an app token from the client-credentials grant at
`{oauth_url}/oauth/token`), creates the missing ones (`POST`, one request per
broadcaster with every event type it lacks, `method: webhook`), and deletes
the ones of broadcasters no configured account has any more, and repeats of
one (broadcaster, event) pair (`DELETE ?id=...`). Listing first is what keeps
a restart from creating them twice.

A refused or failed call is logged with Kick's own message and the pass is
tried again after a backoff (`retry_min_secs`, doubling up to
`retry_max_secs`); a 401 drops the token so the next call fetches a new one.
Nothing here stops ingest: the Pusher socket does not depend on it and the
webhook receiver takes whatever Kick delivers. It runs on the replica with
shard index 0 (subscriptions are per app, not per replica).

Nothing durable here: the subscriptions live at Kick.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from typing import Any

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.apptoken import AppToken, AppTokenError
from lumio_ingestd.sources.httpclient import Cancel, HttpResult, HttpUnavailable, join, request
from lumio_ingestd.sources.kick.mapping import PLATFORM, WEBHOOK_TYPES
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.sources.kick.subscriptions")

EVENTS: tuple[str, ...] = tuple(sorted(WEBHOOK_TYPES))
PATH = "events/subscriptions"


class KickApiError(Exception):
    """A Kick API call that did not succeed; the message carries Kick's own text."""


class KickSubscriptions(Worker):
    max_turn_secs = 120.0

    def __init__(self, api_url: str, token: AppToken, broadcasters: Collection[str], metrics: Metrics, *,
                 interval_secs: float = 3600.0, retry_min_secs: float = 30.0,
                 retry_max_secs: float = 1800.0, timeout_secs: float = 10.0,
                 events: Collection[str] = EVENTS) -> None:
        super().__init__("kick-webhook-subscriptions", metrics, role="kick-subscriptions")
        self._api = api_url
        self._token = token
        self.broadcasters = frozenset(broadcasters)
        self._events = tuple(events)
        self._interval = interval_secs
        self._retry_min = retry_min_secs
        self._retry_max = retry_max_secs
        self._timeout = timeout_secs
        self._cancel = Cancel()
        self._failed_passes = 0
        self.passes = 0  # completed passes (tests wait on it)

    def run_once(self) -> float:
        try:
            created, deleted = self.sync()
        except (KickApiError, AppTokenError) as exc:
            self._failed_passes += 1
            delay = min(self._retry_max, self._retry_min * 2.0 ** (self._failed_passes - 1))
            self.metrics.source_subscriptions.labels(PLATFORM, "failed").inc()
            log.warning("kick: webhook subscriptions not in line (%s); trying again in %.0fs", exc, delay)
            return delay
        self._failed_passes = 0
        self.passes += 1
        if created or deleted:
            log.info("kick: webhook subscriptions: %d created, %d deleted", created, deleted)
        return self._interval

    def wake(self) -> None:
        self._cancel.cancel()

    def sync(self) -> tuple[int, int]:
        """One pass: list, create what is missing, delete what is not wanted; (created, deleted)."""
        have: dict[tuple[str, str], list[str]] = {}
        for sub in self.list_subscriptions():
            key = (str(sub.get("broadcaster_user_id")), str(sub.get("event")))
            have.setdefault(key, []).append(str(sub.get("id")))
        created = 0
        for broadcaster in sorted(self.broadcasters):
            missing = [e for e in self._events if (broadcaster, e) not in have]
            if missing:
                self._create(broadcaster, missing)
                created += len(missing)
        unwanted: list[str] = []
        for (broadcaster, event), ids in have.items():
            if broadcaster not in self.broadcasters or event not in self._events:
                unwanted += ids
            else:
                unwanted += ids[1:]  # a repeat of the same pair: one is enough
        if unwanted:
            self._delete(unwanted)
        self.metrics.source_subscriptions.labels(PLATFORM, "created").inc(created)
        self.metrics.source_subscriptions.labels(PLATFORM, "deleted").inc(len(unwanted))
        return created, len(unwanted)

    def list_subscriptions(self) -> list[dict[str, Any]]:
        result = self._call("GET", PATH)
        obj = result.json()
        data = obj.get("data") if isinstance(obj, dict) else None
        if not isinstance(data, list):
            raise KickApiError(f"GET {PATH}: answer without a data list")
        return [d for d in data if isinstance(d, dict)]

    def _create(self, broadcaster: str, events: list[str]) -> None:
        body = {"broadcaster_user_id": int(broadcaster), "method": "webhook",
                "events": [{"name": e, "version": 1} for e in events]}
        result = self._call("POST", PATH, json.dumps(body).encode())
        obj = result.json()
        data = obj.get("data") if isinstance(obj, dict) else None
        errors = [f"{d.get('name')}: {d.get('error')}" for d in data or [] if isinstance(d, dict)
                  and d.get("error")]
        if errors:
            raise KickApiError(f"POST {PATH} for broadcaster {broadcaster}: " + "; ".join(errors)[:300])

    def _delete(self, ids: list[str]) -> None:
        for start in range(0, len(ids), 50):  # keeps the query string short
            query = "&".join(f"id={i}" for i in ids[start:start + 50])
            self._call("DELETE", f"{PATH}?{query}")

    def _call(self, method: str, path: str, body: bytes | None = None) -> HttpResult:
        for attempt in (1, 2):
            token = self._token.get()
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            self._cancel.reset()
            try:
                result = request(method, join(self._api, path), headers=headers, body=body,
                                 timeout=self._timeout, cancel=self._cancel)
            except HttpUnavailable as exc:
                raise KickApiError(str(exc)) from None
            if result.status == 401 and attempt == 1:
                self._token.invalidate(token)  # renewed on the next get()
                continue
            if result.status >= 300:
                raise KickApiError(f"{method} {path.split('?')[0]} answered {result.status}: "
                                   f"{result.message()}")
            return result
        raise AssertionError("unreachable")
