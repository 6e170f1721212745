"""The Worker abstraction with real threads: turns, errors, stops, health."""

from __future__ import annotations

import threading
import time

import pytest

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.worker import IntervalWorker, Worker
from support.harness.servers import wait_until


class Ticker(IntervalWorker):
    def __init__(self, metrics: Metrics, interval: float, fail_first: int = 0) -> None:
        super().__init__("ticker", metrics, interval)
        self.ticks = 0
        self.fail_first = fail_first
        self.finals = 0
        self.backoff_min_secs = 0.01

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks <= self.fail_first:
            raise RuntimeError("boom")

    def final(self) -> None:
        self.finals += 1


def test_interval_worker_ticks_and_stops_at_once() -> None:
    w = Ticker(Metrics(), interval=3600)
    w.start()
    assert wait_until(lambda: w.ticks == 1, timeout=2)
    started = time.monotonic()
    w.request_stop()
    assert w.join(2)
    assert time.monotonic() - started < 0.5  # the hour-long wait was woken
    assert w.finals == 1 and not w.alive


def test_a_failing_turn_is_logged_counted_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    w = Ticker(metrics, interval=0.01, fail_first=3)
    w.start()
    try:
        assert wait_until(lambda: w.ticks >= 5, timeout=5)
    finally:
        w.request_stop()
        assert w.join(2)
    assert metrics.worker_errors.labels("ticker")._value.get() == 3
    assert sum("turn failed" in r.getMessage() and r.exc_info is not None for r in caplog.records) == 3


def test_hung_turn_is_unhealthy() -> None:
    release = threading.Event()

    class Hanger(Worker):
        max_turn_secs = 0.2

        def run_once(self) -> float:
            release.wait(10)
            return 0.01

    w = Hanger("hanger", Metrics())
    w.start()
    try:
        assert w.healthy()
        assert wait_until(lambda: not w.healthy(), timeout=3)
    finally:
        release.set()
        w.request_stop()
        assert w.join(2)


def test_waiting_worker_stays_healthy() -> None:
    w = Ticker(Metrics(), interval=1.0)
    w.max_turn_secs = 0.1
    w.start()
    try:
        assert wait_until(lambda: w.ticks == 1, timeout=2)
        deadline = time.monotonic() + 0.6  # longer than max_turn_secs, shorter than the interval
        while time.monotonic() < deadline:
            assert w.healthy()
            w.stop_event.wait(0.05)
    finally:
        w.request_stop()
        assert w.join(2)


def test_restart_after_death() -> None:
    w = Ticker(Metrics(), interval=0.01)
    w.start()
    with pytest.raises(RuntimeError, match="already running"):
        w.start()
    w.request_stop()
    assert w.join(2)
    w.stop_event.clear()
    w.start()
    assert wait_until(lambda: w.ticks > 1, timeout=2)
    w.request_stop()
    assert w.join(2)
