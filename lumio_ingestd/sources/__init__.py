"""Sources: the threads that bring chat and events in (platform sockets, webhooks, pollers).

Every platform lives in one package, `sources/<platform>/` (twitch, kick,
streamelements, seventv, jetstream), beside the cross-platform stream-status
poller (`streamstatus.py`) and the synthetic source (`synthetic.py`). Each has
one `build(cfg, deps) -> Built`: from the configuration, the workers and HTTP
routes it runs on this replica. `deps` carries the implementations of
`interfaces.py` the runtime made (`runtime/build.py`); nothing under sources/
imports a store, a Redis client or a database pool.

Each source is a `Worker` that, when stopped, hands what it holds in memory
to Redis (or the database, or the spool) in `final()` before its thread ends.
The shutdown gives all sources together 5 s for that. Nothing durable here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.interfaces import (
    Alerts,
    ChatQueueLike,
    FrameSink,
    GapLedger,
    HeldCopies,
    JetstreamStore,
    PersistChat,
    PersistEvent,
    SeenIds,
    SessionStore,
    SetStateStore,
    StatsSink,
)
from lumio_ingestd.web.server import Handler
from lumio_ingestd.worker import Worker

if TYPE_CHECKING:
    from lumio_ingestd.sources.kick.signature import RsaPublicKey


@dataclass(frozen=True)
class SourceDeps:
    """What every platform's `build` is given: the runtime's implementations of interfaces.py."""

    metrics: Metrics
    #: A new in-memory persistence queue for one source (named after it).
    chat_queue: Callable[[str], ChatQueueLike]
    persist_chat: PersistChat
    persist_event: PersistEvent
    alerts: Alerts | None
    sessions: SessionStore | None
    #: The handled webhook delivery ids of one platform (by its name).
    seen: Callable[[str], SeenIds]
    frames: FrameSink | None = None
    #: Durable copies of held Twitch gift bombs.
    held_gifts: HeldCopies | None = None
    set_states: SetStateStore | None = None
    jetstream: JetstreamStore | None = None
    stats: StatsSink | None = None
    #: The Kick webhook key, read once at start (a bad key file is a configuration error).
    kick_webhook_key: RsaPublicKey | None = None
    #: The gaps ledger: every socket source says when its paths are up (sources/base.py).
    gaps: GapLedger | None = None


#: (method, path pattern, handler, body limit or None for the server's).
Route = tuple[str, str, Handler, int | None]


@dataclass
class Built:
    """What one platform's `build` made for this replica."""

    sources: list[Worker] = field(default_factory=list)
    timers: list[Worker] = field(default_factory=list)
    #: Timers that must run on one replica only: with `shard = auto` the runtime gates each
    #: behind a lease named after the worker; otherwise they run as plain timers.
    leader_timers: list[Worker] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)

    def add(self, other: Built) -> None:
        self.sources += other.sources
        self.timers += other.timers
        self.leader_timers += other.leader_timers
        self.routes += other.routes


Build = Callable[[Config, SourceDeps], Built]

__all__ = ["Build", "Built", "Route", "SourceDeps"]
