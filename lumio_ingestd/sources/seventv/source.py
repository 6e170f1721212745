"""The 7TV EventAPI sources: one thread per socket, each socket owning a group of accounts.

`SevenTvSource` (one `Worker`, the one the daemon supervises) hands the
accounts out to `SevenTvSocket`s, each a `Source` with its own thread and
connection. A connection carries the subscriptions of many accounts, up to
the `subscription_limit` its Hello names: the first socket is given every
account; after its Hello it keeps as many as fit (an account costs two
subscriptions, `emote_set.update` and `user.update`; one when its set is
configured) and gives the rest back; the next socket takes those, and so on.
So N accounts need ceil(N * 2 / limit) sockets, and one when the server names
no limit. A later Hello with a smaller limit gives the overflow back the same way.

A socket, on every (re)connect:

1. reads op 1 Hello (`heartbeat_interval`, `session_id`, `subscription_limit`);
2. sends op 34 Resume with the previous session id (when `resume` is on) and
   reads its Ack for a moment: the current server answers `success: false`,
   and either way nothing depends on it but which subscriptions the server
   already holds;
3. subscribes (op 35) to what its accounts need and are known to need; once
   the server has acked (op 5) every subscribe sent on this connection, the
   session is healthy (`mark_healthy`): its loss reconnects after the minimum
   backoff, while sessions lost before that (a server that welcomes and then
   drops) grow it. A session with nothing to subscribe is healthy on its Hello;
   one whose ack never comes (a refused subscribe) is left to the base's
   `stable_after_secs`;
4. heals every account through the REST API (`Follower.heal`): the set is
   fetched and diffed with the stored state, so what changed while the socket
   was down is stored once. A set found only now (an account's first heal, a
   switch only the API shows) is subscribed first and fetched by the next heal.
   Heals run on the socket's own heal thread (`SevenTvHealer`), never on the
   reader: a slow REST answer (each call ends at its whole-request deadline,
   `api_timeout`) delays only further heals, while the reader goes on
   reading heartbeats and applying every account's dispatches. An account is
   healed once the server has acked its subscriptions (sent is not enough: a
   change made before the server reads the subscribe is dispatched to nobody),
   so what changes after the fetch arrives as a dispatch. One thread at a
   time works on an account (`Followed.busy`): a dispatch for an account
   being healed is applied by the healer right after the heal, in the order
   it arrived.

Liveness: the server sends op 2 every `heartbeat_interval`; when a read finds
nothing and nothing arrived for three intervals, the connection is dead.
Ending and close codes (docs/platforms.rst, "The EventAPI protocol"):

    op 4 Reconnect, 4012 (lifetime), 4000, 4006, 4008   reconnect at once (jitter)
    4007 maintenance                                    wait >= `maintenance_wait_secs` (5 min)
    4005 rate limited                                   wait >= `rate_limited_wait_secs`
    4001-4004, 4009-4011 (a bug here)                   logged as errors; wait `client_bug_wait_secs`
    anything else, or no close frame                    the usual backoff

op 7 EndOfStream carries the same codes. Durable when a socket has stopped:
every event it took went through the sink (persist_event); a state not yet
saved is recomputed from the stored one by the next heal (same external ids).
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import GapKey
from lumio_ingestd.sources.base import Source, SourceClosed
from lumio_ingestd.sources.interfaces import FrameSink, SetStateStore
from lumio_ingestd.sources.seventv.api import SevenTvApi
from lumio_ingestd.sources.seventv.follow import Followed, Follower, Sink, Subscription
from lumio_ingestd.sources.seventv.protocol import (
    EMOTE_SET_UPDATE,
    PLATFORM,
    USER_UPDATE,
    Ack,
    BadFrame,
    Dispatch,
    EndOfStream,
    ErrorFrame,
    Frame,
    Heartbeat,
    Hello,
    Reconnect,
    decode,
    resume,
    set_update,
    subscribe,
    unsubscribe,
    user_update,
)
from lumio_ingestd.sources.ws import Binary, WsClosed, WsConnection
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.sources.seventv.source")

RECONNECT_AT_ONCE = frozenset({4000, 4006, 4008, 4012})
CLIENT_BUGS = frozenset({4001, 4002, 4003, 4004, 4009, 4010, 4011})
MAINTENANCE = 4007
RATE_LIMITED = 4005
CLOSE_MEANINGS = {
    4000: "server error", 4001: "unknown operation", 4002: "invalid payload",
    4003: "authorization failure", 4004: "already identified", 4005: "rate limited",
    4006: "server restart", 4007: "maintenance", 4008: "timeout", 4009: "already subscribed",
    4010: "not subscribed", 4011: "insufficient privilege", 4012: "reconnect (connection lifetime)",
}
MISSED_HEARTBEATS = 3


class SevenTvSocket(Source):
    platform = PLATFORM
    max_turn_secs = 60.0
    gap_source = "eventapi"
    gap_mode = "healed"  # the REST diff after every (re)subscribe brings what was missed

    def __init__(self, name: str, url: str, group: Sequence[Followed], *, api: SevenTvApi,
                 store: SetStateStore, sink: Sink, metrics: Metrics,
                 give_back: Callable[[list[Followed]], None],
                 connect_timeout_secs: float = 10.0, read_poll_secs: float = 0.25,
                 resume: bool = True, resume_ack_secs: float = 2.0,
                 heal_budget_secs: float = 2.0,
                 heal_retry_min_secs: float = 2.0, heal_retry_max_secs: float = 60.0,
                 missing_retry_secs: float = 1800.0, reconnect_jitter_secs: float = 1.0,
                 maintenance_wait_secs: float = 300.0, rate_limited_wait_secs: float = 60.0,
                 client_bug_wait_secs: float = 600.0, healer_stop_secs: float = 3.0,
                 frames: FrameSink | None = None) -> None:
        super().__init__(name, metrics, frames=frames)
        self.healer_stop_secs = healer_stop_secs
        self.url = url
        self.group: list[Followed] = list(group)
        self.api = api
        self.follower = Follower(name, api, store, sink, metrics, heal_retry_min_secs=heal_retry_min_secs,
                                 heal_retry_max_secs=heal_retry_max_secs,
                                 missing_retry_secs=missing_retry_secs)
        self._give_back = give_back
        self.connect_timeout_secs = connect_timeout_secs
        self.read_poll_secs = read_poll_secs
        self.resume = resume
        self.resume_ack_secs = resume_ack_secs
        self.heal_budget_secs = heal_budget_secs
        self.reconnect_jitter_secs = reconnect_jitter_secs
        self.maintenance_wait_secs = maintenance_wait_secs
        self.rate_limited_wait_secs = rate_limited_wait_secs
        self.client_bug_wait_secs = client_bug_wait_secs
        self._ws: WsConnection | None = None
        self._ws_lock = threading.Lock()
        #: Subscribes sent on this connection that the server has not acked yet, in the order sent.
        self._unacked: collections.deque[Subscription] = collections.deque()
        #: What the server has acked: only these carry dispatches for sure, so only an account
        #: whose subscriptions are all here is healed (a change after its fetch is dispatched).
        self.acked_subs: set[Subscription] = set()
        #: What the server held when the last connection ended (what a successful Resume restores).
        self._last_subs: set[Subscription] = set()
        self.hello: Hello | None = None
        self.previous_session: str | None = None
        #: Every Hello read and every Resume Ack (tests and logs).
        self.hellos: list[Hello] = []
        self.resume_acks: list[dict[str, Any]] = []
        self._group_lock = threading.Lock()
        self.heal_thread = SevenTvHealer(self)

    # -- the heal thread --------------------------------------------------------------------

    def start(self) -> None:
        super().start()
        if not self.heal_thread.alive:
            self.heal_thread.start()

    def healthy(self, now: float | None = None) -> bool:
        return super().healthy(now) and (not self.heal_thread.alive or self.heal_thread.healthy(now))

    def final(self) -> None:
        self.heal_thread.request_stop()  # its REST call in flight is cut by close() below
        try:
            super().final()
        finally:
            if not self.heal_thread.join(self.healer_stop_secs):
                log.warning("%s: heal thread did not stop within %.1fs", self.name, self.healer_stop_secs)

    def heal_due_accounts(self) -> None:
        """On the heal thread: heal the accounts that are due and subscribed, one after the other."""
        started = time.monotonic()
        for f in self._accounts():
            if self.stopping or self.heal_thread.stopping or not self.connected:
                return
            if time.monotonic() - started >= self.heal_budget_secs:
                return  # the next turn goes on (and sees a stop in between)
            if f.heal_due and time.monotonic() >= f.heal_at and self._held(f):
                self._exclusive(f, functools.partial(self.follower.heal, f), defer=False)

    def _held(self, f: Followed) -> bool:
        """The server has acked every subscription the account needs (one found only by this
        heal has none yet)."""
        subs = self.acked_subs
        return all(sub in subs for sub in f.subscriptions())

    def _exclusive(self, f: Followed, work: Callable[[], object], *, defer: bool = True) -> None:
        """Run `work` for `f` on this thread unless another thread works on `f`: then leave it to
        that thread (`defer`: it runs it next) or skip it (a heal: due again next turn)."""
        with f.guard:
            if f.busy:
                if defer:
                    f.deferred.append(work)
                return
            f.busy = True
        try:
            self._guarded(f, work)
        finally:
            while True:
                with f.guard:
                    if not f.deferred:
                        f.busy = False
                        break
                    todo, f.deferred = f.deferred, []
                for item in todo:
                    self._guarded(f, item)

    # -- Source ---------------------------------------------------------------------------

    def connect(self) -> None:
        ws = WsConnection(self.url, connect_timeout=self.connect_timeout_secs)
        with self._ws_lock:
            if self.stopping:
                raise SourceClosed("stopping")
            self._ws = ws
        try:
            ws.open()
            hello = self._read_hello(ws)
            self.hello = hello
            self.hellos.append(hello)
            self._fit(hello.subscription_limit)
            self.acked_subs, self._unacked = set(), collections.deque()
            if self.resume and self.previous_session is not None:
                self._resume(ws, self.previous_session)
            self.previous_session = hello.session_id
            self._sync(ws)
        except WsClosed as exc:
            self._ended_by(exc.code, exc.reason)
            self._drop()
            raise SourceClosed(str(exc)) from None
        except Exception:  # clean up, then let it propagate
            self._drop()
            raise
        for f in self._accounts():
            f.heal_asked += 1
            f.heal_due, f.heal_at = True, 0.0
        log.info("%s: session %s, heartbeat %d ms, subscription limit %s, %d account(s), "
                 "%d subscription(s)", self.name, hello.session_id, hello.heartbeat_interval_ms,
                 hello.subscription_limit if hello.subscription_limit is not None else "none",
                 len(self.group), len(self.server_subs))
        if not self._unacked:
            self.mark_healthy()  # welcomed, nothing to subscribe: there is no ack to wait for

    def _read_hello(self, ws: WsConnection) -> Hello:
        deadline = time.monotonic() + self.connect_timeout_secs
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SourceClosed("no Hello within the connect timeout")
            data = ws.recv(left)
            if data is None:
                if ws.woken:
                    raise SourceClosed("stopping")
                continue
            frame = self._decode(data)
            if isinstance(frame, Hello):
                return frame
            if frame is not None:
                log.info("%s: %s before the Hello ignored", self.name, type(frame).__name__)

    def _resume(self, ws: WsConnection, session_id: str) -> None:
        ws.send_text(resume(session_id))
        deadline = time.monotonic() + self.resume_ack_secs
        while (left := deadline - time.monotonic()) > 0:
            data = ws.recv(left)
            if data is None:
                break
            frame = self._decode(data)
            if isinstance(frame, Ack) and frame.command.upper() == "RESUME":
                self.resume_acks.append(dict(frame.data))
                if frame.data.get("success") is True:
                    restored = frame.data.get("subscriptions_restored")
                    log.info("%s: resumed session %s (%s subscriptions restored)", self.name,
                             session_id, restored)
                    self.acked_subs = set(self._last_subs)
                else:
                    log.info("%s: Resume refused (%s); subscribing again", self.name,
                             json.dumps(dict(frame.data))[:200])
                return
            if frame is not None:
                self._handle(frame, data)
        log.info("%s: no answer to Resume within %.1fs; subscribing again", self.name,
                 self.resume_ack_secs)

    def read_once(self) -> None:
        ws = self._ws
        if ws is None:
            raise SourceClosed("not connected")
        try:
            data = ws.recv(self.read_poll_secs)
        except WsClosed as exc:
            self._ended_by(exc.code, exc.reason)
            raise SourceClosed(str(exc)) from None
        if data is None:
            self._check_alive(ws)
            return
        frame = self._decode(data)
        if frame is not None:
            self._handle(frame, data)

    def _check_alive(self, ws: WsConnection) -> None:
        hello = self.hello
        if hello is None:
            return
        limit = MISSED_HEARTBEATS * hello.heartbeat_interval_ms / 1000
        silent = time.monotonic() - ws.last_frame
        if silent > limit:
            self.metrics.source_closes.labels(PLATFORM, "heartbeat").inc()
            raise SourceClosed(f"no heartbeat for {silent:.1f}s ({MISSED_HEARTBEATS} intervals of "
                               f"{hello.heartbeat_interval_ms} ms): connection presumed dead")

    def close(self) -> None:
        thread = self._thread
        own = thread is None or not thread.is_alive() or threading.current_thread() is thread
        if own:
            self._drop()
        else:
            with self._ws_lock:
                ws = self._ws
            if ws is not None:
                ws.abort()
        if self.stopping:
            self.api.cancel.cancel()  # a heal's request in flight must not hold up the stop

    def _drop(self) -> None:
        with self._ws_lock:
            ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()
        if self.acked_subs:
            self._last_subs = set(self.acked_subs)
        self.acked_subs, self._unacked = set(), collections.deque()

    def idle(self) -> None:
        if not self.connected or self.stopping:
            return
        # Subscribe what the heals found or a switch named; the healer heals an account only
        # once its subscriptions are held, so it is followed from before its fetch.
        self._sync_or_abort()

    def _sync_or_abort(self) -> None:
        ws = self._ws
        if ws is not None:
            try:
                self._sync(ws)
            except WsClosed as exc:
                log.warning("%s: subscribing failed (%s)", self.name, exc)
                ws.abort()

    def interrupt(self) -> None:
        with self._ws_lock:
            ws = self._ws
        if ws is not None:
            ws.wake()
        self.api.cancel.cancel()  # a heal's request in flight must not hold up the stop

    def drain(self) -> None:
        with self._ws_lock:
            ws = self._ws
        self.drain_connection(ws, self._handle_raw)

    def _handle_raw(self, data: bytes) -> None:
        frame = self._decode(data)
        if frame is not None:
            self._handle(frame, data)

    # -- the group ---------------------------------------------------------------------------

    def gap_keys(self) -> list[GapKey]:
        return [GapKey(f.account_id, PLATFORM, self.gap_source, self.gap_mode)
                for f in self._accounts()]

    def _accounts(self) -> list[Followed]:
        with self._group_lock:
            return list(self.group)

    def _fit(self, limit: int | None) -> None:
        """Keep the accounts whose subscriptions fit under `limit`; give the others back."""
        if limit is None:
            return
        kept: list[Followed] = []
        used = 0
        with self._group_lock:
            for f in self.group:
                if not kept or used + f.cost <= limit:
                    kept.append(f)
                    used += f.cost
            kept_ids = {id(f) for f in kept}
            extra = [f for f in self.group if id(f) not in kept_ids]
            self.group = kept
        if extra:
            log.info("%s: subscription limit %d: keeping %d account(s), handing %d to another socket",
                     self.name, limit, len(kept), len(extra))
            self._give_back(extra)

    def desired(self) -> set[Subscription]:
        subs: set[Subscription] = set()
        limit = self.hello.subscription_limit if self.hello is not None else None
        for f in self._accounts():
            for sub in f.subscriptions():
                if limit is not None and len(subs) >= limit and sub not in subs:
                    break
                subs.add(sub)
        return subs

    def _sync(self, ws: WsConnection) -> None:
        want = self.desired()
        held = self.server_subs
        for sub in sorted(held - want):
            ws.send_text(unsubscribe(*sub))
            self.acked_subs.discard(sub)
            if sub in self._unacked:
                self._unacked.remove(sub)  # its Ack may still come: _acked() then ignores it
        for sub in sorted(want - held):
            ws.send_text(subscribe(*sub))
            self._unacked.append(sub)
            self.metrics.source_subscriptions.labels(PLATFORM, "ok").inc()

    # -- frames ------------------------------------------------------------------------------

    def _decode(self, data: bytes) -> Frame | None:
        try:
            return decode(data, binary=isinstance(data, Binary))
        except BadFrame as bad:
            self.metrics.source_bad_frames.labels(PLATFORM, bad.reason).inc()
            self.quarantine_frame(bad.reason, data, bad.detail)
            log.warning("%s: frame refused (%s): %s", self.name, bad.reason, bad.detail)
            return None

    def _handle(self, frame: Frame, raw: bytes = b"") -> None:
        """`raw`: the frame's bytes, kept in the frame quarantine when a dispatch is refused."""
        if isinstance(frame, Heartbeat):
            self.metrics.source_frames.labels(PLATFORM, "heartbeat").inc()
        elif isinstance(frame, Dispatch):
            self.metrics.source_frames.labels(PLATFORM, "dispatch").inc()
            self._dispatch(frame, raw)
        elif isinstance(frame, Reconnect):
            self.metrics.source_frames.labels(PLATFORM, "reconnect").inc()
            self.metrics.source_closes.labels(PLATFORM, "op4").inc()
            log.info("%s: the server asks to reconnect (%s)", self.name, frame.reason or "op 4")
            self.force_backoff(self._rng.uniform(0.0, self.reconnect_jitter_secs))
            raise SourceClosed("op 4 Reconnect")
        elif isinstance(frame, EndOfStream):
            self.metrics.source_frames.labels(PLATFORM, "end_of_stream").inc()
            self._ended_by(frame.code, frame.message)
            raise SourceClosed(f"end of stream ({frame.code}: {frame.message})")
        elif isinstance(frame, ErrorFrame):
            self.metrics.source_frames.labels(PLATFORM, "error").inc()
            log.warning("%s: the server reports an error: %s", self.name, frame.message)
        elif isinstance(frame, Ack):
            self.metrics.source_frames.labels(PLATFORM, "ack").inc()
            command = frame.command.upper()
            if command == "RESUME":
                self.resume_acks.append(dict(frame.data))
            elif command == "SUBSCRIBE" and self._unacked:
                self._acked(frame.data)
                if not self._unacked:
                    # Welcomed and subscribed: the next drop starts the backoff over.
                    self.mark_healthy()
        elif isinstance(frame, Hello):
            self.metrics.source_frames.labels(PLATFORM, "hello").inc()
            log.info("%s: a second Hello on one connection ignored", self.name)

    @property
    def server_subs(self) -> set[Subscription]:
        """What the server holds for this connection, or will once it has read our subscribes.
        (Read from the source's thread too: `deque.copy` is one step, iterating it is not.)"""
        return self.acked_subs | set(self._unacked.copy())

    def _acked(self, data: Mapping[str, Any]) -> None:
        """A SUBSCRIBE Ack: the subscription it names (none still pending: one unsubscribed
        since, ignored), or else (an Ack without type and condition) the oldest one sent, since
        the server answers a connection's frames in order."""
        cond = data.get("condition")
        named = (data.get("type"), cond.get("object_id") if isinstance(cond, Mapping) else None)
        if named == (None, None):
            sub: Subscription | None = self._unacked[0]
        else:
            sub = next((s for s in self._unacked if s == named), None)
        if sub is None:
            return
        self._unacked.remove(sub)
        self.acked_subs.add(sub)

    def _dispatch(self, d: Dispatch, raw: bytes) -> None:
        try:
            if d.type == EMOTE_SET_UPDATE:
                update = set_update(d)
                if update.skipped:
                    log.warning("%s: emote_set.update %s: %s", self.name, update.set_id,
                                "; ".join(update.skipped))
                mine = [f for f in self._accounts() if f.set_id == update.set_id]
                if not mine:
                    self.metrics.seventv_dispatches.labels("not_followed").inc()
                for f in mine:
                    self._exclusive(f, functools.partial(self.follower.on_set_update, f, update, d.t))
            elif d.type == USER_UPDATE:
                uu = user_update(d)
                mine = [f for f in self._accounts() if f.user_id == uu.user_id]
                if not mine:
                    self.metrics.seventv_dispatches.labels("not_followed").inc()
                for f in mine:
                    self._exclusive(f, functools.partial(self.follower.on_user_update, f, uu))
            else:
                self.metrics.source_bad_frames.labels(PLATFORM, "unsupported").inc()
                log.info("%s: dispatch of type %r not followed; skipped", self.name, d.type)
        except BadFrame as bad:
            self.metrics.source_bad_frames.labels(PLATFORM, bad.reason).inc()
            if raw:
                self.quarantine_frame(bad.reason, raw, bad.detail)
            log.warning("%s: dispatch refused (%s): %s", self.name, bad.reason, bad.detail)

    def _guarded(self, f: Followed, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception:  # one account's trouble must not end the socket of the others
            log.exception("%s: account %d: handling a dispatch failed; healing it later",
                          self.name, f.account_id)
            f.heal_due = True

    def _ended_by(self, code: int | None, reason: str) -> None:
        label = str(code) if code in CLOSE_MEANINGS or code in (1000, 1001, 1006, 1011) else (
            "none" if code is None else "other")
        self.metrics.source_closes.labels(PLATFORM, label).inc()
        if code is None:
            return
        meaning = CLOSE_MEANINGS.get(code, "")
        if code in RECONNECT_AT_ONCE:
            self.force_backoff(self._rng.uniform(0.0, self.reconnect_jitter_secs))
            log.info("%s: closed with %d (%s); reconnecting at once", self.name, code, meaning)
        elif code == MAINTENANCE:
            wait = self.maintenance_wait_secs + self._rng.uniform(
                0.0, max(self.reconnect_jitter_secs, self.maintenance_wait_secs / 10))
            self.force_backoff(wait)
            log.warning("%s: closed with 4007 (maintenance); reconnecting in %.0fs", self.name, wait)
        elif code == RATE_LIMITED:
            wait = self.rate_limited_wait_secs + self._rng.uniform(0.0, self.reconnect_jitter_secs)
            self.force_backoff(wait)
            log.warning("%s: closed with 4005 (rate limited); reconnecting in %.0fs", self.name, wait)
        elif code in CLIENT_BUGS:
            self.force_backoff(self.client_bug_wait_secs)
            log.error("%s: closed with %d (%s: %s): the server says this client is wrong, a bug "
                      "to fix; reconnecting in %.0fs", self.name, code, meaning, reason[:200],
                      self.client_bug_wait_secs)


class SevenTvHealer(Worker):
    """A socket's heal thread: REST fetches and diffs, off the socket's reader (module doc, step 4)."""

    platform = PLATFORM

    def __init__(self, sock: SevenTvSocket) -> None:
        super().__init__(f"{sock.name}-heal", sock.metrics, role="source-seventv-heal")
        self.sock = sock

    def run_once(self) -> float:
        self.sock.heal_due_accounts()
        return self.sock.read_poll_secs

    def wake(self) -> None:
        self.sock.api.cancel.cancel()  # a stop must not wait for a REST answer


class SevenTvSource(Worker):
    """Hands the accounts out to sockets and supervises them (one cheap turn every `turn_secs`)."""

    platform = PLATFORM

    def __init__(self, url: str, api_url: str, accounts: Sequence[Followed], *, store: SetStateStore,
                 sink: Sink, metrics: Metrics, name: str = "source-seventv",
                 api_timeout_secs: float = 5.0, turn_secs: float = 0.2, stop_secs: float = 4.0,
                 frames: FrameSink | None = None, **socket_opts: Any) -> None:
        super().__init__(name, metrics, role="source-seventv")
        self.url = url
        self.api_url = api_url
        self.store = store
        self.sink = sink
        self.api_timeout_secs = api_timeout_secs
        self.turn_secs = turn_secs
        self.stop_secs = stop_secs
        self.socket_opts = socket_opts
        self.sockets: list[SevenTvSocket] = []
        self._waiting: list[Followed] = list(accounts)
        self._lock = threading.Lock()
        self._made = 0
        #: Tuning for the sockets made from now on (tests shorten the reconnect waits).
        self.reconnect_min_secs = 1.0
        self.reconnect_max_secs = 60.0
        #: Where the sockets keep refused frames.
        self.frame_quarantine = frames

    def give_back(self, accounts: list[Followed]) -> None:
        with self._lock:
            self._waiting.extend(accounts)

    def run_once(self) -> float:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        if waiting and not self.stopping:
            self._made += 1
            sock = SevenTvSocket(f"{self.name}-{self._made}", self.url, waiting,
                                 api=SevenTvApi(self.api_url, timeout_secs=self.api_timeout_secs,
                                                metrics=self.metrics),
                                 store=self.store, sink=self.sink, metrics=self.metrics,
                                 give_back=self.give_back, frames=self.frame_quarantine, **self.socket_opts)
            sock.reconnect_min_secs = self.reconnect_min_secs
            sock.reconnect_max_secs = self.reconnect_max_secs
            self.sockets.append(sock)
            sock.start()
        for sock in self.sockets:
            if not sock.alive and not self.stopping:
                log.error("%s: socket thread %s died; restarting it", self.name, sock.name)
                self.metrics.worker_restarts.labels(sock.role).inc()
                sock.start()
        self.metrics.seventv_sockets.set(sum(1 for s in self.sockets if s.connected))
        self.metrics.seventv_subscriptions.set(sum(len(s.server_subs) for s in self.sockets))
        return self.turn_secs

    def child_sources(self) -> list[SevenTvSocket]:
        """The sockets, for the status snapshot (runtime/localstate.py): each has its own state."""
        return list(self.sockets)

    def healthy(self, now: float | None = None) -> bool:
        """The watchdog sees this worker only: it is healthy when its sockets are too."""
        return super().healthy(now) and all(s.healthy(now) for s in self.sockets if s.alive)

    def final(self) -> None:
        for sock in self.sockets:
            sock.request_stop()
        deadline = time.monotonic() + self.stop_secs
        for sock in self.sockets:
            if not sock.join(deadline - time.monotonic()):
                log.warning("%s: socket %s did not stop within %.1fs", self.name, sock.name,
                            self.stop_secs)
        self.metrics.seventv_sockets.set(0)
        self.metrics.seventv_subscriptions.set(0)

    @property
    def accounts(self) -> list[Followed]:
        out = [f for s in self.sockets for f in s._accounts()]
        with self._lock:
            return out + list(self._waiting)
