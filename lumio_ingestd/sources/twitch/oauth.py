"""An account's Twitch user token: load, validate hourly, refresh on 401, persist atomically.

The pair lives in the account's `twitch_token_file`, a JSON object with
`access_token` and `refresh_token` (other keys are kept). Twitch asks apps
to validate a token at start and every hour (GET {oauth_url}/validate) and to
refresh reactively, on a 401 (POST {oauth_url}/token with the client id and
secret). The refresh token may change with every refresh, so the new pair is
written to the file before the new access token is used: a temporary file in
the same directory, fsync, rename over the old one, fsync the directory. A
crash at any point leaves either the old pair or the new one on disk, never
half of one, and never a new access token in use whose refresh token is not
on disk.

Refreshes are single-flight: threads that saw the same token fail wait for one
refresh and use its result (`refresh(failed_token)`). A refresh that Twitch
refuses (400/401: the grant was revoked) raises `TokenRejected`: the account
needs re-authorization; the file is re-read when it changes, so an operator
who puts a new pair there is picked up at the next connect.

Durable when `refresh()` returns: the new pair is on disk. Tokens never reach
a log line.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from lumio_ingestd import boundedjson
from lumio_ingestd.config import Secret
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.httpclient import HttpUnavailable, join, request

log = logging.getLogger("lumio_ingestd.sources.twitch.oauth")

VALIDATE_EVERY_SECS = 3600.0
PLATFORM = "twitch"


class TokenError(Exception):
    """The token cannot be used now (file unreadable, OAuth server unreachable)."""


class TokenRejected(TokenError):
    """Twitch refused the token and its refresh: the account must be authorized again."""


class TokenStore:
    def __init__(self, path: Path, oauth_url: str, client_id: str, client_secret: Secret | None,
                 metrics: Metrics, *, timeout_secs: float = 5.0,
                 validate_every_secs: float = VALIDATE_EVERY_SECS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._oauth_url = oauth_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._metrics = metrics
        self._timeout = timeout_secs
        self._validate_every = validate_every_secs
        self._clock = clock
        self._lock = threading.Lock()
        self._access: Secret | None = None
        self._refresh: Secret | None = None
        self._extra: dict[str, Any] = {}
        self._loaded_mtime: int | None = None
        self._validated_at: float | None = None
        self.unsaved = False  # a refreshed pair the disk refused (kept in memory, retried)
        self.user_id: str | None = None  # from the last successful validation
        self.scopes: tuple[str, ...] = ()

    # -- reading ----------------------------------------------------------------

    def load(self) -> None:
        """Read the pair from the file; raises TokenError."""
        with self._lock:
            self._load_locked()

    def reload_if_changed(self) -> bool:
        """Re-read the file when it changed on disk (an operator put a new pair there)."""
        with self._lock:
            try:
                mtime = self.path.stat().st_mtime_ns
            except OSError as exc:
                raise TokenError(f"cannot read {self.path}: {exc.strerror or exc}") from None
            if self._access is not None and mtime == self._loaded_mtime:
                return False
            self._load_locked()
            return True

    def _load_locked(self) -> None:
        try:
            raw = self.path.read_bytes()
            mtime = self.path.stat().st_mtime_ns
        except OSError as exc:
            raise TokenError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            obj = boundedjson.loads(raw)
        except ValueError:
            raise TokenError(f"{self.path} is not JSON") from None
        if not isinstance(obj, dict):
            raise TokenError(f"{self.path} is not a JSON object")
        access, refresh = obj.get("access_token"), obj.get("refresh_token")
        if not isinstance(access, str) or not access:
            raise TokenError(f"{self.path} has no access_token")
        if not isinstance(refresh, str) or not refresh:
            raise TokenError(f"{self.path} has no refresh_token")
        self._access, self._refresh = Secret(access), Secret(refresh)
        self._extra = {k: v for k, v in obj.items() if k not in ("access_token", "refresh_token")}
        self._loaded_mtime = mtime
        self._validated_at = None

    @property
    def access_token(self) -> str:
        with self._lock:
            if self._access is None:
                self._load_locked()
            assert self._access is not None
            return self._access.reveal()

    # -- validation ----------------------------------------------------------------

    def validate(self) -> None:
        """GET /validate; on 401 refresh once and validate the new token. Raises TokenError."""
        token = self.access_token
        result = self._validate(token)
        if result is None:
            self.refresh(token)
            result = self._validate(self.access_token)
            if result is None:
                raise TokenRejected("the refreshed access token does not validate")
        self._validated_at = self._clock()
        user_id = result.get("user_id")
        self.user_id = user_id if isinstance(user_id, str) else None
        scopes = result.get("scopes")
        self.scopes = tuple(s for s in scopes if isinstance(s, str)) if isinstance(scopes, list) else ()

    def validate_if_due(self) -> bool:
        """Validate when the last validation is an hour old (or there was none); True if it ran."""
        at = self._validated_at
        if at is not None and self._clock() - at < self._validate_every:
            return False
        if self.unsaved:
            try:
                self.save_if_unsaved()
            except TokenError as exc:
                log.error("twitch: refreshed token still not saved: %s", exc)
        self.validate()
        return True

    def _validate(self, token: str) -> dict[str, Any] | None:
        """The validation answer, or None for 401 (the token is not valid)."""
        try:
            result = request("GET", join(self._oauth_url, "validate"),
                             headers={"Authorization": f"OAuth {token}"}, timeout=self._timeout)
        except HttpUnavailable as exc:
            raise TokenError(f"token validation failed: {exc}") from None
        if result.status == 401:
            return None
        if result.status != 200:
            raise TokenError(f"token validation answered {result.status}: {result.message()}")
        body = result.json()
        return body if isinstance(body, dict) else {}

    # -- refresh -------------------------------------------------------------------

    def refresh(self, failed_token: str) -> str:
        """A fresh access token after `failed_token` got a 401; single-flight. Raises TokenError."""
        with self._lock:
            if self._access is not None and self._access.reveal() != failed_token:
                return self._access.reveal()  # another thread refreshed it meanwhile
            if self._refresh is None:
                self._load_locked()
            assert self._refresh is not None
            if self._client_secret is None:
                self._metrics.source_token_refreshes.labels(PLATFORM, "failed").inc()
                raise TokenRejected("the access token was refused and [twitch] client_secret_file "
                                    "is not set, so it cannot be refreshed")
            form = urlencode({"client_id": self._client_id,
                              "client_secret": self._client_secret.reveal(),
                              "grant_type": "refresh_token",
                              "refresh_token": self._refresh.reveal()}).encode()
            try:
                result = request("POST", join(self._oauth_url, "token"), body=form, timeout=self._timeout,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
            except HttpUnavailable as exc:
                self._metrics.source_token_refreshes.labels(PLATFORM, "failed").inc()
                raise TokenError(f"token refresh failed: {exc}") from None
            body = result.json()
            if result.status in (400, 401, 403):
                self._metrics.source_token_refreshes.labels(PLATFORM, "rejected").inc()
                raise TokenRejected(f"token refresh refused ({result.status}: {result.message()}); "
                                    f"the account must be authorized again ({self.path})")
            if (result.status != 200 or not isinstance(body, dict)
                    or not isinstance(body.get("access_token"), str)
                    or not isinstance(body.get("refresh_token"), str)):
                self._metrics.source_token_refreshes.labels(PLATFORM, "failed").inc()
                raise TokenError(f"token refresh answered {result.status} without a token pair")
            access, refresh = str(body["access_token"]), str(body["refresh_token"])
            try:
                self._persist(access, refresh)  # on disk before it is used
            except TokenError as exc:
                # Twitch may have retired the old refresh token already: dropping
                # the new pair would lock the account out. Keep it, say so loudly,
                # and write it again at the next validation.
                self.unsaved = True
                log.error("twitch: refreshed token NOT saved (%s); using it from memory and "
                          "retrying the write", exc)
            else:
                self.unsaved = False
                log.info("twitch: access token refreshed; new pair written to %s", self.path)
            self._access, self._refresh = Secret(access), Secret(refresh)
            self._validated_at = None
            self._metrics.source_token_refreshes.labels(PLATFORM, "ok").inc()
            return access

    def save_if_unsaved(self) -> None:
        """Retry writing a refreshed pair the disk refused before; raises TokenError."""
        with self._lock:
            if self.unsaved and self._access is not None and self._refresh is not None:
                self._persist(self._access.reveal(), self._refresh.reveal())
                self.unsaved = False
                log.info("twitch: refreshed token written to %s", self.path)

    def _persist(self, access: str, refresh: str) -> None:
        """Replace the token file atomically and durably; raises TokenError."""
        content = dict(self._extra)
        content["access_token"] = access
        content["refresh_token"] = refresh
        data = json.dumps(content, indent=2).encode() + b"\n"
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{self.path.name}.", suffix=".tmp")
        except OSError as exc:
            raise TokenError(f"cannot write the refreshed token next to {self.path}: "
                             f"{exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as f:  # mkstemp made it 0600: never group/world readable
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            self._loaded_mtime = self.path.stat().st_mtime_ns
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass  # already renamed, or never written
            raise TokenError(f"cannot write the refreshed token to {self.path}: "
                             f"{exc.strerror or exc}") from None
