"""`POST /webhooks/twitch`: EventSub deliveries over HTTP.

Checks, in order, before anything is parsed or stored:

1. the `Twitch-Eventsub-Message-*` headers are there (else 400);
2. the signature: `sha256=` + hex HMAC-SHA256 keyed with `[twitch]
   webhook_secret_file` over the message id, the timestamp header and the raw
   body, compared in constant time (else 403);
3. the timestamp is at most 10 minutes away from now (else 403: a replay of
   an old delivery, or a clock far off).

Then, by message type:

- `webhook_callback_verification`: 200 with the `challenge` as the whole
  plain-text body;
- `revocation`: logged (type, status), counted, 204;
- `notification`: a delivery id handled before (kept in Redis for an hour,
  `lumio:webhooks:twitch:seen:ID`, and in a bounded in-memory cache when
  Redis is away) is answered 200 and not stored again. Otherwise the body
  goes through the same mapping as the WebSocket (`mapping.map_notification`;
  the account is the configured one whose `twitch_user_id` the
  subscription's condition names; a type this daemon never subscribes to is
  acknowledged with 200, counted `source_bad_frames{reason="unsubscribed"}`,
  logged once a minute and not stored): chat through `buffer_or_persist`, events
  through `TwitchSink` (persist_event, alerts, stream sessions; a gift bomb
  waits up to `gift_wait_secs` for its gifted subs, which arrive as their own
  requests). Answered 204 once everything is durable (stored, parked or
  spooled), or refused for good by the database (a retry could not help);
  503 when it was lost, so that Twitch delivers it again.

The answer comes within the bounded insert (3 s), plus the gift wait for a
gift bomb; bodies are capped by the route (`MAX_BODY_BYTES`).

Durable when 2xx is answered for a notification: see above.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime

from lumio_ingestd.config import Secret
from lumio_ingestd.logs import Throttled
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.interfaces import FrameSink, PersistChat, SeenIds
from lumio_ingestd.sources.twitch.gifts import GiftLinker
from lumio_ingestd.sources.twitch.helix import SUBSCRIPTIONS
from lumio_ingestd.sources.twitch.mapping import (
    PLATFORM,
    channel_of,
    decode_checked,
    decode_json,
    map_notification,
    subscription_type_of,
)
from lumio_ingestd.sources.twitch.sink import TwitchSink
from lumio_ingestd.sources.webhookcheck import WebhookChecks
from lumio_ingestd.web.server import Request, Response

log = logging.getLogger("lumio_ingestd.sources.twitch.webhook")

PATH = "/webhooks/twitch"
MAX_BODY_BYTES = 256 * 1024
MAX_AGE_SECS = 600.0
GIFT_WAIT_SECS = 2.0
SECRET_KEY = "[twitch] webhook_secret_file"

H_ID = "Twitch-Eventsub-Message-Id"
H_TIMESTAMP = "Twitch-Eventsub-Message-Timestamp"
H_SIGNATURE = "Twitch-Eventsub-Message-Signature"
H_TYPE = "Twitch-Eventsub-Message-Type"
H_SUB_TYPE = "Twitch-Eventsub-Subscription-Type"


def signature(secret: str, message_id: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), message_id.encode() + timestamp.encode() + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


class TwitchWebhook:
    def __init__(self, secret: Secret | None, accounts: Mapping[str, int], sink: TwitchSink,
                 chat: PersistChat, seen: SeenIds,
                 metrics: Metrics, *, gift_wait_secs: float = GIFT_WAIT_SECS,
                 max_age_secs: float = MAX_AGE_SECS, types: Iterable[str] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 frames: FrameSink | None = None) -> None:
        self._secret = secret
        self._accounts = dict(accounts)
        self._sink = sink
        self._chat = chat
        self._seen = seen
        self._metrics = metrics
        self._gift_wait = gift_wait_secs
        self._checks = WebhookChecks(PLATFORM, log, max_age_secs=max_age_secs, clock=clock,
                                     timestamp_header=H_TIMESTAMP)
        self._lock = threading.Lock()
        self._gifts: dict[int, GiftLinker] = {}
        self._types = frozenset(types if types is not None else (s.type for s in SUBSCRIPTIONS))
        self._refused_log = Throttled(log)
        #: Where refused bodies go with their raw bytes.
        self.frame_quarantine = frames

    def handle(self, request: Request) -> Response:
        response, result = self._handle(request)
        self._metrics.http_webhook_requests.labels(PLATFORM, result).inc()
        return response

    # -- the checks ---------------------------------------------------------------------

    def _handle(self, request: Request) -> tuple[Response, str]:
        if self._secret is None:
            return Response.json(403, {"error": f"webhooks are disabled until {SECRET_KEY} is set"}), \
                "disabled"
        headers = request.headers
        message_id = (headers.get(H_ID) or "").strip()
        timestamp = (headers.get(H_TIMESTAMP) or "").strip()
        given = (headers.get(H_SIGNATURE) or "").strip()
        message_type = (headers.get(H_TYPE) or "").strip()
        if not (message_id and timestamp and given and message_type):
            return Response.json(400, {"error": f"missing {H_ID}, {H_TIMESTAMP}, {H_SIGNATURE} or "
                                                f"{H_TYPE} header"}), "bad_request"
        expected = signature(self._secret.reveal(), message_id, timestamp, request.body)
        if not hmac.compare_digest(expected.encode(), given.lower().encode()):
            return self._checks.forged(request, message_id)
        sent_at = self._checks.sent_at(timestamp, message_id)
        if not isinstance(sent_at, datetime):
            return sent_at
        if message_type == "webhook_callback_verification":
            return self._challenge(request.body)
        if message_type == "revocation":
            return self._revocation(request.body)
        if message_type != "notification":
            log.info("twitch webhook: unsupported message type %r; acknowledged", message_type[:64])
            return Response(204), "unsupported"
        if self._seen.seen(message_id):
            return Response.json(200, {"duplicate": True}), "replayed"
        return self._notification(request, message_id, sent_at)

    def _challenge(self, body: bytes) -> tuple[Response, str]:
        try:
            challenge = decode_json(body).get("challenge")
        except BadFrame as exc:
            return Response.json(400, {"error": f"bad body: {exc}"}), "bad_request"
        if not isinstance(challenge, str) or not challenge:
            return Response.json(400, {"error": "no challenge in the body"}), "bad_request"
        return Response(200, challenge.encode(), "text/plain; charset=utf-8"), "challenge"

    def _revocation(self, body: bytes) -> tuple[Response, str]:
        try:
            obj = decode_json(body)
        except BadFrame as exc:
            return Response.json(400, {"error": f"bad body: {exc}"}), "bad_request"
        raw_sub = obj.get("subscription")
        sub: dict[str, object] = raw_sub if isinstance(raw_sub, dict) else {}
        status = str(sub.get("status") or "unknown")[:64]
        label = status if status in ("authorization_revoked", "user_removed", "version_removed",
                                     "notification_failures_exceeded", "moderator_removed") else "other"
        self._metrics.source_revocations.labels(PLATFORM, label).inc()
        log.warning("twitch webhook: Twitch revoked the %s subscription for channel %s (%s)",
                    str(sub.get("type") or "?")[:128], channel_of(obj) or "?", status)
        return Response(204), "revocation"

    # -- notifications -----------------------------------------------------------------

    def _notification(self, request: Request, message_id: str, sent_at: datetime) -> tuple[Response, str]:
        try:
            body, clean = decode_checked(request.body)
            # The signed body decides; the header is not covered by the signature.
            sub_type = subscription_type_of(body)
            header_type = (request.headers.get(H_SUB_TYPE) or "").strip()
            if header_type and header_type != sub_type:
                raise BadFrame("shape", "Twitch-Eventsub-Subscription-Type disagrees with the body")
            if sub_type not in self._types:
                self._metrics.source_bad_frames.labels(PLATFORM, "unsubscribed").inc()
                self._refused_log.log(logging.WARNING, "twitch webhook: delivery %s is of type %r, "
                                      "which this daemon never subscribes to; acknowledged, not "
                                      "stored", message_id[:64], sub_type[:128])
                return Response.json(200, {"ignored": "type not subscribed"}), "unsubscribed"
            channel = channel_of(body)
            account_id = self._accounts.get(channel) if channel is not None else None
            if account_id is None:
                log.warning("twitch webhook: delivery %s is for channel %s, which no configured "
                            "account has; acknowledged, not stored", message_id[:64], channel)
                return Response.json(200, {"ignored": "no account for this channel"}), "unknown_account"
            notes = map_notification(account_id, sub_type, body, message_id, sent_at,
                                     known_clean=clean)
        except BadFrame as exc:
            self._metrics.source_bad_frames.labels(PLATFORM, exc.reason).inc()
            if self.frame_quarantine is not None:
                self.frame_quarantine.add(PLATFORM, exc.reason, request.body, str(exc))
            log.warning("twitch webhook: refused delivery %s (%s): %s", message_id[:64], exc.reason, exc)
            return Response.json(400, {"error": f"bad body: {exc}"}), "bad_request"
        lost = 0
        for note in notes:
            if note.chat is not None:
                self._metrics.source_frames.labels(PLATFORM, "chat").inc()
                lost += self._chat(note.chat) == "lost"
            elif note.event is not None:
                self._metrics.source_frames.labels(PLATFORM, "event").inc()
                result = self._sink.deliver_waiting(note, self._linker(account_id), self._gift_wait)
                lost += result.outcome == "lost"
        if lost:
            return Response.json(503, {"error": "not stored; deliver again"}, {"Retry-After": "5"}), "lost"
        self._seen.mark(message_id)
        return Response(204), "stored"

    def _linker(self, account_id: int) -> GiftLinker:
        with self._lock:
            linker = self._gifts.get(account_id)
            if linker is None:
                linker = self._gifts[account_id] = GiftLinker(self._gift_wait, self._metrics)
            return linker
