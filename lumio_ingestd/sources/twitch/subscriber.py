"""Creating a new session's subscriptions, and taking back the ones a lost session still holds.

Twitch keeps a session's subscriptions enabled for a while after its socket
died without a clean close (a half-open TCP connection, a network black hole,
a keepalive timeout on our side). Meanwhile a new session's
`POST /eventsub/subscriptions` is refused with 409 for every type, the
notifications go to the dead session, and Twitch closes the new one as
unused (4003). A 409 is therefore no success: it only says that some session
holds the subscription.

`Subscriber.subscribe()` runs one pass over the wanted subscriptions for a
new session, inside the window Twitch gives after the welcome:

1. POST each. 202: created on this session (`result="ok"`).
2. On the first 409, list the account's subscriptions once
   (`GET ...?user_id=BROADCASTER`, every page), and by type
   (`GET ...?type=T`) when that listing shows nothing holding the type.
   Each holder with the same type, version and condition is judged by its
   transport (livesessions.py): bound to this session, the subscription is
   ours already (`exists`); bound to another live session of ours, it is
   left alone (`exists`, and the type is not this session's); a websocket
   session that is neither is an orphan: it is deleted
   (`DELETE ...?id=`) and the subscription created again
   (`orphan_replaced`). A webhook is never touched.
3. Once the listing is known, the orphans of the types still to come are
   deleted before their POST, which then succeeds at once.

What could not be taken back (a holder that is ours, a webhook, a DELETE
that failed or found no time left in the window, a 409 again after it, a 409
nobody is listed for) is reported as held elsewhere, with the session that
holds it and why, for `lumio-ingestd status`. Counted in
`source_subscriptions_total{platform="twitch",result}` (`ok`, `exists`,
`orphan_replaced`, `failed`, `late`). Nothing durable here: subscriptions
live at Twitch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.base import SourceClosed
from lumio_ingestd.sources.twitch.helix import (
    HeldSubscription,
    HelixClient,
    HelixError,
    Subscription,
    condition_for,
)
from lumio_ingestd.sources.twitch.mapping import PLATFORM

log = logging.getLogger("lumio_ingestd.sources.twitch.subscriber")

#: The longest one Helix request may take inside the window.
REQUEST_SECS = 5.0
#: A request is not started with less than this left of the window.
MIN_LEFT_SECS = 0.2

Key = tuple[str, str, frozenset[tuple[str, str]]]


def key_of(sub_type: str, version: str, condition: dict[str, str] | Iterable[tuple[str, str]]) -> Key:
    items = condition.items() if isinstance(condition, dict) else condition
    return sub_type, version, frozenset(items)


@dataclass(frozen=True, slots=True)
class HeldElsewhere:
    """A wanted subscription that another session keeps (for status)."""

    type: str
    session_id: str | None  # None: a webhook, or a holder Twitch did not list
    status: str
    ours: bool  # the holder is a live session of ours (never deleted)
    why: str

    def as_json(self) -> dict[str, object]:
        return {"subscription": self.type, "session_id": self.session_id, "status": self.status,
                "ours": self.ours, "why": self.why}


@dataclass
class SubscribeResult:
    created: set[str] = field(default_factory=set)  # types enabled on this session
    held: list[HeldElsewhere] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "type (why)", for the log
    replaced: list[HeldSubscription] = field(default_factory=list)  # the orphans deleted


@dataclass
class Verdict:
    """The holders of one subscription, sorted by what may be done with them."""

    mine: list[HeldSubscription] = field(default_factory=list)  # this session holds it
    ours: list[HeldSubscription] = field(default_factory=list)  # another live session of ours
    foreign: list[HeldSubscription] = field(default_factory=list)  # a webhook, or no session id
    orphans: list[HeldSubscription] = field(default_factory=list)  # to delete

    @property
    def replaceable(self) -> bool:
        """Orphans hold it and nothing of ours does: deleting them gives it to this session."""
        return bool(self.orphans) and not self.mine and not self.ours


def judge(holders: Iterable[HeldSubscription], mine: Collection[str],
          ours: Collection[str]) -> Verdict:
    """Sort the holders of one subscription.

    `mine` holds the new session's id and the ids of the sessions whose
    subscriptions its socket inherited (a hand-off may keep the old id in the
    transport); `ours` the ids every socket of this process holds open (with
    what they inherited). Only a websocket subscription bound to a session in
    neither is an orphan; a webhook or a websocket transport without a
    session id is left alone.
    """
    verdict = Verdict()
    for held in holders:
        if held.method != "websocket" or held.session_id is None:
            verdict.foreign.append(held)
        elif held.session_id in mine:
            verdict.mine.append(held)
        elif held.session_id in ours:
            verdict.ours.append(held)
        else:
            verdict.orphans.append(held)
    return verdict


class Subscriber:
    def __init__(self, helix: HelixClient, broadcaster_id: str, metrics: Metrics, *,
                 name: str) -> None:
        self._helix = helix
        self._broadcaster = broadcaster_id
        self._metrics = metrics
        self._name = name

    def subscribe(self, subscriptions: Sequence[Subscription], session_id: str, *,
                  mine: Collection[str], ours: Callable[[], Collection[str]], deadline: float,
                  stopping: Callable[[], bool], created: set[str] | None = None) -> SubscribeResult:
        """One pass for `session_id`, every request started before `deadline` (monotonic).
        `mine` and `ours()` say which holders are this session and which other live ones of
        ours (`judge`).
        The types enabled on the session are added to `created` as they are (the result's
        `created`). Raises SourceClosed when `stopping()` turns true, TokenError when the
        token is gone."""
        pass_ = _Pass(self, session_id, {session_id, *mine}, ours, deadline)
        if created is not None:
            pass_.result.created = created
        for sub in subscriptions:
            if stopping():
                raise SourceClosed("stopping")
            pass_.one(sub)
        pass_.report()
        return pass_.result

    def _count(self, result: str) -> None:
        self._metrics.source_subscriptions.labels(PLATFORM, result).inc()


class _Pass:
    """One subscribe pass: the listing (once asked for) and what became of each type."""

    def __init__(self, owner: Subscriber, session_id: str, mine: Collection[str],
                 ours: Callable[[], Collection[str]], deadline: float) -> None:
        self.owner = owner
        self.helix = owner._helix
        self.session_id = session_id
        self.mine = mine
        self.ours = ours
        self.deadline = deadline
        self.result = SubscribeResult()
        self.listing: dict[Key, list[HeldSubscription]] | None = None
        self.listed_types: set[str] = set()
        self.list_error: HelixError | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self) -> float:
        left = self.left()
        if left <= MIN_LEFT_SECS:
            raise _WindowOver()
        return min(REQUEST_SECS, left)

    def one(self, sub: Subscription) -> None:
        condition = condition_for(sub.type, self.owner._broadcaster)
        key = key_of(sub.type, sub.version, condition)
        try:
            replaced = self._clear(sub.type, key) if self.listing is not None else []
            status, _ = self.helix.create_subscription(sub, condition, self.session_id,
                                                       timeout=self.timeout())
            if status == 409:
                self._conflict(sub, key, condition)
                return
        except _WindowOver:
            self._fail(sub.type, "window over", "late")
            return
        except HelixError as exc:
            self._fail(sub.type, str(exc))
            return
        self.result.created.add(sub.type)
        self.owner._count("orphan_replaced" if replaced else "ok")

    def _conflict(self, sub: Subscription, key: Key, condition: dict[str, str]) -> None:
        """A 409: find who holds it; take it back from orphans."""
        try:
            holders = self._holders(sub.type, key)
        except HelixError as exc:
            self.result.held.append(HeldElsewhere(sub.type, None, "unknown", False,
                                                  f"409, and the listing failed ({exc})"))
            raise
        verdict = judge(holders, self.mine, self.ours())
        if verdict.mine:
            self.result.created.add(sub.type)
            self.owner._count("exists")
            return
        if verdict.ours:
            for held in verdict.ours:
                self._held(sub.type, held, "another live session of ours holds it", ours=True)
            self.owner._count("exists")
            return
        if verdict.orphans:
            self._delete(sub.type, verdict.orphans)
            status, _ = self.helix.create_subscription(sub, condition, self.session_id,
                                                       timeout=self.timeout())
            if status != 409:
                self.result.created.add(sub.type)
                self.owner._count("orphan_replaced")
                return
            why = "409 again after its orphan was deleted"
        else:
            why = "409, but no websocket subscription listed holds it"
        for held in verdict.foreign:  # not this daemon's to delete
            self._held(sub.type, held, f"a {held.method} subscription holds it")
        if not verdict.foreign:
            self.result.held.append(HeldElsewhere(sub.type, None, "unlisted", False, why))
        self._fail(sub.type, why)

    def _clear(self, sub_type: str, key: Key) -> list[HeldSubscription]:
        """Before a POST, once the listing is known: delete the orphans holding this type."""
        assert self.listing is not None
        verdict = judge(self.listing.get(key, ()), self.mine, self.ours())
        if not verdict.replaceable:
            return []
        self._delete(sub_type, verdict.orphans)
        return verdict.orphans

    def _holders(self, sub_type: str, key: Key) -> list[HeldSubscription]:
        """Who holds `key`, from the account's listing (asked once a pass), else the type's."""
        if self.list_error is not None:
            raise self.list_error
        try:
            if self.listing is None:
                self.listing = {}
                self._list(user_id=self.owner._broadcaster)
            if key not in self.listing and sub_type not in self.listed_types:
                self._list(sub_type=sub_type)  # the user filter may not reach every condition key
        except HelixError as exc:
            self.list_error = exc
            raise
        return self.listing.get(key, [])

    def _list(self, *, sub_type: str | None = None, user_id: str | None = None) -> None:
        assert self.listing is not None
        listing = self.helix.list_subscriptions(timeout=self.timeout(), sub_type=sub_type,
                                                user_id=user_id)
        if listing.unreadable:
            log.warning("%s: %d item(s) of the subscription listing (%s) could not be read "
                        "(no id, type, version, condition or transport); left alone",
                        self.owner._name, listing.unreadable,
                        f"type={sub_type}" if sub_type else f"user_id={user_id}")
        if sub_type is not None:
            self.listed_types.add(sub_type)
        seen = {h.id for holders in self.listing.values() for h in holders}
        for held in listing.items:
            if held.id not in seen:
                self.listing.setdefault(key_of(held.type, held.version, held.condition.items()),
                                        []).append(held)
                self.listed_types.add(held.type)

    def _delete(self, sub_type: str, orphans: list[HeldSubscription]) -> None:
        assert self.listing is not None
        for held in orphans:
            try:
                self.helix.delete_subscription(held.id, timeout=self.timeout())
            except (HelixError, _WindowOver) as exc:
                self._held(sub_type, held, f"its orphan could not be deleted ({exc or 'window over'})")
                raise
            self.result.replaced.append(held)
            for holders in self.listing.values():
                if held in holders:
                    holders.remove(held)

    def _held(self, sub_type: str, held: HeldSubscription, why: str, *, ours: bool = False) -> None:
        self.result.held.append(HeldElsewhere(sub_type, held.session_id, held.status, ours, why))

    def _fail(self, sub_type: str, why: str, label: str = "failed") -> None:
        self.result.failed.append(f"{sub_type} ({why})")
        self.owner._count(label)

    def report(self) -> None:
        r, name = self.result, self.owner._name
        if r.replaced:
            sessions = sorted({h.session_id or "?" for h in r.replaced})
            log.warning("%s: %d subscription(s) were held by session(s) %s, which are not ours "
                        "and not live (a connection lost without a clean close); deleted and "
                        "created again on session %s", name, len(r.replaced), ", ".join(sessions),
                        self.session_id)
        if r.held:
            log.warning("%s: %d subscription(s) held elsewhere: %s", name, len(r.held), "; ".join(
                f"{h.type} by {h.session_id or 'an unlisted holder'} ({h.why})" for h in r.held))


class _WindowOver(Exception):
    """Too little of the subscribe window is left to start another request."""
