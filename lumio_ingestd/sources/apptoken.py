"""An app access token through the OAuth client-credentials grant (Twitch, Kick).

Both platforms give an application a token for its own calls (webhook
subscriptions, live-status look-ups) on `POST TOKEN_URL` with the form
fields `grant_type=client_credentials`, `client_id` and `client_secret`,
answered with `{"access_token": ..., "expires_in": SECONDS, ...}`:

- Twitch: `{[twitch] oauth_url}/token`
- Kick: `{[kick] oauth_url}/oauth/token`

`get()` returns the current token and fetches a new one when there is none
or it expires within `renew_before_secs` (renewed ahead, never used past its
life); `invalidate(token)` drops it after the API answered 401, so the next
`get()` fetches a fresh one. Single-flight: threads wanting a token while one
is being fetched wait for it. The token never reaches a log line. Nothing
durable here (an app token is cheap to fetch again after a restart).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import urlencode

from lumio_ingestd.config import Secret
from lumio_ingestd.sources.httpclient import Cancel, HttpUnavailable, request

log = logging.getLogger("lumio_ingestd.sources.apptoken")

#: A new token is fetched when the current one has less than this left.
RENEW_BEFORE_SECS = 300.0
#: Used when the answer has no usable `expires_in`.
DEFAULT_LIFETIME_SECS = 3600.0


class AppTokenError(Exception):
    """No app token now: the OAuth server is unreachable, or refused (`status` then set)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AppToken:
    def __init__(self, token_url: str, client_id: str, client_secret: Secret | None, *,
                 timeout_secs: float = 5.0, renew_before_secs: float = RENEW_BEFORE_SECS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._url = token_url
        self._client_id = client_id
        self._secret = client_secret
        self._timeout = timeout_secs
        self._renew_before = renew_before_secs
        self._clock = clock
        self._lock = threading.Lock()
        self._token: Secret | None = None
        self._expires_at = 0.0
        self.fetches = 0  # how many tokens were fetched (for tests and the status line)

    @property
    def configured(self) -> bool:
        return bool(self._client_id) and self._secret is not None

    def get(self, cancel: Cancel | None = None) -> str:
        """The current token, fetched or renewed first when needed; raises AppTokenError.

        `cancel` lets another thread cut a fetch in flight (a stopping worker).
        """
        with self._lock:  # single flight: the others wait for this fetch
            if self._token is None or self._clock() >= self._expires_at - self._renew_before:
                self._fetch(cancel)
            assert self._token is not None
            return self._token.reveal()

    def invalidate(self, token: str) -> None:
        """The API refused `token` (401): forget it, unless a newer one replaced it already."""
        with self._lock:
            if self._token is not None and self._token.reveal() == token:
                self._token = None

    def _fetch(self, cancel: Cancel | None) -> None:
        if not self.configured:
            raise AppTokenError("no client_id and client_secret_file configured")
        assert self._secret is not None
        body = urlencode({"grant_type": "client_credentials", "client_id": self._client_id,
                          "client_secret": self._secret.reveal()}).encode()
        try:
            result = request("POST", self._url, body=body, timeout=self._timeout, cancel=cancel,
                             headers={"Content-Type": "application/x-www-form-urlencoded",
                                      "Accept": "application/json"})
        except HttpUnavailable as exc:
            raise AppTokenError(f"token endpoint unreachable: {exc}") from None
        if result.status != 200:
            raise AppTokenError(f"token endpoint answered {result.status}: {result.message()}",
                                result.status)
        obj = result.json()
        token = obj.get("access_token") if isinstance(obj, dict) else None
        if not isinstance(token, str) or not token:
            raise AppTokenError("token endpoint answered 200 without an access_token")
        expires = obj.get("expires_in")
        usable = isinstance(expires, int | float) and expires > 0
        lifetime = float(expires) if usable else DEFAULT_LIFETIME_SECS
        self._token = Secret(token)
        # Renewed renew_before ahead of its end, or halfway through a shorter life.
        self._expires_at = self._clock() + max(lifetime, self._renew_before + lifetime / 2)
        self.fetches += 1
        log.info("app token fetched from %s (valid %.0fs)", self._url.split("?")[0], lifetime)
