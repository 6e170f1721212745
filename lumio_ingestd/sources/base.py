"""The Source base: one thread per platform socket.

A source connects, reads with a timeout, parses, and hands what it read over
(chat to a persistence queue, events to `persist_event`, records to their
store). When the connection fails it reconnects with jittered exponential
backoff, waiting on the stop event so a stop request ends the wait at once.
Only attempts that fail before the session was healthy grow the backoff: a
subclass calls `mark_healthy()` once its session is really up (Twitch: welcomed
and subscribed), and the next loss then waits the minimum again, since no
platform redelivers what arrives while the source waits. A subclass that never
calls it gets the reset after `stable_after_secs` of connection instead.
A graceful stop (an account handed over, SIGTERM, a reload) does not destroy
the socket: `wake()` calls `interrupt()`, which only makes a waiting read
return (sources/ws.py: a self-pipe the reader's poll watches). The loop sees
the stop and ends; on the way out `final()` calls `drain()` (read and hand
over what the socket already received, bounded by a time and frame budget,
see `WsConnection.drain`), then `close()`, then `release()`, which pushes
whatever the source still holds in memory to durable storage. `close()` is
the hard path, safe from any thread: dead connections, and a source without
a drain of its own (its `interrupt()` is `close()`).

What every socket source shares lives here once: `SourceClosed` and
`PeerClosed` (the connection ended, with the peer's close code), `BadFrame`
(a frame refused, with a metric label), `MAX_FRAMES_PER_TURN`, the reconnect
backoff (with `force_backoff` for a wait the platform or a rule imposes),
the refused-frame sink, given at construction, and `refuse_foreign()`: a
well-formed frame that is not this source's to store (another channel's, a
type never subscribed) is counted and said, never stored under the account.

Every source keeps a `SourceState`: its connection state (connecting,
connected, backoff, stopped), when it last connected, its last error and how
often it connected, failed and lost the connection, and the subscriptions the
platform refused or says another connection holds. The source's thread writes
it; the daemon's status snapshot (`runtime/localstate.py`) reads it from the main
thread, so it is guarded by a lock. The `source_state{platform,state}` gauge
counts the sources in each state.

Every source also tells the gaps ledger (`gaps`, a `GapLedger` the runtime
attaches) when its paths (`gap_keys()`) are up: once the session is healthy
(`mark_healthy()`, or at connect for a source with `up_on_connect`), down
when an up session is lost, and `stopped` with the stop time on the way out,
so a restart's gap is exact. This is the one place it happens, for every
platform; a source only says which paths it carries and how their gaps end.

Durable when a source has stopped gracefully: everything it accepted from
its socket, which for a source with a `drain()` is everything the platform
sent before it saw our close frame (in our buffer, in the kernel's receive
queue or on the wire; within the drain's budget), was handed to a durable
tier (Redis, the database, or the spool) by `release()`; what the platform
sends after that is not ours. After a hard close (`close()` from another
thread, a lost connection) what was unread in the socket is lost.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from lumio_ingestd.logs import Throttled
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import GapKey, GapMode
from lumio_ingestd.sources.interfaces import FrameSink, GapLedger, Healer
from lumio_ingestd.sources.ws import WsClosed, WsConnection
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.sources.base")


def now_ms() -> int:
    return int(time.time() * 1000)


class SourceClosed(Exception):
    """The connection ended (closed by the peer, by a protocol rule, or by `wake()`)."""


class PeerClosed(SourceClosed):
    """The platform closed the connection; `code` is its close code (None without a close frame).
    Without `message` the text says who closed it and why."""

    def __init__(self, code: int | None, reason: str, *, peer: str = "", message: str = "") -> None:
        super().__init__(message or (f"closed by {peer} with code {code}: {reason}" if code is not None
                                     else f"connection lost: {reason}"))
        self.code = code


class BadFrame(ValueError):
    """A frame refused: `reason` is a short metric label (`source_bad_frames{reason}`), `detail`
    says what is wrong, for the log. The message is `detail`, or `message` when given."""

    def __init__(self, reason: str, detail: str, *, message: str = "") -> None:
        super().__init__(message or detail)
        self.reason = reason
        self.detail = detail


#: Frames one read turn handles at most before the loop's own timers run (keepalives, queue age).
MAX_FRAMES_PER_TURN = 256


#: The states a source is in; `source_state{platform,state}` has one series per state.
SOURCE_STATES = ("connecting", "connected", "backoff", "stopped")
#: Longest error text kept (an exception may carry a whole response body).
_MAX_ERROR_CHARS = 300


class SourceState:
    """One source's connection state, readable from any thread.

    Times are wall-clock Unix seconds (they are shown to operators and written
    to the status snapshot; nothing schedules by them).
    """

    def __init__(self, platform: str, metrics: Metrics, *, clock: Callable[[], float] = time.time) -> None:
        self._platform = platform
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._state = "connecting"
        self._since = clock()
        self._last_connect: float | None = None
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._connects = 0
        self._failures = 0
        self._disconnects = 0
        self._subscribe_refusals = 0
        #: Channels (topics, ...) the platform refused to subscribe on this connection, and why.
        self._unsubscribed: dict[str, str] = {}
        #: Subscriptions the platform says another connection holds (JSON-ready records).
        self._held_elsewhere: list[dict[str, Any]] = []
        metrics.source_state.labels(platform, self._state).inc()

    def _move(self, state: str) -> None:
        """Caller holds the lock."""
        if state == self._state:
            return
        self._metrics.source_state.labels(self._platform, self._state).dec()
        self._metrics.source_state.labels(self._platform, state).inc()
        self._state = state
        self._since = self._clock()

    def connecting(self) -> None:
        with self._lock:
            self._move("connecting")

    def connected(self) -> None:
        with self._lock:
            self._move("connected")
            self._connects += 1
            self._last_connect = self._since

    def failed(self, error: str) -> None:
        """A connection attempt failed; the source waits before the next."""
        with self._lock:
            self._move("backoff")
            self._failures += 1
            self._error(error)

    def lost(self, error: str) -> None:
        """An established connection ended; the source waits before reconnecting."""
        with self._lock:
            self._move("backoff")
            self._disconnects += 1
            self._error(error)

    def stopped(self) -> None:
        with self._lock:
            self._move("stopped")

    def subscribe_refused(self, channel: str, error: str) -> None:
        """The platform refused a subscription on the current connection (it is retried)."""
        with self._lock:
            self._subscribe_refusals += 1
            self._unsubscribed[channel[:120]] = " ".join(error.split())[:_MAX_ERROR_CHARS]
            self._error(f"subscription to {channel[:120]} refused: {error}")

    def subscribed(self, channel: str | None = None) -> None:
        """`channel` is subscribed now; None: a new connection, nothing refused on it yet."""
        with self._lock:
            if channel is None:
                self._unsubscribed.clear()
            else:
                self._unsubscribed.pop(channel[:120], None)

    def held_elsewhere(self, held: list[dict[str, Any]]) -> None:
        """What the last subscribe pass found held by another connection (replaces the last
        list; empty: nothing). Each record is JSON-ready: what, by whom, why."""
        with self._lock:
            self._held_elsewhere = [dict(h) for h in held]

    def _error(self, error: str) -> None:
        self._last_error = " ".join(error.split())[:_MAX_ERROR_CHARS]
        self._last_error_at = self._clock()

    def discard(self) -> None:
        """The source was built but will never run (a reload's spare copy): uncount it."""
        with self._lock:
            self._metrics.source_state.labels(self._platform, self._state).dec()

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    def snapshot(self) -> dict[str, Any]:
        """The record as JSON-ready values (see `runtime/localstate.py` for the file it goes to)."""
        with self._lock:
            return {
                "platform": self._platform, "state": self._state, "since": self._since,
                "last_connect": self._last_connect, "last_error": self._last_error,
                "last_error_at": self._last_error_at, "connects": self._connects,
                # Every connection after the first one is a reconnect.
                "reconnects": max(0, self._connects - 1),
                "connect_failures": self._failures, "disconnects": self._disconnects,
                "subscribe_refusals": self._subscribe_refusals,
                "unsubscribed": dict(self._unsubscribed),
                "held_elsewhere": [dict(h) for h in self._held_elsewhere],
            }


class Source(Worker):
    """Subclasses implement `connect()`, `read_once()` and `close()`, and may override `release()`."""

    platform: str = "unknown"
    #: Jittered exponential backoff between connection attempts.
    reconnect_min_secs: float = 1.0
    reconnect_max_secs: float = 60.0
    #: A connection that lasted this long resets the backoff (for subclasses
    #: that do not call `mark_healthy()`).
    stable_after_secs: float = 30.0
    #: A graceful stop's `drain()` reads for at most this long (inside the sources' stop bound).
    drain_secs: float = 1.0
    #: The path name in the gaps ledger (`source_gaps.source`); empty: no ledger.
    gap_source: str = ""
    #: How this path's gaps end (model.GapMode).
    gap_mode: GapMode = "not_healable"
    #: A source that never calls `mark_healthy()` is up as soon as it connected.
    up_on_connect: bool = False

    def __init__(self, name: str, metrics: Metrics, *, frames: FrameSink | None = None) -> None:
        super().__init__(name, metrics, role=f"source-{self.platform}")
        self.connected = False
        self._attempts = 0
        self._connected_at = 0.0
        self._healthy = False
        self._rng = random.Random()
        self.source_state = SourceState(self.platform, metrics)
        #: Where refused frames go with their raw bytes (docs/operating.rst, "Refused frames").
        self.frame_quarantine = frames
        self._forced_backoff: float | None = None
        self._refusals: dict[str, Throttled] = {}
        #: The gaps ledger (attached by the runtime) and the healer of this source's gaps.
        self.gaps: GapLedger | None = None
        self.healer: Healer | None = None
        self._up_keys: list[GapKey] = []

    # -- for subclasses ----------------------------------------------------------

    def connect(self) -> None:
        """Open the connection (bounded by a timeout); raise on failure."""
        raise NotImplementedError

    def read_once(self) -> None:
        """Read and handle what arrives within one read timeout; raise SourceClosed when it ends."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection; safe to call from another thread and more than once."""
        raise NotImplementedError

    def release(self) -> None:
        """Hand what is held in memory to durable storage (called before stopping)."""

    def interrupt(self) -> None:
        """From any thread, for a graceful stop: make a waiting read return soon, leaving the
        socket whole for `drain()`. The default is the hard `close()`."""
        self.close()

    def drain(self) -> None:
        """On the source's thread after a graceful stop, before `close()` and `release()`:
        read and hand over what the socket already received (bounded; never blocks long)."""

    def drain_connection(self, conn: WsConnection | None, handle: Callable[[bytes], None]) -> int:
        """For `drain()`: what `conn` still holds (`WsConnection.drain`, within `drain_secs`),
        each message through `handle`; returns how many. A reply that cannot go out any more
        (a pong, an answer) loses nothing: it is logged at debug level."""
        if conn is None:
            return 0
        n = 0
        for data in conn.drain(self.drain_secs):
            n += 1
            try:
                handle(data)
            except (SourceClosed, WsClosed) as exc:
                log.debug("%s: while draining: %s", self.name, exc)
        if n:
            log.info("%s: %d message(s) read after the stop, before the socket closed", self.name, n)
        return n

    def quarantine_frame(self, reason: str, raw: bytes | str, detail: str = "") -> None:
        """Keep a refused frame's bytes (the caller counted it in source_bad_frames)."""
        if self.frame_quarantine is not None:
            self.frame_quarantine.add(self.platform, reason, raw, detail)

    def refuse_foreign(self, reason: str, what: str, why: str, *, logger: logging.Logger) -> None:
        """A well-formed frame that is not this source's to store: counted in
        `source_bad_frames{platform,reason}` (`foreign_channel`: it names another channel or
        room; `unsubscribed`: a type never subscribed), said as a warning at most once a minute
        per source and logger (anyone able to send them could flood the journal), and dropped:
        it is another account's data, so it is neither stored nor kept."""
        self.metrics.source_bad_frames.labels(self.platform, reason).inc()
        throttled = self._refusals.get(logger.name)
        if throttled is None:
            throttled = self._refusals[logger.name] = Throttled(logger)
        throttled.log(logging.WARNING, "%s: refused %s: %s", self.name, what, why)

    def mark_healthy(self) -> None:
        """The current session is up and doing its work (for a platform: connected and
        subscribed/ready). Resets the backoff: the next loss reconnects after the minimum."""
        if not self._healthy:
            self._healthy = True
            self._attempts = 0
            self._gap_up()

    def gap_keys(self) -> list[GapKey]:
        """The paths this source carries, one per account (default: `self.account_id`)."""
        account_id = getattr(self, "account_id", None)
        if not self.gap_source or not isinstance(account_id, int):
            return []
        return [GapKey(account_id, self.platform, self.gap_source, self.gap_mode, self.healer)]

    def _gap_up(self) -> None:
        if self.gaps is None or self._up_keys:
            return
        self._up_keys = self.gap_keys()
        if self._up_keys:
            self.gaps.up(self._up_keys, now_ms())

    def _gap_down(self) -> None:
        keys, self._up_keys = self._up_keys, []
        if self.gaps is not None and keys:
            self.gaps.down(keys, now_ms())

    def idle(self) -> None:
        """Called after every read turn (timers: keepalive checks, queue age)."""

    # -- the loop ------------------------------------------------------------------

    def run_once(self) -> float:
        if not self.connected:
            self.source_state.connecting()
            try:
                self.connect()
            except Exception as exc:  # noqa: BLE001 - any failure to connect means: back off, retry
                self._healthy = False
                self._attempts += 1
                delay = self.next_backoff()
                self.source_state.failed(f"{type(exc).__name__}: {exc}")
                self.metrics.source_connect_failures.labels(self.platform).inc()
                log.warning("%s: connect failed (%s: %s); retry %d in %.1fs", self.name,
                            type(exc).__name__, exc, self._attempts, delay)
                return delay
            self.connected = True
            self._connected_at = time.monotonic()
            self.source_state.connected()
            self.metrics.source_connects.labels(self.platform).inc()
            log.info("%s: connected", self.name)
            if self.up_on_connect:
                self._gap_up()
        try:
            self.read_once()
        except SourceClosed as exc:
            return self._lost(str(exc) or "connection closed")
        except OSError as exc:
            return self._lost(f"{type(exc).__name__}: {exc}")
        finally:
            self.idle()
        return 0.0

    def _lost(self, why: str) -> float:
        self.connected = False
        self.close()
        if not self.stopping:
            self._gap_down()  # a stop records its own time in final()
        if self.stopping:
            return 0.0
        if self._healthy or time.monotonic() - self._connected_at >= self.stable_after_secs:
            self._attempts = 0
        self._healthy = False
        self._attempts += 1
        delay = self.next_backoff()
        self.source_state.lost(why)
        self.metrics.source_disconnects.labels(self.platform).inc()
        log.warning("%s: disconnected (%s); reconnecting in %.1fs", self.name, why, delay)
        return delay

    def force_backoff(self, secs: float) -> None:
        """The next reconnect waits `secs` instead of the jittered backoff (once)."""
        self._forced_backoff = secs

    def next_backoff(self) -> float:
        """A wait set by `force_backoff`, else `jittered_backoff()`."""
        forced, self._forced_backoff = self._forced_backoff, None
        return forced if forced is not None else self.jittered_backoff()

    def jittered_backoff(self) -> float:
        """Full jitter: uniform in [min, min(max, min * 2^attempts)]."""
        ceiling = min(self.reconnect_max_secs, self.reconnect_min_secs * 2.0 ** max(0, self._attempts - 1))
        return self._rng.uniform(self.reconnect_min_secs, max(self.reconnect_min_secs, ceiling))

    def wake(self) -> None:
        self.interrupt()

    def final(self) -> None:
        self.connected = False
        self.source_state.stopped()
        try:
            self.drain()
        except Exception:  # noqa: BLE001 - what was drained so far is still released below
            log.exception("%s: draining the socket failed", self.name)
        self.close()
        self.release()
        keys, self._up_keys = self._up_keys, []
        if self.gaps is not None and keys:
            try:
                self.gaps.stopped(keys, now_ms())
            except Exception:  # noqa: BLE001 - the next start then counts from the last record
                log.exception("%s: recording the stop time failed", self.name)
