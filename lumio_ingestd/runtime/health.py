"""Liveness and readiness: the systemd watchdog and the /readyz probe.

Liveness is about our own threads only. The `Watchdog` worker sends
`WATCHDOG=1` while every running worker keeps its progress promise
(`Worker.healthy()`) and the main thread's supervisor loop is turning; a hung
thread stops the petting and systemd restarts the process. A worker that
died is not a hang: the supervisor restarts it. Redis or the database being
down never stops the petting: the workers' calls to them are bounded, so a
worker waiting on them still makes progress.

Readiness is about the servers: `ReadinessProbe.check()` asks Redis (PING and
its eviction policy) and the database (SELECT 1), with short bounds, one check
at a time, and caches the answer briefly so a burst of /readyz requests costs
one round trip. The `HealthProbe` worker refreshes it every few seconds for
the STATUS line, and the first time Redis answers it runs
`redisclient.check_durability()`, which warns about eviction and AOF.

Nothing durable lives here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import redis

from lumio_ingestd.db.errors import DatabaseUnavailable
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.sdnotify import Notifier
from lumio_ingestd.stores.redisclient import REDIS_ERRORS, check_durability
from lumio_ingestd.worker import IntervalWorker, Worker

log = logging.getLogger("lumio_ingestd.health")


@dataclass(frozen=True)
class Readiness:
    redis: str  # "ok" or what is wrong
    database: str
    checked_at: float  # monotonic

    @property
    def ready(self) -> bool:
        return self.redis == "ok" and self.database == "ok"

    def problems(self) -> list[str]:
        return [f"{name}: {state}" for name, state in (("redis", self.redis), ("database", self.database))
                if state != "ok"]

    def to_json(self) -> dict[str, Any]:
        return {"ready": self.ready, "redis": self.redis, "database": self.database}


def _short(exc: BaseException) -> str:
    """What /readyz and STATUS may say: the failure's kind, never its text.

    /readyz answers anyone who reaches the HTTP port, and libpq's and redis-py's
    messages name internal hosts, addresses and ports; those go to the debug log.
    """
    lines = str(exc).strip().splitlines()
    log.debug("readiness check failed: %s: %s", type(exc).__name__, lines[0][:200] if lines else "")
    return f"unavailable ({type(exc).__name__})"


class ReadinessProbe:
    def __init__(self, client: redis.Redis, pool: Pool, metrics: Metrics, *,
                 db_timeout_secs: float = 3.0, max_age_secs: float = 1.0) -> None:
        self._client = client
        self._pool = pool
        self._metrics = metrics
        self._db_timeout = db_timeout_secs
        self._max_age = max_age_secs
        self._lock = threading.Lock()
        self._last: Readiness | None = None
        self._durability_checked = False

    @property
    def last(self) -> Readiness | None:
        return self._last

    def check(self, max_age_secs: float | None = None) -> Readiness:
        """A fresh enough answer: the cached one, or a new check (one at a time)."""
        max_age = self._max_age if max_age_secs is None else max_age_secs
        last = self._last
        if last is not None and time.monotonic() - last.checked_at <= max_age:
            return last
        # Callers that arrive during a check wait for it rather than start their own.
        if not self._lock.acquire(timeout=self._db_timeout + 5.0):
            return last if last is not None else Readiness("not checked yet", "not checked yet", 0.0)
        try:
            last = self._last
            if last is not None and time.monotonic() - last.checked_at <= max_age:
                return last
            result = Readiness(self._check_redis(), self._check_database(), time.monotonic())
            self._last = result
            return result
        finally:
            self._lock.release()

    def _check_redis(self) -> str:
        try:
            self._client.ping()
            # INFO works where CONFIG GET is disabled (managed Redis services).
            policy = str(self._client.info("memory").get("maxmemory_policy", "unknown"))
        except REDIS_ERRORS as exc:
            return _short(exc)
        if not self._durability_checked:
            self._durability_checked = True
            check_durability(self._client, self._metrics)
        self._metrics.redis_noeviction.set(1 if policy == "noeviction" else 0)
        if policy != "noeviction":
            return f"maxmemory-policy is {policy}, not noeviction (Redis may evict buffered data)"
        return "ok"

    def _check_database(self) -> str:
        try:
            with self._pool.transaction(deadline=time.monotonic() + self._db_timeout) as cur:
                cur.execute("SELECT 1")
                cur.fetchone()
        except (psycopg2.Error, DatabaseUnavailable, OSError) as exc:
            return _short(exc)
        return "ok"


class HealthProbe(IntervalWorker):
    """Refreshes the readiness answer for the STATUS line (and the durability warning)."""

    max_turn_secs = 30.0

    def __init__(self, probe: ReadinessProbe, metrics: Metrics, interval_secs: float = 5.0) -> None:
        super().__init__("health", metrics, interval_secs)
        self._probe = probe
        self._logged: tuple[str, ...] | None = None

    def tick(self) -> None:
        result = self._probe.check(max_age_secs=0.0)
        problems = tuple(result.problems())
        if problems != self._logged:  # log changes, not every probe
            if problems:
                log.warning("not ready: %s", "; ".join(problems))
            elif self._logged is not None:
                log.info("ready: Redis and the database answer")
            self._logged = problems


class Watchdog(Worker):
    """Pets systemd's watchdog every `interval_secs` while the process makes progress."""

    max_turn_secs = 10.0

    def __init__(self, notifier: Notifier, metrics: Metrics, interval_secs: float,
                 workers: Callable[[], Sequence[Worker]],
                 supervisor_problem: Callable[[], str | None]) -> None:
        super().__init__("watchdog", metrics)
        self._notifier = notifier
        self.interval_secs = interval_secs
        self._workers = workers
        self._supervisor_problem = supervisor_problem
        self._stale: tuple[str, ...] = ()
        self.pets = 0

    def problems(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        found = [f"worker {w.name} made no progress in time" for w in self._workers()
                 if w is not self and w.alive and not w.healthy(now)]
        supervisor = self._supervisor_problem()
        if supervisor:
            found.append(supervisor)
        return found

    def run_once(self) -> float:
        problems = tuple(self.problems())
        if problems != self._stale:
            if problems:
                log.critical("watchdog: not petting systemd any more: %s", "; ".join(problems))
            else:
                log.warning("watchdog: every worker makes progress again; petting resumes")
            self._stale = problems
        if not problems and self._notifier.watchdog():
            self.pets += 1
        return self.interval_secs
