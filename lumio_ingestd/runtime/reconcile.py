"""The account-dependent part of the daemon, and how SIGHUP changes it without a restart.

Everything the platform build functions make from `cfg.accounts` (a socket
per account, the multiplexed sockets of 7TV and Jetstream, the stream-status
poller, the Kick subscriptions worker, the webhook receivers that know every
account) comes from one `AccountBuilder`. `AccountWorkers` keeps what the
running build made and, given a new configuration, plans the change:

- a worker is known by its name (unique in a process: `source-twitch-7`,
  `source-seventv`, ...);
- the accounts whose sections differ (added, removed, changed) are each built
  alone, once with the old and once with the new configuration, into a
  scratch metrics registry that nothing reads: the names those builds make are
  the workers that account touches. Per-account sockets are touched by their
  own account only; a multiplexed worker (7TV, Jetstream, the poller, Kick
  subscriptions) by every account it serves, and it is restarted as a whole
  (7TV heals from its REST snapshot, Jetstream resumes from its cursor, the
  poller writes its window in `final()`);
- workers that are gone or touched stop first (a source's `final()` hands its
  in-memory chat to Redis before the thread ends), then the new and touched
  ones start, so an account is never connected twice by this process; the
  webhook routes switch to the new receivers at the same moment. Workers no
  account change touches are left running.

Fixed sections ([twitch], [kick], ...) are not applied here: the build uses
the running fixed settings with the new accounts (changing those still needs
a restart, as the reload logs). Nothing durable lives here: what a stopping
source holds is handed over by its own `final()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.web.server import Handler, Request, Response, Routes, StreamResponse
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.reconcile")


class RecordingRoutes(Routes):
    """Routes that also remember what was added, to be served through `AccountWorkers`."""

    def __init__(self) -> None:
        super().__init__()
        self.added: list[tuple[str, str, Handler, int | None]] = []

    def add(self, method: str, pattern: str, handler: Handler, *,
            max_body_bytes: int | None = None) -> None:
        super().add(method, pattern, handler, max_body_bytes=max_body_bytes)
        self.added.append((method.upper(), pattern, handler, max_body_bytes))


@dataclass
class AccountParts:
    """What one build made from the accounts: workers by kind, and the routes they serve."""

    sources: list[Worker] = field(default_factory=list)
    timers: list[Worker] = field(default_factory=list)
    routes: RecordingRoutes = field(default_factory=RecordingRoutes)

    def named(self) -> dict[str, tuple[Worker, str]]:
        out: dict[str, tuple[Worker, str]] = {}
        for kind, workers in (("source", self.sources), ("timer", self.timers)):
            for worker in workers:
                if worker.name in out:
                    raise ValueError(f"two account workers are named {worker.name}")
                out[worker.name] = (worker, kind)
        return out


AccountBuilder = Callable[[Config, Metrics], AccountParts]


@dataclass
class Plan:
    """The change one reload makes; `stop` runs before `start`."""

    stop: list[Worker] = field(default_factory=list)
    start: list[tuple[Worker, str]] = field(default_factory=list)
    added: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    #: Account workers that kept running.
    kept: int = 0
    parts: AccountParts | None = None

    @property
    def empty(self) -> bool:
        return not (self.stop or self.start or self.added or self.removed or self.changed)


class AccountWorkers:
    """The running account build; `plan()` and `commit()` move it to a new configuration."""

    def __init__(self, builder: AccountBuilder, metrics: Metrics) -> None:
        self._builder = builder
        self._metrics = metrics
        self._lock = threading.Lock()
        self.cfg: Config | None = None
        self.parts = AccountParts()
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._routes: Routes | None = None
        self._served: set[tuple[str, str]] = set()

    def initial(self, cfg: Config) -> AccountParts:
        self.cfg = cfg
        self.parts = self._builder(cfg, self._metrics)
        self.parts.named()  # names must be unique: they are the reconcile's keys
        self._set_handlers(self.parts.routes)
        return self.parts

    def add_routes(self, routes: Routes) -> None:
        """Serve the account routes through `routes` (a delegate that follows reloads)."""
        self._routes = routes
        self._serve(self.parts.routes)

    def _serve(self, recorded: RecordingRoutes) -> None:
        if self._routes is None:
            return
        for method, pattern, _handler, max_body in recorded.added:
            if (method, pattern) not in self._served:
                self._served.add((method, pattern))
                self._routes.add(method, pattern, self._delegate(method, pattern), max_body_bytes=max_body)

    def _delegate(self, method: str, pattern: str) -> Handler:
        def handle(request: Request) -> Response | StreamResponse:
            with self._lock:
                handler = self._handlers.get((method, pattern))
            if handler is None:
                return Response.json(404, {"error": "not found"})
            return handler(request)
        return handle

    def _set_handlers(self, routes: RecordingRoutes) -> None:
        with self._lock:
            self._handlers = {(m, p): h for m, p, h, _ in routes.added}

    # -- reload ------------------------------------------------------------------

    def plan(self, new_cfg: Config) -> Plan:
        """What moving to `new_cfg` (its accounts, and with `shard = auto` the accounts
        it owns) stops and starts: built, not started."""
        assert self.cfg is not None, "initial() first"
        old_cfg = self.cfg
        old = {a.account_id: a for a in old_cfg.accounts}
        new = {a.account_id: a for a in new_cfg.accounts}
        plan = Plan(added=sorted(set(new) - set(old)), removed=sorted(set(old) - set(new)),
                    changed=sorted(i for i in set(old) & set(new)
                                   if old[i] != new[i] or old_cfg.owns(i) != new_cfg.owns(i)))
        if not (plan.added or plan.removed or plan.changed):
            return plan
        scratch = Metrics()
        touched: set[str] = set()
        for account_id in (*plan.added, *plan.removed, *plan.changed):
            for cfg, accounts in ((old_cfg, old), (new_cfg, new)):
                if account_id in accounts:
                    probe = self._builder(replace(cfg, accounts=(accounts[account_id],)), scratch)
                    touched |= set(probe.named())
                    _discard(probe)
        running_named = self.parts.named()
        built = self._builder(new_cfg, self._metrics)
        built_named = built.named()
        for name, (worker, _kind) in running_named.items():
            if name not in built_named or name in touched:
                plan.stop.append(worker)
        for name, (worker, kind) in built_named.items():
            if name not in running_named or name in touched:
                plan.start.append((worker, kind))
        plan.kept = sum(1 for name in running_named if name in built_named and name not in touched)
        # The workers kept running stay the running ones; their fresh copies are dropped.
        keep_new = {id(w) for w, _ in plan.start}
        _discard(AccountParts(sources=[w for w in built.sources if id(w) not in keep_new],
                              timers=[w for w in built.timers if id(w) not in keep_new]))
        plan.parts = built
        return plan

    def commit(self, plan: Plan, new_cfg: Config) -> None:
        """After the plan's stops and starts: the running set and the routes follow it."""
        if plan.parts is None:
            self.cfg = new_cfg
            return
        started = {id(w) for w, _ in plan.start}
        stopped = {id(w) for w in plan.stop}
        sources = [w for w in self.parts.sources if id(w) not in stopped]
        timers = [w for w in self.parts.timers if id(w) not in stopped]
        sources += [w for w, kind in plan.start if kind == "source" and id(w) in started]
        timers += [w for w, kind in plan.start if kind == "timer" and id(w) in started]
        self.parts = AccountParts(sources=sources, timers=timers, routes=plan.parts.routes)
        self.cfg = new_cfg
        self._set_handlers(plan.parts.routes)
        self._serve(plan.parts.routes)


def stop_workers(workers: list[Worker], grace_secs: float) -> list[str]:
    """Stop `workers` together; each runs its final() (hand-over). The names still running."""
    for worker in workers:
        was_alive = worker.alive
        worker.request_stop()
        if not was_alive:
            worker.start()  # a dead worker still runs final() with its stop event set
    deadline = time.monotonic() + grace_secs
    for worker in workers:
        worker.join(deadline - time.monotonic())
    return [w.name for w in workers if w.alive]


def _discard(parts: AccountParts) -> None:
    """Workers built but never started: undo what their construction counted."""
    for worker in (*parts.sources, *parts.timers):
        state = getattr(worker, "source_state", None)
        discard = getattr(state, "discard", None)
        if callable(discard):
            discard()


__all__ = ["AccountBuilder", "AccountParts", "AccountWorkers", "Plan", "RecordingRoutes",
           "stop_workers"]
