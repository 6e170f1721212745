"""Where mapped Twitch events go: the shared `EventSink`, plus gift linking.

Shared by the WebSocket source and the webhook receiver, so both store and
announce an event the same way:

- `persist(ev)` is `EventSink.persist` (persist_event, the live alert,
  stream sessions); a gift bomb taken now is counted once here.
- `deliver(note, gifts)` adds the notes of a notification: a gift bomb is
  held by the `GiftLinker` (persisted later with its recipients), a gifted
  sub is persisted and then offered to the linker, `stream.online`/`offline`
  change `stream_sessions`.

Durable when `persist` returns: whatever its `PersistResult` says.
"""

from __future__ import annotations

from collections.abc import Callable

from ...events.persist import PersistResult
from ...metrics import Metrics
from ...model import PlatformEvent
from ...sessions import StreamSessions
from ..sink import Alerts, EventSink
from .gifts import GiftLinker
from .mapping import GIFT_TYPE, PLATFORM, Notification


class TwitchSink(EventSink):
    def __init__(self, persist_event: Callable[[PlatformEvent], PersistResult], metrics: Metrics, *,
                 alerts: Alerts | None, sessions: StreamSessions | None) -> None:
        super().__init__(persist_event, alerts=alerts, sessions=sessions)
        self._metrics = metrics

    def taken(self, result: PersistResult) -> None:
        if result.event.type == GIFT_TYPE:
            self._metrics.events_gift_bombs.labels(PLATFORM).inc()

    def deliver(self, note: Notification, gifts: GiftLinker) -> PersistResult | None:
        """Persist one notification's event; None when it is a gift bomb now held by `gifts`."""
        ev = note.event
        assert ev is not None, "deliver() takes event notifications"
        if note.gift is not None and note.gift.role == "bomb":
            for ready in gifts.hold(ev, note.gift):
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
        for ready in gifts.hold(ev, note.gift):
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
