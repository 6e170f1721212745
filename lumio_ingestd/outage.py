"""Telling one outage from many failures: log once, back off briefly, log the recovery.

A dependency that is down makes every call fail; logging each failure would
flood the journal, and trying it on every call would stall a serial source
for a timeout each time. `Outage` logs the first failure at warning, the end
of the outage at info, and says when the next try is due.

Nothing durable lives here. Log text is built by the caller from error
classes and SQLSTATEs only: database messages may quote row values (COPY
errors carry the offending line), and chat text is never logged above debug.
"""

from __future__ import annotations

import logging
import time


class Outage:
    def __init__(self, what: str, logger: logging.Logger, retry_after_secs: float = 0.0) -> None:
        self.what = what
        self._log = logger
        self._retry_after = retry_after_secs
        self._since: float | None = None
        self._retry_at = 0.0
        self.failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def should_try(self, now: float | None = None) -> bool:
        """True unless the dependency failed less than `retry_after_secs` ago."""
        return self._since is None or (now if now is not None else time.monotonic()) >= self._retry_at

    def failed(self, detail: str) -> None:
        now = time.monotonic()
        self.failures += 1
        self._retry_at = now + self._retry_after
        if self._since is None:
            self._since = now
            self._log.warning("%s unavailable: %s", self.what, detail)
        else:
            self._log.debug("%s still unavailable: %s", self.what, detail)

    def ok(self) -> None:
        if self._since is not None:
            self._log.info("%s available again after %.1fs (%d failures)",
                           self.what, time.monotonic() - self._since, self.failures)
            self._since = None
            self.failures = 0




def describe_redis_error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
