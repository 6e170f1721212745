"""The checks every signed-webhook receiver makes before it trusts a delivery.

Twitch and Kick both sign `{message id}{timestamp}{body}` (differently) and
date the delivery in a header; a receiver refuses a bad signature (403,
logged at most once a minute: anyone can send these, and a flood must not
push real lines past journald's rate limit; the metric counts them all) and
a delivery dated further than `max_age` from now in either direction (403:
a replay of an old capture, or a clock far off). Nothing durable here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from lumio_ingestd.logs import Throttled
from lumio_ingestd.model import parse_time
from lumio_ingestd.web.server import Request, Response


class WebhookChecks:
    def __init__(self, platform: str, logger: logging.Logger, *, max_age_secs: float,
                 clock: Callable[[], datetime], timestamp_header: str) -> None:
        self._platform = platform
        self._log = logger
        self._max_age = max_age_secs
        self._clock = clock
        self._header = timestamp_header
        self._forged_log = Throttled(logger)

    def forged(self, request: Request, message_id: str) -> tuple[Response, str]:
        """The answer to a delivery whose signature does not match."""
        self._forged_log.log(logging.WARNING, "%s webhook: signature mismatch on delivery %s from "
                             "%s; refused", self._platform, message_id[:64], request.client)
        return Response.json(403, {"error": "signature mismatch"}), "forged"

    def sent_at(self, timestamp: str, message_id: str) -> datetime | tuple[Response, str]:
        """The delivery's time, or the answer refusing it (malformed, stale or future)."""
        try:
            sent_at = parse_time(timestamp)
        except ValueError:
            return Response.json(400, {"error": f"{self._header} is not an RFC 3339 time"}), "bad_request"
        age = (self._clock() - sent_at).total_seconds()
        if abs(age) > self._max_age:
            self._log.warning("%s webhook: delivery %s is %.0fs %s (limit %.0fs); refused",
                              self._platform, message_id[:64], abs(age),
                              "old" if age > 0 else "in the future", self._max_age)
            return Response.json(403, {"error": "stale or future timestamp"}), "stale"
        return sent_at
