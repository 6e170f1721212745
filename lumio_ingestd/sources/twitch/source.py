"""`TwitchSource`: one account's EventSub WebSocket, one thread.

The thread connects (token validated, socket opened, `session_welcome`
read), creates the account's subscriptions through Helix inside the window
Twitch gives after the welcome (10 s; a session without a subscription is
closed with 4003; subscriber.py takes back what a session lost without a
clean close still holds, and a session left with none of its own is closed
here and never reported healthy), and then reads: chat goes to the source's in-memory
`ChatQueue` (handed to Redis in small batches, at the latest every
`max_delay_secs`), events go through `TwitchSink` (persist_event, alerts,
gift linking, stream sessions) one at a time.

When the connection ends it reconnects to the base URL with jittered
exponential backoff (the Source base) and subscribes again; the close codes
are handled as Twitch documents them (docs/platforms.rst, "Close codes"):

    4000 internal server error       reconnect with backoff, resubscribe
    4001 client sent inbound traffic  a bug here (nothing is ever sent):
                                      logged as an error, reconnect after the
                                      longest backoff
    4002 failed ping-pong             reconnect (pongs are sent by the reader)
    4003 connection unused            subscriptions came too late: reconnect
    4004 reconnect grace expired      the hand-off failed: base URL, resubscribe
    4005 network timeout, 4006 network error: reconnect, resubscribe
    4007 invalid reconnect URL        base URL, resubscribe

A planned `session_reconnect` is a hand-off inside `EventSubClient`, not a
reconnect: no subscription is created again and nothing is lost or doubled.
A revocation stops that subscription (no more events are expected for it;
the next new session asks for it again, and Helix says whether it may).
A notification whose subscription names another channel, or of a type this
source never subscribes to, is refused (`source_bad_frames` "foreign_channel"
/ "unsubscribed", one warning a minute), never stored under the account.

A graceful stop leaves the sockets whole: the read turn ends once nothing
is left to read without waiting, then `drain()` dispatches what Twitch sent
before it saw our close frame (within the base's `drain_secs`), and only then are the
sockets closed and the queue released.

Durable when the source has stopped: `release()` persisted the gifts still
held and handed the chat queue to Redis (or the database, or the spool),
including what the drain read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from lumio_ingestd.config import AccountConfig, TwitchConfig
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import GapKey
from lumio_ingestd.sources.base import BadFrame, PeerClosed, Source, SourceClosed
from lumio_ingestd.sources.interfaces import ChatQueueLike, FrameSink
from lumio_ingestd.sources.twitch.eventsub import EventSubClient, KeepaliveTimeout
from lumio_ingestd.sources.twitch.gifts import GiftLinker
from lumio_ingestd.sources.twitch.helix import SUBSCRIPTIONS, HelixClient, Subscription
from lumio_ingestd.sources.twitch.livesessions import LiveSessions
from lumio_ingestd.sources.twitch.mapping import (
    PLATFORM,
    Envelope,
    Notification,
    channel_of,
    subscription_type_of,
)
from lumio_ingestd.sources.twitch.oauth import TokenError, TokenRejected, TokenStore
from lumio_ingestd.sources.twitch.sink import TwitchSink
from lumio_ingestd.sources.twitch.subscriber import Subscriber

log = logging.getLogger("lumio_ingestd.sources.twitch.source")

GIFT_WINDOW_SECS = 3.0
SUBSCRIBE_WINDOW_SECS = 10.0
_VALIDATE_CHECK_SECS = 60.0

# What each close code means, and how loud it is (docs/platforms.rst, "Close codes").
CLOSE_CODES: dict[int, tuple[str, int]] = {
    4000: ("Twitch had an internal server error", logging.WARNING),
    4001: ("Twitch says this client sent inbound traffic; it never sends data frames, so this "
           "is a bug here", logging.ERROR),
    4002: ("Twitch says this client failed ping-pong", logging.WARNING),
    4003: ("the connection was unused: no subscription within the window", logging.WARNING),
    4004: ("the reconnect grace time expired: the hand-off failed", logging.WARNING),
    4005: ("network timeout", logging.INFO),
    4006: ("network error", logging.INFO),
    4007: ("the reconnect URL was invalid", logging.WARNING),
}



class TwitchSource(Source):
    platform = PLATFORM
    max_turn_secs = 60.0
    gap_source = "eventsub"

    def __init__(self, account: AccountConfig, twitch: TwitchConfig, *, chat_queue: ChatQueueLike,
                 sink: TwitchSink, tokens: TokenStore, metrics: Metrics,
                 keepalive_secs: int | None = None, keepalive_margin_secs: float | None = None,
                 subscriptions: Sequence[Subscription] = SUBSCRIPTIONS,
                 subscribe_window_secs: float = SUBSCRIBE_WINDOW_SECS,
                 gift_window_secs: float = GIFT_WINDOW_SECS, connect_timeout_secs: float = 10.0,
                 read_budget_secs: float = 0.5, frames: FrameSink | None = None,
                 live: LiveSessions | None = None) -> None:
        if account.twitch_user_id is None:
            raise ValueError(f"account {account.account_id} has no twitch_user_id")
        super().__init__(f"source-twitch-{account.account_id}", metrics, frames=frames)
        self.account_id = account.account_id
        self.broadcaster_id = account.twitch_user_id
        self._queue = chat_queue
        self._sink = sink
        self._tokens = tokens
        self._helix = HelixClient(twitch.helix_url, twitch.client_id, tokens)
        self._subscriber = Subscriber(self._helix, self.broadcaster_id, metrics, name=self.name)
        self._subscriptions = tuple(subscriptions)
        self._subscribe_window = subscribe_window_secs
        self._read_budget = read_budget_secs
        self.gifts = GiftLinker(gift_window_secs, metrics)
        self.client = EventSubClient(
            twitch.eventsub_ws_url, keepalive_secs or twitch.keepalive_timeout_secs, account.account_id,
            self, metrics, connect_timeout_secs=connect_timeout_secs, margin_secs=keepalive_margin_secs,
            name=self.name, live=live)
        self.active: set[str] = set()  # subscription types enabled on the current session
        self._types = frozenset(sub.type for sub in self._subscriptions)
        self._next_validate_check = 0.0
        # Follows are read back from Helix after a gap (followers.py); nothing else is.
        self.gap_mode = "heal" if twitch.heal_follows else "not_healable"

    # -- Source --------------------------------------------------------------------------

    def gap_keys(self) -> list[GapKey]:
        """The events (follows healable) and, on the same socket, chat (never healable)."""
        return [GapKey(self.account_id, PLATFORM, "eventsub", self.gap_mode, self.healer),
                GapKey(self.account_id, PLATFORM, "chat", "not_healable")]

    def connect(self) -> None:
        self._housekeeping(time.monotonic())  # what waited through the backoff goes out first
        try:
            self._tokens.reload_if_changed()
            self._tokens.validate_if_due()
        except TokenRejected as exc:
            log.error("%s: %s", self.name, exc)
            raise
        self._next_validate_check = time.monotonic() + _VALIDATE_CHECK_SECS
        session_id = self.client.connect()
        try:
            self._subscribe(session_id)
        except Exception:  # clean up, then let it propagate
            self.client.reset()
            raise
        # Welcomed and subscribed: the next loss reconnects after the minimum backoff.
        self.mark_healthy()

    def read_once(self) -> None:
        try:
            self.client.read(self._read_budget)
        except SourceClosed as exc:
            if isinstance(exc, PeerClosed):
                self._closed_with(exc.code)
            elif isinstance(exc, KeepaliveTimeout):
                self.metrics.source_closes.labels(PLATFORM, "keepalive").inc()
            # The backoff may be long: nothing read so far waits in memory through it.
            self._queue.drain()
            raise

    def close(self) -> None:
        self.client.abort()
        if self.stopping:
            self._helix.cancel.cancel()  # a subscribe call in flight must not hold up the stop

    def interrupt(self) -> None:
        self.client.wake()
        self._helix.cancel.cancel()  # a subscribe call in flight must not hold up the stop

    def drain(self) -> None:
        n = self.client.drain(self.drain_secs)
        if n:
            log.info("%s: %d message(s) read after the stop, before the socket closed", self.name, n)

    def idle(self) -> None:
        now = time.monotonic()
        self._housekeeping(now)
        if self.connected and now >= self._next_validate_check:
            self._next_validate_check = now + _VALIDATE_CHECK_SECS
            try:
                self._tokens.validate_if_due()
            except TokenRejected as exc:
                # Twitch requires ending sessions whose token is no longer valid.
                log.error("%s: %s; closing the session", self.name, exc)
                self.client.abort()
            except TokenError as exc:
                log.warning("%s: hourly token validation failed (%s); trying again later",
                            self.name, exc)

    def _housekeeping(self, now: float) -> None:
        self._queue.poll()
        for gift in self.gifts.due(now):
            self._sink.persist(gift)
        if self._sink.sessions is not None:
            self._sink.sessions.retry_pending()

    def release(self) -> None:
        self.client.reset()
        # Chat first: its hand-over to Redis is one fast round trip, while a held
        # gift may spend its whole insert bound on a hanging database.
        counts = self._queue.drain()
        for gift in self.gifts.drain():
            self._sink.persist(gift)
        if self._sink.sessions is not None:
            self._sink.sessions.drop_pending()
        log.info("%s: released (%s)", self.name, counts)

    # -- subscriptions --------------------------------------------------------------------

    def _subscribe(self, session_id: str) -> None:
        """Create every subscription on the new session, inside the window after the welcome.

        Only what this session holds counts: a 409 whose holder is a session
        that is not ours and not live is taken back (subscriber.py); a session
        left with no subscription of its own is closed here, never reported
        healthy (Twitch would close it as unused, and its events go elsewhere).
        """
        self.active.clear()
        result = self._subscriber.subscribe(
            self._subscriptions, session_id, mine=self.client.chain, ours=self.client.live.ids,
            deadline=self.client.welcomed_at + self._subscribe_window, stopping=lambda: self.stopping,
            created=self.active)
        self.source_state.held_elsewhere([{"account": self.account_id, **h.as_json()}
                                          for h in result.held])
        if result.failed:
            log.warning("%s: %d subscription(s) not created: %s", self.name, len(result.failed),
                        "; ".join(result.failed))
        if not self.active:
            raise SourceClosed(f"no subscription could be created on session {session_id}"
                               + (f" ({len(result.held)} held elsewhere)" if result.held else ""))
        log.info("%s: session %s with %d subscription(s)", self.name, session_id, len(self.active))

    # -- FrameHandler -----------------------------------------------------------------------

    def on_notification(self, env: Envelope, items: tuple[Notification, ...]) -> None:
        refusal = self._refusal(env)
        if refusal is not None:
            reason, why = refusal
            self.refuse_foreign(reason, f"notification {env.message_id[:64]}", why, logger=log)
            return
        for note in items:
            if note.chat is not None:
                self._queue.add(note.chat)
            elif note.event is not None:
                self._sink.deliver(note, self.gifts)

    def _refusal(self, env: Envelope) -> tuple[str, str] | None:
        """Why a notification is not this account's to store: (reason label, message), else None.

        The socket carries only this account's subscriptions, so a
        notification naming another channel, or of a type never subscribed,
        is not stored under the account (a mixed-up session, or a bug).
        """
        sub_type = env.subscription_type or subscription_type_of(env.payload)
        if sub_type not in self._types:
            return "unsubscribed", f"type {sub_type[:128]!r} was never subscribed on this session"
        channel = channel_of(env.payload)
        if channel is not None and channel != self.broadcaster_id:
            return "foreign_channel", (f"its subscription is for channel {channel[:32]!r}, not this "
                                       f"account's {self.broadcaster_id!r}")
        return None

    def on_revocation(self, env: Envelope) -> None:
        sub = env.payload.get("subscription")
        sub_type = sub.get("type") if isinstance(sub, dict) else None
        status = sub.get("status") if isinstance(sub, dict) else None
        sub_type = sub_type if isinstance(sub_type, str) else env.subscription_type or "?"
        status = status if isinstance(status, str) else "unknown"
        self.active.discard(sub_type)
        label = status if status in ("authorization_revoked", "user_removed", "version_removed",
                                     "moderator_removed") else "other"
        self.metrics.source_revocations.labels(PLATFORM, label).inc()
        log.warning("%s: Twitch revoked the %s subscription (%s); %d left on this session",
                    self.name, sub_type, status, len(self.active))
        if not self.active:
            raise SourceClosed("every subscription was revoked")

    def on_bad_frame(self, exc: BadFrame, raw: bytes = b"") -> None:
        self.metrics.source_bad_frames.labels(PLATFORM, exc.reason).inc()
        self.quarantine_frame(exc.reason, raw, str(exc))
        log.warning("%s: refused a frame (%s): %s", self.name, exc.reason, exc)

    def on_unsupported(self, env: Envelope) -> None:
        self.metrics.source_bad_frames.labels(PLATFORM, "unsupported").inc()
        log.info("%s: unsupported message type %r (id %s) skipped", self.name,
                 env.message_type[:64], env.message_id[:64])

    # -- close codes ------------------------------------------------------------------------

    def _closed_with(self, code: int | None) -> None:
        label = str(code) if code in CLOSE_CODES or code in (1000, 1001, 1006, 1011) else (
            "none" if code is None else "other")
        self.metrics.source_closes.labels(PLATFORM, label).inc()
        if code not in CLOSE_CODES:
            return
        meaning, level = CLOSE_CODES[code]
        log.log(level, "%s: closed with %d: %s; reconnecting to the base URL and subscribing again",
                self.name, code, meaning)
        if code == 4001:
            self.force_backoff(self.reconnect_max_secs)
