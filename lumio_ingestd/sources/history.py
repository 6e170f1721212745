"""What every healer shares: one GET to a platform's history API, its answer judged.

`HistoryClient.get_json(url, headers)` makes one request through
`httpclient.request` (bounded by `timeout_secs`, cut by `cancel()` from
another thread) and returns the parsed JSON of a 200. Anything else raises:

- 401: `Unauthorized` (the healer renews its token once, then gives up);
- 429: `HealRetry` with the wait the platform asked for (`Retry-After` in
  seconds, or Helix's `Ratelimit-Reset`, an epoch second);
- 5xx, a timeout, a refused connection, a body that is not JSON: `HealRetry`;
- other 4xx: `HealFailed` (asking again would get the same answer).

Each request is counted in `source_heal_requests_total{platform,result}` and
in `requests`, for the ledger's figures. Nothing durable here.
"""

from __future__ import annotations

import time
from typing import Any

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import HealFailed, HealRetry
from lumio_ingestd.sources.httpclient import Cancel, HttpResult, HttpUnavailable, request

#: Longest wait a 429 may ask for before the try counts as failed anyway (a bad header).
MAX_RETRY_AFTER_SECS = 900.0


class Unauthorized(Exception):
    """The history API refused the token (401)."""


def retry_after(result: HttpResult, now: float | None = None) -> float | None:
    """The wait a 429 asks for: `Retry-After` seconds, else `Ratelimit-Reset` (epoch seconds)."""
    value = result.headers.get("retry-after")
    if value is not None:
        try:
            return min(MAX_RETRY_AFTER_SECS, max(0.0, float(value)))
        except ValueError:
            pass  # an HTTP date: the normal backoff
    reset = result.headers.get("ratelimit-reset")
    if reset is not None:
        try:
            wait = float(reset) - (now if now is not None else time.time())
            return min(MAX_RETRY_AFTER_SECS, max(0.0, wait))
        except ValueError:
            return None
    return None


class HistoryClient:
    def __init__(self, platform: str, metrics: Metrics, *, timeout_secs: float = 10.0) -> None:
        self.platform = platform
        self.metrics = metrics
        self.timeout = timeout_secs
        self.cancel = Cancel()
        self.requests = 0

    def get_json(self, url: str, headers: dict[str, str]) -> Any:
        self.requests += 1
        label = self.metrics.source_heal_requests.labels
        try:
            result = request("GET", url, headers=headers, timeout=self.timeout, cancel=self.cancel)
        except HttpUnavailable as exc:
            label(self.platform, "retry").inc()
            raise HealRetry(str(exc)) from None
        if result.status == 200:
            obj = result.json()
            if obj is None:
                label(self.platform, "retry").inc()
                raise HealRetry(f"GET {_path(url)}: the answer is not JSON ({len(result.body)} bytes)")
            label(self.platform, "ok").inc()
            return obj
        if result.status == 401:
            label(self.platform, "failed").inc()
            raise Unauthorized(f"GET {_path(url)}: 401 {result.message()}")
        if result.status == 429 or result.status >= 500:
            label(self.platform, "retry").inc()
            raise HealRetry(f"GET {_path(url)}: HTTP {result.status}",
                            after_secs=retry_after(result) if result.status == 429 else None)
        label(self.platform, "failed").inc()
        raise HealFailed(f"GET {_path(url)}: HTTP {result.status} {result.message()}")


def _path(url: str) -> str:
    """The URL without its query (no token or cursor in a log line)."""
    return url.split("?", 1)[0][:200]
