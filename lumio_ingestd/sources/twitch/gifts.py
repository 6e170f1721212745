"""Linking a gift bomb to its gifted subs.

Twitch announces a community gift as one `channel.subscription.gift`
(with `total` N) plus N `channel.subscribe` notifications with `is_gift`,
each its own delivery, in no promised order (twitchdev/issues#450). The
gifted subs carry no reference to their gift: no gifter, no gift id. So the
link is made by arrival: a gifted sub belongs to the oldest open gift of the
same channel and tier that still has room, and a gifted sub that arrives
before its gift waits (as an "orphan") for a gift that claims it.

How the rows come out (docs/platforms.rst, "What the rows look like": every notification is its own row):

- every `channel.subscribe` is persisted at once as its own event, like any
  other notification; when it is a gifted one it is also offered here;
- the `channel.subscription.gift` is held here, for at most `window_secs`,
  until N gifted subs have been linked to it; it is then persisted once, with
  one `event_children` row per recipient (kind `gift_recipient`, the
  recipient's user id and login, and in the payload the recipient's own
  event id and external id). Holding the gift instead of writing it first
  means the recipients are written in the same transaction as the gift, and
  parked with it when the database is down (docs/architecture.rst, "Held gift bombs"),
  instead of being follow-up writes to a row that may not be there yet;
- the bomb is counted once (`events_gift_bombs`) when the gift is stored,
  however many recipients it has; recipients are counted as linked or not.

A gifted sub that finds no gift within the window is "unlinked": its own
row is stored all the same. A gift whose window ends before all its subs
arrived is persisted with the recipients it has.

Thread-safe: the WebSocket source uses it from its own thread (`due()` from
its idle timer), the webhook receiver from request threads (`wait()` blocks
one request up to the window). Durable: nothing here; a held gift is in memory
until `due()`/`wait()`/`drain()` hands it back for persisting (the source's
release() drains it before it stops). `TwitchSink` writes a durable copy of
every gift before it is held (events/held.py), so a crash in the window does
not lose it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import EventChild, PlatformEvent, format_time
from lumio_ingestd.sources.twitch.mapping import PLATFORM, Gift

CHILD_KIND = "gift_recipient"


@dataclass
class _Open:
    gift: PlatformEvent
    total: int
    tier: str
    opened: float
    recipients: list[EventChild] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.recipients) >= self.total


@dataclass
class _Orphan:
    child: EventChild
    tier: str
    channel: int
    at: float


def recipient_child(sub: PlatformEvent, tier: str) -> EventChild:
    login = sub.payload.get("user_login")
    return EventChild(kind=CHILD_KIND, user_id=sub.user_id,
                      user_login=login if isinstance(login, str) else None,
                      payload={"event_id": str(sub.id), "external_id": sub.external_id,
                               "tier": tier, "created_at": format_time(sub.created_at)})


class GiftLinker:
    def __init__(self, window_secs: float, metrics: Metrics, *, max_open: int = 1000,
                 max_orphans: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_secs = window_secs
        self._metrics = metrics
        self._max_open = max_open
        self._clock = clock
        self._open: dict[uuid.UUID, _Open] = {}  # insertion order = arrival order
        self._orphans: deque[_Orphan] = deque(maxlen=max_orphans)
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return len(self._open)

    def hold(self, gift: PlatformEvent, note: Gift, now: float | None = None) -> list[PlatformEvent]:
        """Hold a gift until its subs are linked. Returns gifts that must be persisted now
        (this one if it needs no recipients, the oldest ones if too many are open)."""
        now = self._clock() if now is None else now
        entry = _Open(gift, note.total, note.tier, now)
        with self._cond:
            self._expire_orphans(now)
            for orphan in list(self._orphans):
                if entry.full:
                    break
                if orphan.tier == note.tier and orphan.channel == gift.account_id:
                    entry.recipients.append(orphan.child)
                    self._orphans.remove(orphan)
            self._open[gift.id] = entry
            out: list[PlatformEvent] = []
            if entry.full:
                out.append(self._release(gift.id))
            while len(self._open) > self._max_open:
                out.append(self._release(next(iter(self._open))))
            self._cond.notify_all()
            return out

    def link(self, sub: PlatformEvent, note: Gift, now: float | None = None) -> bool:
        """Offer a gifted sub (already persisted as its own row); True when a held gift took it."""
        now = self._clock() if now is None else now
        child = recipient_child(sub, note.tier)
        with self._cond:
            for entry in self._open.values():
                if (not entry.full and entry.tier == note.tier
                        and entry.gift.account_id == sub.account_id):
                    entry.recipients.append(child)
                    self._cond.notify_all()
                    return True
            if len(self._orphans) == self._orphans.maxlen:
                self._count_unlinked(1)  # the oldest orphan is pushed out
            self._orphans.append(_Orphan(child, note.tier, sub.account_id, now))
            return False

    def due(self, now: float | None = None) -> list[PlatformEvent]:
        """Gifts that are complete or whose window has ended, with their recipients."""
        now = self._clock() if now is None else now
        with self._cond:
            self._expire_orphans(now)
            ready = [gid for gid, e in self._open.items()
                     if e.full or now - e.opened >= self.window_secs]
            return [self._release(gid) for gid in ready]

    def wait(self, gift_id: uuid.UUID, timeout: float) -> PlatformEvent | None:
        """Block until the held gift is complete or `timeout` passed, then hand it back.

        None if it was handed back already (by `due()`, `drain()` or `hold()`).
        """
        deadline = self._clock() + timeout
        with self._cond:
            while True:
                entry = self._open.get(gift_id)
                if entry is None:
                    return None
                left = deadline - self._clock()
                if entry.full or left <= 0:
                    return self._release(gift_id)
                self._cond.wait(left)

    def drain(self) -> list[PlatformEvent]:
        """Every held gift, as it is (the source stops)."""
        with self._cond:
            out = [self._release(gid) for gid in list(self._open)]
            self._count_unlinked(len(self._orphans))
            self._orphans.clear()
            return out

    # -- internals (lock held) ---------------------------------------------------

    def _release(self, gift_id: uuid.UUID) -> PlatformEvent:
        entry = self._open.pop(gift_id)
        if entry.recipients:
            self._metrics.events_gift_recipients.labels(PLATFORM, "yes").inc(len(entry.recipients))
        return dataclasses.replace(entry.gift, children=tuple(entry.recipients))

    def _expire_orphans(self, now: float) -> None:
        expired = 0
        while self._orphans and now - self._orphans[0].at >= self.window_secs:
            self._orphans.popleft()
            expired += 1
        self._count_unlinked(expired)

    def _count_unlinked(self, n: int) -> None:
        if n:
            self._metrics.events_gift_recipients.labels(PLATFORM, "no").inc(n)
