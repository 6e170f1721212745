"""One account's 7TV emote set: what is known of it, and how a change becomes events.

`Followed` is the per-account record (worked on by one thread at a time: the
socket's reader or its healer, see `busy`);
`Follower` applies to it what the socket reads and what the REST API says:

- `heal(f)`: load the stored state (once), find the active emote set (the
  configured one; the one a `user.update` named; else the API's, from the
  Twitch id or the 7TV user id), fetch it and diff it with the stored state.
  No stored state yet: the set is the baseline, stored without events. A set
  or user that is not subscribed yet is not fetched: the heal ends there, due
  again, and the socket runs it once the server has acked the subscription.
- `on_set_update(f, update)`: an `emote_set.update` dispatch, as a target
  state, diffed with the stored state (`judge_update`: a dispatch sent again
  changes nothing; one that disagrees with the state stores nothing and
  makes the account due for a heal, which stores what the API says).
- `on_user_update(f, update)`: a switch of the active set away from the
  followed one: heal towards the new set (its difference becomes events).

Consistency. Every change set is applied the same way (`_apply`): its events
go through the sink one by one (`persist_event`: stored, else parked in
Redis, else spooled); only when every one was durably taken is the new state
saved (a compare-and-set on the version it was computed from). An event that
could not be taken anywhere ("lost") stops the change set: the state stays,
and a heal later computes the same events (same external ids). A save that
fails (the database is down) keeps the new state pending: dispatches for the
account are dropped meanwhile (counted) and, once the save lands, a heal
recovers what they said. A crash between the events and the save leaves the
old state: the next heal recomputes the same events, which are duplicates of
the stored or parked ones, and stores nothing twice.

Nothing durable here beyond what the sink and the store say.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import PersistResult, PlatformEvent
from lumio_ingestd.sources.interfaces import SetStateStore
from lumio_ingestd.sources.seventv.api import ApiError, NotOnSevenTv, SevenTvApi
from lumio_ingestd.sources.seventv.protocol import (
    EMOTE_SET_UPDATE,
    USER_UPDATE,
    Change,
    Context,
    SetState,
    SetUpdate,
    UserUpdate,
    carry_known,
    diff,
    judge_update,
    ms_to_datetime,
    removed_after,
    to_event,
)

log = logging.getLogger("lumio_ingestd.sources.seventv.follow")

#: A REST-found addition carries the time it was made when that is this recent (else: now).
RECENT = timedelta(hours=24)




class Sink(Protocol):
    def persist(self, ev: PlatformEvent) -> PersistResult: ...


Subscription = tuple[str, str]  # (type, object id)


@dataclass
class Followed:
    account_id: int
    twitch_user_id: str | None = None
    #: Configured: the only set followed (switches are not followed).
    pinned_set: str | None = None
    #: Configured, else found through the API.
    user_id: str | None = None
    #: `user_id` is configured: the API's answer does not replace it.
    user_configured: bool = False
    state: SetState | None = None
    loaded: bool = False
    #: A state whose events were taken but which is not saved yet, and the version it replaces.
    pending: SetState | None = None
    heal_due: bool = True
    heal_at: float = 0.0
    heal_failures: int = 0
    #: The set a user.update switched to (trusted over a possibly stale API answer).
    set_hint: str | None = None
    #: 7TV said it has no such user: asked again rarely, and said once in the log.
    missing: bool = False
    #: One thread at a time works on the account (the socket's reader applying a dispatch, or
    #: its healer); what arrives meanwhile waits in `deferred` and is run by that thread next,
    #: so neither thread ever waits for the other. `guard` only covers these two fields.
    #: Grows when a reconnect asks for a heal from another thread: a heal that was already
    #: running (its fetch may be older than the reconnect) then leaves the account due.
    heal_asked: int = 0
    busy: bool = field(default=False, repr=False, compare=False)
    deferred: list[Callable[[], object]] = field(default_factory=list, repr=False, compare=False)
    guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def cost(self) -> int:
        """Subscriptions this account needs on a connection."""
        return 1 if self.pinned_set else 2

    @property
    def set_id(self) -> str | None:
        """The set to subscribe to: a set named by user.update or found by the API is subscribed
        before the heal fetches it, so no change made in between is missed; then the set of the
        state waiting to be saved, then that of the stored one (it never falls back to an older
        set while a newer one is being stored)."""
        if self.pinned_set:
            return self.pinned_set
        if self.set_hint:
            return self.set_hint
        held = self.pending or self.state
        return held.set_id if held is not None else None

    def subscriptions(self) -> list[Subscription]:
        subs: list[Subscription] = []
        if self.set_id is not None:
            subs.append((EMOTE_SET_UPDATE, self.set_id))
        if not self.pinned_set and self.user_id is not None:
            subs.append((USER_UPDATE, self.user_id))
        return subs


class Follower:
    def __init__(self, name: str, api: SevenTvApi, store: SetStateStore, sink: Sink, metrics: Metrics, *,
                 heal_retry_min_secs: float = 2.0, heal_retry_max_secs: float = 60.0,
                 missing_retry_secs: float = 1800.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.name = name
        self.api = api
        self.store = store
        self.sink = sink
        self.metrics = metrics
        self.heal_retry_min_secs = heal_retry_min_secs
        self.heal_retry_max_secs = heal_retry_max_secs
        self.missing_retry_secs = missing_retry_secs
        self._clock = clock

    # -- heal (REST) --------------------------------------------------------------------------

    def heal(self, f: Followed) -> bool:
        """Bring `f` up to date with the API; True when done, False when it is due again later."""
        asked, subscribed = f.heal_asked, f.subscriptions()
        try:
            ok = self._heal(f, subscribed)
        except NotOnSevenTv as exc:
            # Not an outage: many streamers have no 7TV. One line, then a quiet, rare retry.
            log.log(logging.DEBUG if f.missing else logging.INFO, "%s: account %d: %s; asking again "
                    "every %.0f s", self.name, f.account_id, exc, self.missing_retry_secs)
            self.metrics.seventv_heals.labels("failed").inc()
            f.missing, f.heal_due, f.heal_at = True, True, time.monotonic() + self.missing_retry_secs
            return False
        except ApiError as exc:
            log.warning("%s: account %d: 7TV API: %s", self.name, f.account_id, exc)
            ok = False
        except Exception as exc:  # noqa: BLE001 - the database (load, save) or a bug: retry later
            log.warning("%s: account %d: heal failed (%s: %s)", self.name, f.account_id,
                        type(exc).__name__, str(exc)[:300])
            ok = False
        held = f.pending or f.state
        if held is not None and held.set_id == f.set_hint:
            f.set_hint = None  # its set is now the one being stored or stored
        if ok:
            f.heal_failures, f.missing = 0, False
            # Found a set or user to subscribe: heal again, once the server has acked it.
            f.heal_due = f.heal_asked != asked or f.subscriptions() != subscribed
            if f.heal_due:
                f.heal_at = 0.0
        else:
            self.metrics.seventv_heals.labels("failed").inc()
            f.heal_failures += 1
            delay = min(self.heal_retry_max_secs, self.heal_retry_min_secs * 2.0 ** (f.heal_failures - 1))
            f.heal_due, f.heal_at = True, time.monotonic() + delay
        return ok

    def _heal(self, f: Followed, subscribed: list[Subscription]) -> bool:
        if f.pending is not None and not self._save_pending(f):
            return False
        if not f.loaded:
            f.state = self.store.load(f.account_id)
            f.loaded = True
            if f.user_id is None and f.state is not None:
                f.user_id = f.state.user_id  # user.update is followed before the API answers
        set_id = self._active_set(f)
        if set_id is not None and set_id != f.set_id:
            f.set_hint = set_id
        if f.subscriptions() != subscribed:
            # A set or user found only now: it is subscribed first and fetched by the next heal,
            # which the socket runs once the server has acked the subscription. Fetched now, a
            # change made before that Ack would be dispatched to nobody and never stored.
            return True
        if set_id is None:
            return f.set_id is None and f.user_id is not None  # no set yet: wait for user.update
        now = self._clock()
        emotes = self.api.emote_set(set_id)
        if emotes is None:
            log.warning("%s: account %d: 7TV emote set %s does not exist", self.name, f.account_id, set_id)
            return False
        base = f.state
        if base is None:
            new = SetState(set_id, emotes, 1, f.user_id)
            if not self.store.save(f.account_id, new, None):
                f.loaded = False  # another writer was first: read theirs next time
                self.metrics.seventv_state_saves.labels("conflict").inc()
                return False
            f.state = new
            self.metrics.seventv_state_saves.labels("saved").inc()
            self.metrics.seventv_heals.labels("baseline").inc()
            log.info("%s: account %d: emote set %s with %d emotes stored as the baseline",
                     self.name, f.account_id, set_id, len(emotes))
            return True
        switched = base.set_id != set_id
        if not switched:
            emotes = carry_known(base.emotes, emotes)
        # Another set's removals say nothing of this one.
        removed = {} if switched else removed_after(base, emotes)
        changes = diff(base.emotes, emotes, compare_ts=not switched)
        if not changes and not switched and dict(base.emotes) == emotes and base.user_id == f.user_id:
            self.metrics.seventv_heals.labels("unchanged").inc()
            return True
        ctx = Context(set_id, base.version, now, "rest",
                      previous_set_id=base.set_id if switched else None)
        if switched:
            log.info("%s: account %d: active emote set %s -> %s (%d changes)", self.name,
                     f.account_id, base.set_id, set_id, len(changes))
        elif changes:
            log.info("%s: account %d: %d change(s) in emote set %s found through the API",
                     self.name, f.account_id, len(changes), set_id)
        self.metrics.seventv_heals.labels("changed" if changes or switched else "unchanged").inc()
        return self._apply(f, changes, SetState(set_id, emotes, base.version + 1, f.user_id, removed),
                           ctx)

    def _active_set(self, f: Followed) -> str | None:
        if f.pinned_set:
            return f.pinned_set
        if f.set_hint:
            return f.set_hint
        if f.twitch_user_id is not None:
            user_id, set_id = self.api.twitch_user(f.twitch_user_id)
            if not f.user_configured:
                f.user_id = user_id
            return set_id
        if f.user_id is not None:
            return self.api.user_active_set(f.user_id)
        raise ApiError("the account has neither seventv_user_id nor twitch_user_id")

    # -- dispatches ----------------------------------------------------------------------------

    def on_set_update(self, f: Followed, update: SetUpdate, t: int | None) -> None:
        state = f.state
        if state is None or f.pending is not None:
            # No baseline yet, or the last change set is not saved: the heal covers it.
            self.metrics.seventv_dispatches.labels("not_ready").inc()
            f.heal_due = True
            return
        if state.set_id != update.set_id:
            self.metrics.seventv_dispatches.labels("not_followed").inc()
            return
        judged = judge_update(state, update, t)
        if judged.disagreements:
            # Sent again after later changes, or one step of several this state missed: which,
            # the dispatch cannot say. Nothing of it is applied; a heal reads the set now.
            self.metrics.seventv_dispatches.labels("stale").inc()
            log.info("%s: account %d: emote_set.update disagrees with the stored state (%s): not "
                     "applied; healing through the API", self.name, f.account_id,
                     "; ".join(judged.disagreements[:5]))
            f.heal_due = True
            return
        changes = diff(state.emotes, judged.emotes)
        if not changes:
            if judged.repeats:
                log.debug("%s: account %d: emote_set.update repeats what is stored (%s)", self.name,
                          f.account_id, "; ".join(judged.repeats[:5]))
            self.metrics.seventv_dispatches.labels("unchanged").inc()
            return
        self.metrics.seventv_dispatches.labels("applied").inc()
        at = ms_to_datetime(t) if t is not None else self._clock()
        ctx = Context(state.set_id, state.version, at, "eventapi", actor=update.actor)
        self._apply(f, changes, SetState(state.set_id, judged.emotes, state.version + 1, state.user_id,
                                         judged.removed), ctx)

    def on_user_update(self, f: Followed, update: UserUpdate) -> bool:
        """True when the followed set changes: the caller subscribes to the new set, then heals
        the account (which stores the difference and moves the state to the new set)."""
        if f.pinned_set:
            self.metrics.seventv_dispatches.labels("not_followed").inc()
            return False
        current = f.set_id
        for switch in update.switches:
            if switch.new is None or switch.new == current:
                continue
            if current is not None and switch.old is not None and switch.old != current:
                continue  # another connection's (platform's) set
            self.metrics.seventv_dispatches.labels("applied").inc()
            log.info("%s: account %d: user.update: active emote set %s -> %s", self.name,
                     f.account_id, current, switch.new)
            f.set_hint = switch.new
            f.heal_due, f.heal_at, f.heal_failures = True, 0.0, 0
            return True
        self.metrics.seventv_dispatches.labels("unchanged").inc()
        return False

    # -- one change set ------------------------------------------------------------------------------

    def _apply(self, f: Followed, changes: list[Change], new: SetState, ctx: Context) -> bool:
        base = f.state
        assert base is not None
        for change in changes:
            ev = to_event(f.account_id, change, self._context_for(change, ctx))
            result = self.sink.persist(ev)
            if result.outcome == "lost":
                log.error("%s: account %d: %s of emote %s could not be kept anywhere; the state "
                          "stays at version %d and a heal will try again", self.name, f.account_id,
                          ev.type, change.emote_id, base.version)
                self.metrics.seventv_changes.labels(change.kind, ctx.via, "lost").inc()
                f.heal_due, f.heal_at = True, time.monotonic() + self.heal_retry_min_secs
                return False
            label = result.outcome if result.outcome in ("duplicate", "rejected") else "taken"
            self.metrics.seventv_changes.labels(change.kind, ctx.via, label).inc()
            if result.outcome == "rejected":
                log.error("%s: account %d: %s of emote %s rejected by the database (%s); skipped",
                          self.name, f.account_id, ev.type, change.emote_id, result.error)
        f.pending = new
        return self._save_pending(f)

    def _context_for(self, change: Change, ctx: Context) -> Context:
        if ctx.via == "rest" and ctx.previous_set_id is None and change.kind == "added" \
                and change.ts is not None:
            added = ms_to_datetime(change.ts)
            if ctx.at - RECENT <= added <= ctx.at:
                return replace(ctx, at=added)
        return ctx

    def _save_pending(self, f: Followed) -> bool:
        new, base = f.pending, f.state
        assert new is not None and base is not None
        try:
            saved = self.store.save(f.account_id, new, base.version)
        except Exception as exc:  # noqa: BLE001 - the database: kept pending, retried
            self.metrics.seventv_state_saves.labels("failed").inc()
            log.warning("%s: account %d: emote set state v%d not saved (%s: %s); dispatches wait "
                        "for it", self.name, f.account_id, new.version, type(exc).__name__,
                        str(exc)[:200])
            f.heal_due = True  # heal() retries the save first, with backoff
            return False
        f.pending = None
        if not saved:
            self.metrics.seventv_state_saves.labels("conflict").inc()
            log.warning("%s: account %d: the stored emote set state moved under us (not v%d); "
                        "re-reading it", self.name, f.account_id, base.version)
            f.loaded, f.heal_due = False, True
            return False
        self.metrics.seventv_state_saves.labels("saved").inc()
        f.state = new
        return True

