"""Where mapped Twitch events go: the shared `EventSink`, plus gift linking.

Shared by the WebSocket source and the webhook receiver, so both store and
announce an event the same way:

- `persist(ev)` is `EventSink.persist` (persist_event, the live alert,
  stream sessions); a gift bomb taken now is counted once here.
- `deliver(note, gifts)` adds the notes of a notification: a gift bomb is
  held by the `GiftLinker` (persisted later with its recipients), a gifted
  sub is persisted and then offered to the linker, `stream.online`/`offline`
  change `stream_sessions`.

A gift bomb's durable copy (`held`, events/held.py) is written before it is
held and deleted once its final form was taken, so a crash while it waits for
its recipients does not lose it.

Durable when `persist` returns: whatever its `PersistResult` says.
"""

from __future__ import annotations

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import PersistResult, PlatformEvent, StreamChange
from lumio_ingestd.sources.interfaces import Alerts, HeldCopies, PersistEvent, SessionStore
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.twitch.gifts import GiftLinker
from lumio_ingestd.sources.twitch.mapping import GIFT_TYPE, PLATFORM, Gift, Notification


class TwitchSink(EventSink):
    def __init__(self, persist_event: PersistEvent, metrics: Metrics, *,
                 alerts: Alerts | None, sessions: SessionStore | None,
                 held: HeldCopies | None = None) -> None:
        super().__init__(persist_event, alerts=alerts, sessions=sessions)
        self._metrics = metrics
        self.held = held

    def taken(self, result: PersistResult) -> None:
        if result.event.type == GIFT_TYPE:
            self._metrics.events_gift_bombs.labels(PLATFORM).inc()

    def persist(self, ev: PlatformEvent, stream: StreamChange | None = None) -> PersistResult:
        result = super().persist(ev, stream)
        if self.held is not None and ev.type == GIFT_TYPE and result.outcome != "lost":
            # Taken (or refused for good): the copy written when it was held is not needed.
            self.held.done(ev)
        return result

    def _hold(self, ev: PlatformEvent, gift: Gift, gifts: GiftLinker) -> list[PlatformEvent]:
        """Hold a gift bomb, its durable copy written first (a crash while held keeps it)."""
        if self.held is not None:
            self.held.keep(ev)
        return gifts.hold(ev, gift)

    def deliver(self, note: Notification, gifts: GiftLinker) -> PersistResult | None:
        """Persist one notification's event; None when it is a gift bomb now held by `gifts`."""
        ev = note.event
        assert ev is not None, "deliver() takes event notifications"
        if note.gift is not None and note.gift.role == "bomb":
            for ready in self._hold(ev, note.gift, gifts):
                self.persist(ready)
            return None
        result = self.persist(ev, note.stream)
        if note.gift is not None and result.outcome != "duplicate":
            gifts.link(result.event, note.gift)
        return result

    def deliver_waiting(self, note: Notification, gifts: GiftLinker, wait_secs: float) -> PersistResult:
        """`deliver` for callers without an idle timer (webhook requests): a gift bomb waits
        here, up to `wait_secs`, for its recipients and is persisted before this returns."""
        ev = note.event
        assert ev is not None, "deliver_waiting() takes event notifications"
        if note.gift is None or note.gift.role != "bomb":
            result = self.deliver(note, gifts)
            assert result is not None
            return result
        mine: PersistResult | None = None
        for ready in self._hold(ev, note.gift, gifts):
            result = self.persist(ready)
            if ready.id == ev.id:
                mine = result
        if mine is not None:
            return mine
        held = gifts.wait(ev.id, wait_secs)
        if held is None:
            # Another caller handed it back (drain at shutdown, or eviction) and
            # persisted it, recipients included: persisting the bare event here
            # could store it first and drop the recipients as a duplicate.
            return PersistResult("duplicate", ev)
        return self.persist(held)
