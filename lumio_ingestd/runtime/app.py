"""The supervisor: `lumio-ingestd run`, the daemon's main loop.

`App` runs what `runtime/build.py` (the composition root) makes: it installs
the signal queue, builds, binds the HTTP and metrics listeners, starts every
worker, tells systemd READY=1, and then the main thread supervises. It
restarts a worker whose thread died (with backoff), re-reads the configuration
on SIGHUP, refreshes the STATUS line, and on SIGTERM or SIGINT runs the
shutdown chain (docs/architecture.rst, "Shutdown"):

1. the HTTP server stops accepting; requests in flight get 5 s; then the open
   streams are closed;
2. at the same time the sources and the timer workers are cancelled; the
   sources get 5 s, each handing what it holds in memory to Redis (or the
   database, or the spool) before it reports stopped. The event path is told
   their deadline first (`Parts.stopping`), so what they persist on the way
   out parks rather than waits for a database that does not answer;
3. the chat flush threads are cancelled last (after the sources and the HTTP
   requests) and each runs one final flush, bounded to 3 s, side by side;
4. the drain leases are released and everything is closed.

All of it inside `[daemon] shutdown_timeout_secs` (8 s); a second stop signal
cuts the waits short. What was not flushed is in Redis or the spool for the
next process. What a source still running at the end holds is counted and
logged as LOST (`_count_lost`), never dropped without a word. READY=1 does
not wait for Redis or the database: a database outage at boot must not
become a restart loop; it shows in STATUS and /readyz.

What is durable when `App.run()` returns: everything the workers' `final()`
steps handed over (see chat/, events/, stores/spool.py); nothing is held here.
"""

from __future__ import annotations

import enum
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType

from lumio_ingestd import exitcodes
from lumio_ingestd.cluster.lease import Lease
from lumio_ingestd.config import Config, ConfigError, redacted_lines
from lumio_ingestd.logs import set_level
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.build import Builder, Parts, StartupError, build
from lumio_ingestd.runtime.health import HealthProbe, Watchdog
from lumio_ingestd.runtime.localstate import LocalState
from lumio_ingestd.runtime.reconcile import Plan, stop_workers
from lumio_ingestd.runtime.sdnotify import Notifier, watchdog_interval
from lumio_ingestd.runtime.shutdown import Shutdown, ShutdownReport, Stage
from lumio_ingestd.runtime.signals import RELOAD_SIGNALS, STOP_SIGNALS, SignalQueue
from lumio_ingestd.web.metrics_server import MetricsServer
from lumio_ingestd.web.server import HttpServer, Request, Response
from lumio_ingestd.worker import Worker

log = logging.getLogger("lumio_ingestd.app")

#: The shutdown's bounds (docs/architecture.rst, "Shutdown").
HTTP_GRACE_SECS = 5.0
SOURCES_GRACE_SECS = 5.0
FINAL_FLUSH_SECS = 3.0
#: Keys SIGHUP applies at once (and every account key); every other change waits for a restart.
LIVE_KEYS = frozenset({"daemon.log_level", "daemon.accounts_dir"})

_LOOP_SECS = 0.5  # the supervisor's turn (and the longest it takes to see a signal)
_STATUS_EVERY_SECS = 2.0
_SUPERVISOR_STALE_SECS = 10.0


class Role(enum.Enum):
    SOURCE = "source"  # holds data in memory; 5 s to hand it over
    TIMER = "timer"  # cancelled with the sources, not waited for by the flush
    FLUSH = "flush"  # cancelled last
    HTTP = "http"  # the accept loop
    RUNTIME = "runtime"  # the watchdog and the health probe


# --------------------------------------------------------------------------- supervision


@dataclass
class _Supervised:
    worker: Worker
    role: Role
    started_at: float = 0.0
    restart_at: float | None = None
    backoff: float = 0.0
    #: Stopped for good by a reload; dropped once its thread has ended.
    retired: bool = False


class Supervisor:
    """Starts workers and restarts the ones whose thread died, with backoff.

    Runs on the main thread (`check()` once per loop turn). A worker that ran
    longer than `stable_secs` before it died restarts after `backoff_min`;
    one that keeps dying waits twice as long each time, up to `backoff_max`.
    """

    def __init__(self, metrics: Metrics, *, backoff_min: float = 1.0, backoff_max: float = 60.0,
                 stable_secs: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._entries: list[_Supervised] = []
        self._backoff_min = backoff_min
        self._backoff_max = backoff_max
        self._stable = stable_secs
        self._clock = clock
        self.last_check = clock()

    def add(self, worker: Worker, role: Role) -> None:
        self._entries.append(_Supervised(worker, role))

    def add_started(self, worker: Worker, role: Role) -> None:
        """Add a worker while the others run (a reload's new account worker) and start it."""
        entry = _Supervised(worker, role)
        self._entries.append(entry)
        worker.start()
        entry.started_at = self._clock()

    def retire(self, worker: Worker) -> None:
        """Forget a worker a reload stopped; one still finishing stays listed until it ends."""
        for entry in self._entries:
            if entry.worker is worker:
                entry.retired = True
        self._entries = [e for e in self._entries if not (e.retired and not e.worker.alive)]

    def workers(self, *roles: Role) -> list[Worker]:
        return [e.worker for e in self._entries if not roles or e.role in roles]

    def start_all(self) -> None:
        for entry in self._entries:
            entry.worker.start()
            entry.started_at = self._clock()

    def dead(self) -> list[str]:
        return [e.worker.name for e in self._entries if not e.worker.alive and not e.worker.stopping]

    def check(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        self.last_check = now
        if any(e.retired for e in self._entries):
            self._entries = [e for e in self._entries if not (e.retired and not e.worker.alive)]
        for entry in self._entries:
            worker = entry.worker
            if worker.alive or worker.stopping:
                continue
            if entry.restart_at is None:
                ran = now - entry.started_at
                entry.backoff = (self._backoff_min if ran >= self._stable or entry.backoff == 0
                                 else min(self._backoff_max, entry.backoff * 2))
                entry.restart_at = now + entry.backoff
                log.error("worker %s died after %.1fs; restarting it in %.1fs", worker.name, ran,
                          entry.backoff)
            elif now >= entry.restart_at:
                entry.restart_at = None
                entry.started_at = now
                self._metrics.worker_restarts.labels(worker.role).inc()
                try:
                    worker.start()
                except Exception:
                    log.exception("worker %s could not be restarted", worker.name)
                    continue
                log.warning("worker %s restarted", worker.name)


# --------------------------------------------------------------------------- the daemon


@dataclass(frozen=True)
class RunResult:
    code: int
    report: ShutdownReport | None


class App:
    def __init__(self, cfg: Config, environ: Mapping[str, str], *,
                 reload: Callable[[], Config] | None = None, builder: Builder = build,
                 metrics: Metrics | None = None,
                 gc_policy: Callable[[], None] | None = None) -> None:
        """`gc_policy` runs once, when everything is built and before any worker starts:
        `lumio-ingestd run` passes `gcpolicy.apply` (a process-wide setting, so an App
        embedded in a test process leaves that process's collector as it is)."""
        self.cfg = cfg
        self._boot_cfg = cfg
        self._environ = environ
        self._reload = reload
        self._builder = builder
        self._gc_policy = gc_policy
        self.metrics = metrics if metrics is not None else Metrics(process=True)
        self.signals = SignalQueue()
        self.notifier = Notifier(environ)
        self.supervisor = Supervisor(self.metrics)
        self.parts: Parts | None = None
        self.http: HttpServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.watchdog: Watchdog | None = None
        self.http_address: tuple[str, int] | None = None
        self.metrics_address: tuple[str, int] | None = None
        self._phase = "starting"
        self._last_status = ""
        self._status_at = 0.0
        self._previous_excepthook = threading.excepthook
        # STATE_DIR/status.json, for `lumio-ingestd status` (see runtime/localstate.py).
        self.local_state = LocalState(cfg.daemon.state_dir, cfg.daemon.instance_id,
                                      interval_secs=_STATUS_EVERY_SECS)

    # -- programmatic control (tests, embedding) ----------------------------------

    def request_stop(self) -> None:
        """The same as SIGTERM, from any thread."""
        self.signals.put(signal.SIGTERM)

    # -- the run ------------------------------------------------------------------

    def run(self) -> RunResult:
        """Start, supervise until a stop signal, shut down in order. Main thread only."""
        started = time.monotonic()
        self.signals.install()
        threading.excepthook = self._thread_died
        try:
            try:
                self._start()
            except StartupError as exc:
                log.error("cannot start: %s", exc)
                self._abort_start()
                return RunResult(exc.code, None)
            except Exception:
                # A bug: stop whatever already runs, or its threads keep the process alive.
                log.exception("cannot start: internal error")
                return RunResult(exitcodes.SOFTWARE, self._shutdown())
            ready_secs = time.monotonic() - started
            self._phase = "ingesting"
            self._last_status = self._status()
            self.notifier.ready(self._last_status)
            self.local_state.write(self._phase, self.supervisor.workers())
            log.info("ready in %.2fs; listening on http=%s metrics=%s", ready_secs,
                     _fmt(self.http_address), _fmt(self.metrics_address))
            code = exitcodes.OK
            try:
                self._supervise()
            except Exception:
                log.exception("the supervisor failed; shutting down")
                code = exitcodes.SOFTWARE
            report = self._shutdown()
            return RunResult(code, report)
        finally:
            threading.excepthook = self._previous_excepthook
            self.signals.restore()

    def _start(self) -> None:
        cfg = self.cfg
        try:
            parts = self._builder(cfg, self.metrics)
        except StartupError:
            raise
        except OSError as exc:
            raise StartupError(f"{type(exc).__name__}: {exc}") from exc
        self.parts = parts
        parts.routes.add("GET", "/healthz", self._healthz)
        parts.routes.add("GET", "/readyz", self._readyz)
        self.http = HttpServer(cfg.http.listen_host, cfg.http.listen_port, parts.routes, self.metrics,
                               trusted_proxy_header=cfg.http.trusted_proxy_header,
                               max_connections_per_client=cfg.http.max_connections_per_client)
        self.metrics_server = MetricsServer(cfg.metrics.listen_host, cfg.metrics.listen_port,
                                            self.metrics.registry)
        try:
            self.http_address = self.http.bind()
        except OSError as exc:
            raise StartupError(f"cannot listen on [http] listen {_fmt(self._requested('http'))}: "
                               f"{exc.strerror or exc}") from exc
        try:
            self.metrics_address = self.metrics_server.start()
        except OSError as exc:
            raise StartupError(f"cannot listen on [metrics] listen {_fmt(self._requested('metrics'))}: "
                               f"{exc.strerror or exc}") from exc

        sup = self.supervisor
        for worker in parts.sources:
            sup.add(worker, Role.SOURCE)
        for worker in parts.timers:
            sup.add(worker, Role.TIMER)
        for worker in parts.flushers:
            sup.add(worker, Role.FLUSH)
        sup.add(self.http, Role.HTTP)
        if parts.probe is not None:
            sup.add(HealthProbe(parts.probe, self.metrics), Role.RUNTIME)
        interval = watchdog_interval(self._environ)
        if interval is not None and self.notifier.enabled:
            self.watchdog = Watchdog(self.notifier, self.metrics, interval,
                                     lambda: self.supervisor.workers(), self._supervisor_problem)
            sup.add(self.watchdog, Role.RUNTIME)
            log.info("systemd watchdog: petting every %.2fs", interval)
        if parts.membership is not None:
            parts.membership.on_change = self.signals.wake
        if parts.claim_keeper is not None:
            parts.claim_keeper.on_change = self.signals.wake
        if self._gc_policy is not None:
            self._gc_policy()
        sup.start_all()

    def _requested(self, which: str) -> tuple[str, int]:
        if which == "http":
            return self.cfg.http.listen_host, self.cfg.http.listen_port
        return self.cfg.metrics.listen_host, self.cfg.metrics.listen_port

    def _abort_start(self) -> None:
        """Undo a half-done start: nothing was started yet but listeners and closers."""
        if self.http is not None:
            self.http.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        for name, close in (self.parts.closers if self.parts is not None else []):
            _close(name, close)

    # -- the main loop --------------------------------------------------------------

    def _supervise(self) -> None:
        while True:
            received = self.signals.wait(_LOOP_SECS)
            for signum in received:
                if signum in STOP_SIGNALS:
                    log.info("received %s; shutting down", signal.Signals(signum).name)
                    return
                if signum in RELOAD_SIGNALS:
                    self._reload_config()
            self._follow_membership()
            self._follow_claim()
            self.supervisor.check()
            now = time.monotonic()
            if now - self._status_at >= _STATUS_EVERY_SECS:
                self._status_at = now
                status = self._status()
                if status != self._last_status:
                    self._last_status = status
                    self.notifier.status(status)
                self.local_state.write(self._phase, self.supervisor.workers())

    def _supervisor_problem(self) -> str | None:
        age = time.monotonic() - self.supervisor.last_check
        if age > _SUPERVISOR_STALE_SECS:
            return f"the main thread's supervisor loop has not turned for {age:.0f}s"
        return None

    def _thread_died(self, args: threading.ExceptHookArgs) -> None:
        """An exception escaped a thread (a worker's loop boundary only catches Exception)."""
        name = args.thread.name if args.thread is not None else "?"
        if args.exc_type is SystemExit:
            log.error("thread %s exited (SystemExit)", name)
            return
        exc_info: tuple[type[BaseException], BaseException, TracebackType | None] | None = None
        if args.exc_value is not None:
            exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
        log.critical("thread %s died with an uncaught %s", name, args.exc_type.__name__,
                     exc_info=exc_info)

    # -- reload ---------------------------------------------------------------------

    def _reload_config(self) -> None:
        if self._reload is None:
            log.warning("SIGHUP: reloading is not available here; ignored")
            return
        self.notifier.reloading(time.monotonic_ns() // 1000)
        try:
            new = self._reload()
        except ConfigError as exc:
            self.metrics.config_reloads.labels("refused").inc()
            log.error("reload: the configuration has %d problem(s); keeping the running one: %s",
                      len(exc.problems), "; ".join(str(p) for p in exc.problems))
        except Exception:
            self.metrics.config_reloads.labels("refused").inc()
            log.exception("reload failed; keeping the running configuration")
        else:
            if self._reconcile(new):
                self._apply(new)
                self.metrics.config_reloads.labels("applied").inc()
            else:
                self.metrics.config_reloads.labels("refused").inc()
        self.notifier.notify("READY=1", f"STATUS={self._status()}")

    def _reconcile(self, new: Config) -> bool:
        """Move the account workers to `new.accounts`; False (nothing changed) if they cannot be built."""
        accounts = self.parts.accounts if self.parts is not None else None
        if accounts is None:
            return True
        current = accounts.cfg if accounts.cfg is not None else self._boot_cfg
        # The fixed sections stay as they were at boot (they need a restart).
        wanted = replace(self._boot_cfg, daemon=replace(self._boot_cfg.daemon,
                                                        accounts_dir=new.daemon.accounts_dir),
                         accounts=new.accounts, owned=current.owned)
        try:
            plan = accounts.plan(wanted)
        except Exception:
            log.exception("reload: the accounts could not be built; keeping the running configuration")
            return False
        membership = self.parts.membership if self.parts is not None else None
        if membership is not None:
            membership.set_accounts(a.account_id for a in new.accounts)
        if plan.empty:
            return True
        self._run_plan(plan)
        accounts.commit(plan, wanted)
        log.info("reload: accounts added %s, removed %s, changed %s; %d worker(s) stopped, %d started, "
                 "%d kept running", _ids(plan.added), _ids(plan.removed), _ids(plan.changed),
                 len(plan.stop), len(plan.start), plan.kept)
        return True

    def _follow_membership(self) -> None:
        """`shard = auto`: run the accounts the membership hands this replica (stop before start)."""
        parts = self.parts
        if parts is None or parts.membership is None or parts.accounts is None or parts.accounts.cfg is None:
            return
        membership, accounts = parts.membership, parts.accounts
        target = membership.target()
        current = accounts.cfg
        assert current is not None
        if target is None:
            return
        if target == current.owned:
            return
        wanted = replace(current, owned=target)
        try:
            plan = accounts.plan(wanted)
        except Exception:
            log.exception("membership: the accounts could not be built; trying again next turn")
            return
        before = current.owned or frozenset()
        self._run_plan(plan)
        accounts.commit(plan, wanted)
        membership.settled(target, released=before - target)
        log.info("membership: running %d account(s); gained %s, handed over %s", len(target),
                 _ids(sorted(target - before)), _ids(sorted(before - target)))

    def _follow_claim(self) -> None:
        """INDEX/COUNT: run the accounts only while this process holds its instance claim."""
        parts = self.parts
        if parts is None or parts.claim_keeper is None or parts.accounts is None \
                or parts.accounts.cfg is None:
            return
        accounts, current = parts.accounts, parts.accounts.cfg
        owned = None if parts.claim_keeper.held() else frozenset[int]()
        if current.owned == owned:
            return
        wanted = replace(current, owned=owned)
        try:
            plan = accounts.plan(wanted)
        except Exception:
            log.exception("instance claim: the accounts could not be built; trying again next turn")
            return
        self._run_plan(plan)
        accounts.commit(plan, wanted)
        if owned is None:
            log.info("instance claim: held by this process now; running its accounts (%d worker(s) "
                     "started)", len(plan.start))
        else:
            log.error("instance claim: held by another process; this one stopped its accounts "
                      "(%d worker(s)) and runs none until it holds the claim", len(plan.stop))

    def _run_plan(self, plan: Plan) -> None:
        # Stopped first: a changed account's old socket hands its chat over and
        # closes before the new one connects.
        late = stop_workers(plan.stop, SOURCES_GRACE_SECS)
        if late:
            log.error("reload: %s did not stop within %.0fs; starting their replacements anyway",
                      ", ".join(late), SOURCES_GRACE_SECS)
        for worker in plan.stop:
            self.supervisor.retire(worker)
        self.metrics.account_workers_reconciled.labels("stopped").inc(len(plan.stop))
        for worker, kind in plan.start:
            try:
                self.supervisor.add_started(worker, Role.SOURCE if kind == "source" else Role.TIMER)
            except Exception:
                log.exception("reload: worker %s could not be started", worker.name)
        self.metrics.account_workers_reconciled.labels("started").inc(len(plan.start))

    def _apply(self, new: Config) -> None:
        running = _settings(self.cfg)
        boot = _settings(self._boot_cfg)
        wanted = _settings(new)
        applied: list[str] = []
        for key, value in wanted.items():
            if key in LIVE_KEYS and not key.startswith("account.") and running.get(key) != value:
                applied.append(f"{key} = {value}")
        if new.daemon.log_level != self.cfg.daemon.log_level:
            set_level(new.daemon.log_level)
        restart = sorted(k for k in set(boot) | set(wanted)
                         if not _live(k) and boot.get(k) != wanted.get(k))
        self.cfg = new
        if applied:
            log.info("reload: applied %s", ", ".join(applied))
        else:
            log.info("reload: nothing to apply live")
        if restart:
            log.warning("reload: changed keys that take effect only after a restart: %s",
                        ", ".join(restart))

    # -- health ----------------------------------------------------------------------

    def _healthz(self, request: Request) -> Response:
        problems = self._liveness_problems()
        if problems:
            return Response.json(503, {"status": "unhealthy", "problems": problems})
        return Response.json(200, {"status": "alive"})

    def _liveness_problems(self) -> list[str]:
        now = time.monotonic()
        problems = [f"worker {w.name} made no progress in time" for w in self.supervisor.workers()
                    if w.alive and not w.healthy(now)]
        supervisor = self._supervisor_problem()
        if supervisor:
            problems.append(supervisor)
        return problems

    def _readyz(self, request: Request) -> Response:
        if self._phase != "ingesting":
            return Response.json(503, {"ready": False, "reason": self._phase})
        if self.parts is None or self.parts.probe is None:
            return Response.json(503, {"ready": False, "reason": "no readiness probe"})
        result = self.parts.probe.check()
        return Response.json(200 if result.ready else 503, result.to_json())

    def _status(self) -> str:
        """One line for systemd's STATUS= (shown by `systemctl status`)."""
        parts = [self._phase]
        if self.http_address is not None and self.metrics_address is not None:
            parts.append(f"http={_fmt(self.http_address)} metrics={_fmt(self.metrics_address)}")
        workers = self.supervisor.workers()
        dead = self.supervisor.dead()
        parts.append(f"workers {len(workers) - len(dead)}/{len(workers)}")
        depth = self._gauge
        parts.append(
            f"chat buffer {depth('chat_buffer_depth')}, chat dead letters "
            f"{depth('chat_dead_letter_depth')}, events parked {depth('events_dead_letter_depth')}, "
            f"in memory {depth('chat_persistence_queue_depth')}, spool {depth('spool_bytes')} B")
        degraded = [f"worker {name} down" for name in dead]
        probe = self.parts.probe if self.parts is not None else None
        last = probe.last if probe is not None else None
        if last is not None and last.redis != "ok":
            degraded.append("redis may evict" if last.redis.startswith("maxmemory") else "redis down")
        if last is not None and last.database != "ok":
            degraded.append("database down")
        if degraded:
            parts.append("degraded: " + ", ".join(degraded))
        return "; ".join(parts)

    def _gauge(self, name: str) -> int:
        value = self.metrics.registry.get_sample_value(name)
        return int(value) if value is not None else 0

    # -- shutdown ------------------------------------------------------------------------

    def _shutdown(self) -> ShutdownReport:
        self._phase = "draining"
        self.notifier.stopping(self._status())
        if self.parts is not None:
            # Before the sources are asked to stop: what they persist on the way out parks
            # rather than waits for a database that does not answer.
            deadline = time.monotonic() + SOURCES_GRACE_SECS
            for hook in self.parts.stopping:
                try:
                    hook(deadline)
                except Exception:
                    log.exception("shutdown: telling the event path to stop failed")
        stages = self._stages()
        report = Shutdown(stages, self.cfg.daemon.shutdown_timeout_secs).run(self._cut_short)
        self._count_lost()
        self._release_leases()
        self._close(report)
        self._phase = "stopped"
        self.local_state.write(self._phase, self.supervisor.workers())
        log.log(logging.INFO if report.complete else logging.ERROR, "%s", report.summary())
        return report

    def _count_lost(self) -> None:
        """Sources still running now hold data the process exits without: counted and said.

        What their chat queues hold and the events whose insert has not returned are counted
        lost (`chat_messages_total{path="lost"}`, `events_persist_failures_total{outcome="lost"}`)
        and logged as LOST; what their sockets had received but they had not read is named
        but cannot be counted. Every source that stopped handed its own over.
        """
        still = [w for w in self.supervisor.workers(Role.SOURCE) if w.alive]
        if not still or self.parts is None:
            return
        threads = {w.ident for w in still if w.ident is not None}
        chat = self.metrics.chat_held()
        events = self.parts.events_in_progress(threads)
        if chat:
            self.metrics.chat_messages.labels("lost").inc(chat)
        if events:
            self.metrics.events_persist_failures.labels("lost").inc(events)
        log.error("shutdown: LOST %d chat message(s) held in memory and %d event(s) whose insert "
                  "had not returned, in %s, which did not stop in time; whatever their sockets "
                  "had received and they had not read yet is lost too, uncounted",
                  chat, events, ", ".join(w.name for w in still))

    def _cut_short(self, timeout: float) -> bool:
        """The shutdown's wait: True once a second stop signal arrived."""
        return any(s in STOP_SIGNALS for s in self.signals.wait(timeout))

    def _stages(self) -> list[Stage]:
        sup = self.supervisor
        sources = sup.workers(Role.SOURCE)
        timers = sup.workers(Role.TIMER, Role.RUNTIME)
        flusher = sup.workers(Role.FLUSH)
        http = self.http if sup.workers(Role.HTTP) else None  # None: the start failed before it
        stages: list[Stage] = []
        if http is not None:
            stages += [
                Stage("http-accept", lambda: _stop([http]), lambda: not http.alive, 1.0,
                      pending=lambda: _running([http])),
                # Requests run on while the listener closes (at most 1 s), so their
                # 5 s count from the signal: with the flush after them, the whole
                # drain stays within its 8 s.
                Stage("http-requests", lambda: None, lambda: not http.in_flight(),
                      HTTP_GRACE_SECS - 1.0, after=("http-accept",), pending=http.in_flight),
                Stage("http-streams", lambda: _ignore(http.close_streams()),
                      lambda: not http.stream_threads(), 1.0, after=("http-requests",),
                      pending=http.stream_threads),
            ]
        stages += [
            Stage("sources", lambda: _stop(sources), lambda: not _running(sources),
                  SOURCES_GRACE_SECS, pending=lambda: _running(sources)),
            Stage("timers", lambda: _stop(timers), lambda: not _running(timers),
                  self.cfg.daemon.shutdown_timeout_secs, pending=lambda: _running(timers)),
            # Last: after the sources and the webhooks in flight handed their data over.
            # The flusher's final() bounds itself to 3 s; the margin lets it report.
            Stage("chat-flush", lambda: _stop(flusher), lambda: not _running(flusher),
                  FINAL_FLUSH_SECS + 0.25,
                  after=("sources", "http-requests") if http is not None else ("sources",),
                  pending=lambda: _running(flusher)),
        ]
        return stages

    def _release_leases(self) -> None:
        if self.parts is not None and self.parts.membership is not None:
            # After the sources stopped: the next owners may start them now.
            self.parts.membership.release_all()
        self._release_drain_leases()

    def _release_drain_leases(self) -> None:
        # The drains release their own lease in final(); this covers a drain
        # that did not stop in time (the process exits under it anyway).
        for worker in self.supervisor.workers():
            lease = getattr(worker, "lease", None)
            if isinstance(lease, Lease):
                lease.release()

    def _close(self, report: ShutdownReport) -> None:
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.http is not None and not self.http.alive:
            self.http.close()
        if self.parts is None:
            return
        if report.not_stopped:
            # A worker still running may hold a pooled connection; closing the
            # pool would wait for it. The process exits around it instead.
            log.warning("not closing the spool, the pool and Redis: %s still running",
                        ", ".join(report.not_stopped))
            return
        for name, close in self.parts.closers:
            _close(name, close)


def _stop(workers: Sequence[Worker]) -> None:
    """Request the stop; a worker whose thread died still gets its final() run."""
    for worker in workers:
        was_alive = worker.alive  # asked before the stop: a stopped thread ends at once
        worker.request_stop()
        if not was_alive:
            # With the stop event set, the thread skips the loop and runs final():
            # a dead source still hands over its queue, a dead flusher still flushes.
            worker.start()


def _ignore(value: object) -> None:
    """Adapt a call with a result to a stage step."""


def _running(workers: Sequence[Worker]) -> list[str]:
    return [w.name for w in workers if w.alive]


def _close(name: str, close: Callable[[], None]) -> None:
    try:
        close()
    except Exception:
        log.exception("closing %s failed", name)


def _settings(cfg: Config) -> dict[str, str]:
    """`section.key` -> value as text (secrets redacted), for comparing two configurations."""
    out: dict[str, str] = {}
    for line in redacted_lines(cfg):
        key, _, value = line.partition(" =")
        out[key] = value.strip()
    return out


def _live(key: str) -> bool:
    return key in LIVE_KEYS or key.startswith("account.")


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids) if ids else "none"


def _fmt(address: tuple[str, int] | None) -> str:
    if address is None:
        return "-"
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def stragglers() -> list[str]:
    """Non-daemon threads other than the caller that are still running."""
    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]


__all__ = ["App", "Role", "RunResult", "Supervisor", "stragglers"]
