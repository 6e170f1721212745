"""`POST /webhooks/kick`: Kick's official webhook deliveries.

Checks, in order, before anything is parsed or stored:

1. the `Kick-Event-Message-Id`, `Kick-Event-Message-Timestamp`,
   `Kick-Event-Signature` and `Kick-Event-Type` headers are there (else 400);
2. the signature: RSA PKCS#1 v1.5 SHA-256 over `{message id}.{timestamp}.{raw
   body}` with `[kick] webhook_public_key_file` (default: Kick's published
   key, shipped with the package), see `signature.py` (else 403);
3. the timestamp is at most `webhook_max_age_secs` away from now, either way
   (else 403: a replay of an old delivery, one dated in the future, or a
   clock far off). Kick sends every app's deliveries signed with the same key,
   so a delivery meant for another app verifies too: the age limit and the
   seen ids below are what stops a replay.

Then: a message id handled before (`lumio_ingestd.stores.seen.SeenDeliveries`:
memory plus `lumio:webhooks:kick:seen:ID` in Redis for an hour) gets 200 and
nothing new. Otherwise the body is mapped like the socket's frames
(`mapping.map_webhook`, same `message_id` / `external_id` rules, so what both
paths carry is one row); the account is the configured one whose
`kick_broadcaster_user_id` is `broadcaster.user_id` (unknown: 200, not
stored). Chat goes through `buffer_or_persist`, events through the shared
`EventSink`. Answered 200 once everything is durable (stored, parked or
spooled) or refused for good by the database; 503 when it was lost, so that
Kick delivers it again. An event type this code does not know is acknowledged
(200) and counted `unsupported`.

Durable when 2xx is answered: see above.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.interfaces import PersistChat, SeenIds
from lumio_ingestd.sources.kick.mapping import (
    BUCKET_SECS,
    PLATFORM,
    BadFrame,
    broadcaster_of,
    decode_checked,
    map_webhook,
)
from lumio_ingestd.sources.kick.signature import RsaPublicKey, signed_bytes, verify
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.webhookcheck import WebhookChecks
from lumio_ingestd.web.server import Request, Response

log = logging.getLogger("lumio_ingestd.sources.kick.webhook")

PATH = "/webhooks/kick"
MAX_BODY_BYTES = 256 * 1024

H_ID = "Kick-Event-Message-Id"
H_TIMESTAMP = "Kick-Event-Message-Timestamp"
H_SIGNATURE = "Kick-Event-Signature"
H_TYPE = "Kick-Event-Type"
H_VERSION = "Kick-Event-Version"
H_SUBSCRIPTION = "Kick-Event-Subscription-Id"


class KickWebhook:
    def __init__(self, key: RsaPublicKey, accounts: Mapping[str, int], sink: EventSink,
                 chat: PersistChat, seen: SeenIds, metrics: Metrics, *,
                 max_age_secs: float = 600.0, bucket_secs: int = BUCKET_SECS,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._key = key
        self._accounts = dict(accounts)
        self._sink = sink
        self._chat = chat
        self._seen = seen
        self._metrics = metrics
        self._bucket = bucket_secs
        self._checks = WebhookChecks(PLATFORM, log, max_age_secs=max_age_secs, clock=clock,
                                     timestamp_header=H_TIMESTAMP)

    def handle(self, request: Request) -> Response:
        response, result = self._handle(request)
        self._metrics.http_webhook_requests.labels(PLATFORM, result).inc()
        return response

    def _handle(self, request: Request) -> tuple[Response, str]:
        headers = request.headers
        message_id = (headers.get(H_ID) or "").strip()
        timestamp = (headers.get(H_TIMESTAMP) or "").strip()
        given = (headers.get(H_SIGNATURE) or "").strip()
        event_type = (headers.get(H_TYPE) or "").strip()
        if not (message_id and timestamp and given and event_type):
            return Response.json(400, {"error": f"missing {H_ID}, {H_TIMESTAMP}, {H_SIGNATURE} or "
                                                f"{H_TYPE} header"}), "bad_request"
        if not verify(self._key, signed_bytes(message_id, timestamp, request.body), given):
            return self._checks.forged(request, message_id)
        sent_at = self._checks.sent_at(timestamp, message_id)
        if not isinstance(sent_at, datetime):
            return sent_at
        if self._seen.seen(message_id):
            self._metrics.source_duplicates.labels(PLATFORM).inc()
            return Response.json(200, {"duplicate": True}), "replayed"
        return self._deliver(request, message_id, event_type, sent_at)

    def _deliver(self, request: Request, message_id: str, event_type: str,
                 sent_at: datetime) -> tuple[Response, str]:
        try:
            body, clean = decode_checked(request.body)
            broadcaster = broadcaster_of(body)
            account_id = self._accounts.get(broadcaster) if broadcaster is not None else None
            if account_id is None:
                log.warning("kick webhook: delivery %s is for broadcaster %s, which no configured "
                            "account has; acknowledged, not stored", message_id[:64], broadcaster)
                return Response.json(200, {"ignored": "no account for this broadcaster"}), \
                    "unknown_account"
            items = map_webhook(account_id, event_type, body, message_id, sent_at,
                                bucket_secs=self._bucket, known_clean=clean)
        except BadFrame as exc:
            self._metrics.source_bad_frames.labels(PLATFORM, exc.reason).inc()
            log.warning("kick webhook: refused delivery %s (%s): %s", message_id[:64], exc.reason, exc)
            return Response.json(400, {"error": f"bad body: {exc}"}), "bad_request"
        if items is None:
            self._metrics.source_bad_frames.labels(PLATFORM, "unsupported").inc()
            log.info("kick webhook: unsupported event type %r; acknowledged", event_type[:64])
            self._seen.mark(message_id)
            return Response.json(200, {"ignored": "unsupported event type"}), "unsupported"
        lost = 0
        for item in items:
            if item.chat is not None:
                self._metrics.source_frames.labels(PLATFORM, "chat").inc()
                lost += self._chat(item.chat) == "lost"
            elif item.event is not None:
                self._metrics.source_frames.labels(PLATFORM, "event").inc()
                lost += self._sink.persist(item.event, item.stream).outcome == "lost"
        if lost:
            return Response.json(503, {"error": "not stored; deliver again"}, {"Retry-After": "5"}), "lost"
        self._seen.mark(message_id)
        return Response.json(200, {"ok": True}), "stored"
