"""The ordered shutdown: stages with bounds, run from the main thread.

A `Stage` is a request (`begin`, which must not block) plus a poll (`done`)
and a bound in seconds counted from when the stage began. A stage may wait for
other stages to end (`after`) before it begins; stages without such an edge
run at the same time. `Shutdown.run` begins what it can, polls, and ends each
stage when it is done or its bound passed, all inside one overall deadline.
A stage that ran out of time is reported with what was still running
(`pending`), and `on_timeout` runs for it (closing streams, say).

The waits are the caller's `wait(seconds) -> bool`, which returns True when a
second stop signal arrived: from then on no stage waits any more; the stages
not yet begun are still begun (each is a quick request), and the report says
the shutdown was cut short.

Nothing durable lives here: each stage's `begin` is what hands memory to
Redis, the database or the spool.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

log = logging.getLogger("lumio_ingestd.shutdown")

T = TypeVar("T")

# How often the runner polls `done()` while nothing else wakes it.
POLL_SECS = 0.02


@dataclass
class Stage:
    name: str
    begin: Callable[[], None]
    done: Callable[[], bool]
    bound_secs: float
    after: tuple[str, ...] = ()
    #: What is still running (for the report) when the stage is not done.
    pending: Callable[[], list[str]] = field(default=lambda: [])
    on_timeout: Callable[[], None] | None = None


@dataclass(frozen=True)
class StageResult:
    name: str
    in_time: bool
    began_at: float  # seconds after the shutdown started
    secs: float  # how long the stage ran
    pending: tuple[str, ...] = ()
    error: str = ""

    def describe(self) -> str:
        if self.in_time:
            return f"{self.name} ok in {self.secs:.2f}s"
        what = f" ({', '.join(self.pending)} still running)" if self.pending else ""
        why = f": {self.error}" if self.error else ""
        return f"{self.name} NOT DONE after {self.secs:.2f}s{what}{why}"


@dataclass(frozen=True)
class ShutdownReport:
    results: tuple[StageResult, ...]
    secs: float
    cut_short: bool

    @property
    def complete(self) -> bool:
        return all(r.in_time for r in self.results) and not self.cut_short

    @property
    def not_stopped(self) -> list[str]:
        return [p for r in self.results for p in r.pending]

    def summary(self) -> str:
        head = "shutdown complete" if self.complete else "shutdown INCOMPLETE"
        if self.cut_short:
            head += " (cut short by a second signal)"
        return f"{head} in {self.secs:.2f}s: " + "; ".join(r.describe() for r in self.results)


class Shutdown:
    def __init__(self, stages: Sequence[Stage], deadline_secs: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names repeat: {names}")
        for s in stages:
            unknown = [a for a in s.after if a not in names]
            if unknown:
                raise ValueError(f"stage {s.name} waits for unknown stages {unknown}")
        self._stages = list(stages)
        self._deadline_secs = deadline_secs
        self._clock = clock

    def run(self, wait: Callable[[float], bool]) -> ShutdownReport:
        """Run every stage; `wait(secs)` blocks up to secs and returns True to cut short."""
        start = self._clock()
        deadline = start + self._deadline_secs
        began: dict[str, float] = {}
        results: dict[str, StageResult] = {}
        cut = False

        def finish(stage: Stage, in_time: bool, error: str = "") -> None:
            now = self._clock()
            pending: tuple[str, ...] = ()
            if not in_time:
                pending = tuple(_safe(stage.pending, []))
                if stage.on_timeout is not None:
                    _safe_call(stage.on_timeout, stage.name)
            results[stage.name] = StageResult(
                stage.name, in_time, began[stage.name] - start, now - began[stage.name], pending, error)
            log.log(logging.INFO if in_time else logging.ERROR, "shutdown: %s",
                    results[stage.name].describe())

        while len(results) < len(self._stages):
            now = self._clock()
            ended_before = len(results)
            for stage in self._stages:
                if stage.name in began or not all(a in results for a in stage.after):
                    continue
                began[stage.name] = now
                log.info("shutdown: %s begins", stage.name)
                error = _safe_call(stage.begin, stage.name)
                if error:
                    finish(stage, False, error)
            for stage in self._stages:
                if stage.name not in began or stage.name in results:
                    continue
                if _safe(stage.done, False):
                    finish(stage, True)
                elif cut or now >= min(deadline, began[stage.name] + stage.bound_secs):
                    finish(stage, False, "cut short" if cut else "")
            if len(results) == len(self._stages):
                break
            if len(results) > ended_before and any(
                    s.name not in began and all(a in results for a in s.after) for s in self._stages):
                continue  # a stage ended and another may begin now: no wait
            if not cut:
                remaining = deadline - self._clock()
                cut = wait(max(0.0, min(POLL_SECS, remaining)))
                if cut:
                    log.warning("shutdown: second stop signal; not waiting any longer")
        ordered = tuple(results[s.name] for s in self._stages)
        return ShutdownReport(ordered, self._clock() - start, cut)


def _safe_call(fn: Callable[[], None], what: str) -> str:
    """Run one step; an exception is logged and returned as text, never raised."""
    try:
        fn()
    except Exception as exc:
        log.exception("shutdown: %s failed", what)
        return f"{type(exc).__name__}: {exc}"
    return ""


def _safe(fn: Callable[[], T], fallback: T) -> T:
    try:
        return fn()
    except Exception:
        log.exception("shutdown: a status check failed")
        return fallback
