"""The runtime in process: supervisor restarts, the watchdog, the shutdown order and bounds.

`App` runs in the test's main thread (it installs signal handlers, which only
the main thread may do) with a builder that returns test workers instead of
the chat and event machinery; a driver thread watches the notify socket and
the workers and finally asks the app to stop. Real threads, real sockets, no
Redis or database needed for what is tested here.
"""

from __future__ import annotations

import http.client
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime import gcpolicy
from lumio_ingestd.runtime.app import App, Role, Supervisor
from lumio_ingestd.runtime.build import Parts
from lumio_ingestd.runtime.sdnotify import Notifier, watchdog_interval
from lumio_ingestd.runtime.shutdown import Shutdown, Stage
from lumio_ingestd.runtime.signals import SignalQueue
from lumio_ingestd.web.server import Request, Response, Stream, StreamResponse
from lumio_ingestd.worker import Worker
from support import make_config
from support.daemon import NotifySocket, run_app
from support.harness.servers import wait_until


class Boom(BaseException):
    """Escapes the worker's loop boundary (which catches Exception): the thread dies."""


class Ticker(Worker):
    def __init__(self, name: str, metrics: Metrics) -> None:
        super().__init__(name, metrics)
        self.final_at: float | None = None

    def run_once(self) -> float:
        return 0.02

    def final(self) -> None:
        self.final_at = time.monotonic()


class Dying(Ticker):
    """Dies on its first `deaths` turns, then runs normally."""

    def __init__(self, name: str, metrics: Metrics, deaths: int) -> None:
        super().__init__(name, metrics)
        self.deaths_left = deaths

    def run_once(self) -> float:
        if self.deaths_left > 0:
            self.deaths_left -= 1
            raise Boom("test death")
        return 0.02


class Raising(Ticker):
    """Raises an ordinary exception every turn: caught, logged and counted, never fatal."""

    backoff_min_secs = 0.01
    backoff_max_secs = 0.02

    def run_once(self) -> float:
        raise RuntimeError("test failure")


class Hanging(Ticker):
    """Blocks inside a turn while `hang` is set: no progress, as a stuck socket read would."""

    max_turn_secs = 0.3

    def __init__(self, name: str, metrics: Metrics) -> None:
        super().__init__(name, metrics)
        self.hang = threading.Event()
        self.release = threading.Event()

    def run_once(self) -> float:
        if self.hang.is_set():
            self.release.wait(30)
            self.hang.clear()
            self.release.clear()
        return 0.02

    def wake(self) -> None:
        self.release.set()


class SlowFinal(Ticker):
    """A source whose hand-over on stop takes `secs`."""

    def __init__(self, name: str, metrics: Metrics, secs: float) -> None:
        super().__init__(name, metrics)
        self.secs = secs
        self.final_started: float | None = None

    def final(self) -> None:
        self.final_started = time.monotonic()
        threading.Event().wait(self.secs)
        self.final_at = time.monotonic()


def _config(tmp_path: Path, **daemon: object) -> Config:
    return make_config(tmp_path, sections={
        "daemon": {"log_level": "debug", **daemon},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
    })




# --------------------------------------------------------------------------- supervisor


def test_a_worker_that_dies_is_logged_and_restarted_with_backoff(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    died: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: died.append(args.thread.name if args.thread else "?"))
    metrics = Metrics()
    worker = Dying("dying", metrics, deaths=3)
    sup = Supervisor(metrics, backoff_min=0.05, backoff_max=0.2)
    sup.add(worker, Role.SOURCE)
    caplog.set_level(logging.INFO, "lumio_ingestd.app")
    sup.start_all()
    restarted_at: list[float] = []

    def recovered() -> bool:
        before = metrics.registry.get_sample_value("worker_restarts_total", {"worker": "dying"})
        sup.check()
        after = metrics.registry.get_sample_value("worker_restarts_total", {"worker": "dying"})
        if after != before:
            restarted_at.append(time.monotonic())
        return worker.turns > 5

    try:
        assert wait_until(recovered, 10, interval=0.01)
    finally:
        worker.request_stop()
        assert worker.join(5)
    assert metrics.registry.get_sample_value("worker_restarts_total", {"worker": "dying"}) == 3
    assert died == ["dying", "dying", "dying"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("worker dying died" in m for m in messages) == 3
    assert sum(m == "worker dying restarted" for m in messages) == 3
    # Backoff doubles while it keeps dying: 0.05, 0.1, 0.2 s.
    gaps = [b - a for a, b in zip(restarted_at, restarted_at[1:], strict=False)]
    assert all(g >= 0.05 for g in gaps), gaps


def test_an_exception_in_a_turn_is_logged_and_counted_and_the_thread_lives_on(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    worker = Raising("raising", metrics)
    worker.start()
    try:
        assert wait_until(lambda: (metrics.registry.get_sample_value(
            "worker_errors_total", {"worker": "raising"}) or 0) >= 3, 5)
        assert worker.alive
    finally:
        worker.request_stop()
        assert worker.join(5)
    failed = [r for r in caplog.records if "turn failed" in r.getMessage()]
    assert failed and failed[0].exc_info is not None  # with its traceback, in one record


def test_the_app_restarts_a_dying_worker_and_logs_the_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    dying: list[Dying] = []

    def builder(cfg: Config, metrics: Metrics) -> Parts:
        dying.append(Dying("source-dying", metrics, deaths=1))
        return Parts(sources=list(dying))

    app = App(_config(tmp_path), {}, builder=builder)
    app.supervisor = Supervisor(app.metrics, backoff_min=0.05)

    def driver(stop: Callable[[], None]) -> None:
        assert wait_until(lambda: bool(dying) and dying[0].turns > 3, 10)

    result = run_app(app, driver)
    assert result.code == 0 and result.report is not None and result.report.complete
    died = [r for r in caplog.records if "thread source-dying died with an uncaught Boom" in r.getMessage()]
    assert died and died[0].exc_info is not None and died[0].levelno == logging.CRITICAL
    assert any(r.getMessage() == "worker source-dying restarted" for r in caplog.records)


# --------------------------------------------------------------------------- watchdog


def test_a_hanging_worker_stops_the_watchdog_and_a_recovered_one_resumes_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    hanging: list[Hanging] = []

    def builder(cfg: Config, metrics: Metrics) -> Parts:
        hanging.append(Hanging("timer-hanging", metrics))
        return Parts(sources=[Ticker("source-ok", metrics)], timers=list(hanging))

    with NotifySocket() as notify:
        env = {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}
        app = App(_config(tmp_path), env, builder=builder)
        gaps: dict[str, float] = {}

        def pets() -> list[float]:
            return [n.at for n in notify.notices if n.has("WATCHDOG=1")]

        def driver(stop: Callable[[], None]) -> None:
            notify.wait_for("READY=1", 10)
            assert wait_until(lambda: len(pets()) >= 5, 5)
            hanging[0].hang.set()
            hung_at = time.monotonic()
            assert wait_until(lambda: "watchdog: not petting" in caplog.text, 5), caplog.text
            stopped_at = time.monotonic()
            # Not one pet for a whole second, at a 0.1 s petting interval.
            threading.Event().wait(1.0)
            assert not [t for t in pets() if t > stopped_at], "still petting while a worker hangs"
            gaps["hung to stopped"] = stopped_at - hung_at
            hanging[0].release.set()
            resumed = time.monotonic()
            assert wait_until(lambda: any(t > resumed for t in pets()), 5), "petting did not resume"

        result = run_app(app, driver)
    assert result.code == 0
    assert "timer-hanging made no progress in time" in caplog.text
    assert "every worker makes progress again" in caplog.text
    assert gaps["hung to stopped"] < 2.0


def test_the_database_being_down_does_not_stop_the_petting(tmp_path: Path) -> None:
    """The real build, with Redis and the database unreachable: READY, and WATCHDOG=1 keeps coming."""
    cfg = make_config(tmp_path, sections={
        "http": {"listen": "127.0.0.1:0"}, "metrics": {"listen": "127.0.0.1:0"},
        "chat": {"flush_interval_secs": 0.1}, "events": {"retry_interval_secs": 0.1},
    })
    with NotifySocket() as notify:
        env = {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000"}
        app = App(cfg, env)

        def driver(stop: Callable[[], None]) -> None:
            notify.wait_for("READY=1", 10)
            start = time.monotonic()
            assert wait_until(lambda: len([n for n in notify.notices
                                           if n.has("WATCHDOG=1") and n.at > start + 1.5]) > 0, 5)

            def degraded() -> bool:
                return any("database down" in (n.value("STATUS") or "") for n in notify.notices)

            # The STATUS line names what is down (refreshed every 2 s).
            assert wait_until(degraded, 5), [n.value("STATUS") for n in notify.notices]

        result = run_app(app, driver)
    assert result.code == 0


# --------------------------------------------------------------------------- shutdown order


def test_shutdown_order_http_requests_then_streams_sources_then_flush(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    made: dict[str, Ticker] = {}
    log: list[str] = []
    request_started = threading.Event()

    def slow(request: Request) -> Response:
        request_started.set()
        threading.Event().wait(0.5)
        log.append("request done")
        return Response.json(200, {"slow": True})

    def stream(request: Request) -> StreamResponse:
        def run(s: Stream) -> None:
            while not s.wait_closed(0.05):
                s.write(b": keepalive\n\n")
            log.append("stream closed")
        return StreamResponse(run)

    def builder(cfg: Config, metrics: Metrics) -> Parts:
        made["source"] = SlowFinal("source-slow", metrics, 0.3)
        made["timer"] = Ticker("timer", metrics)
        made["flush"] = Ticker("chat-flush", metrics)
        parts = Parts(sources=[made["source"]], timers=[made["timer"]], flushers=[made["flush"]])
        parts.routes.add("GET", "/slow", slow)
        parts.routes.add("GET", "/stream", stream)
        return parts

    app = App(_config(tmp_path), {}, builder=builder)
    replies: list[int] = []

    def driver(stop: Callable[[], None]) -> None:
        assert wait_until(lambda: app.http_address is not None and app._phase == "ingesting", 10)
        assert app.http_address is not None
        port = app.http_address[1]
        streamer = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        streamer.request("GET", "/stream")
        stream_resp = streamer.getresponse()
        assert stream_resp.status == 200 and stream_resp.read(2) == b": "

        def ask() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/slow")
            replies.append(conn.getresponse().status)
            conn.close()

        asker = threading.Thread(target=ask, name="test-asker")
        asker.start()
        assert request_started.wait(5)
        stop()
        asker.join(10)
        assert stream_resp.read() is not None  # ends when the server closes the stream
        streamer.close()

    result = run_app(app, driver)
    assert result.code == 0 and result.report is not None, caplog.text
    assert result.report.complete, result.report.summary()
    assert replies == [200]  # the request in flight was answered
    assert log == ["request done", "stream closed"]  # streams close after the requests ended
    source, flush = made["source"], made["flush"]
    assert isinstance(source, SlowFinal) and source.final_at is not None and flush.final_at is not None
    assert flush.final_at >= source.final_at  # the flusher is cancelled last
    names = [r.name for r in result.report.results]
    assert names == ["http-accept", "http-requests", "http-streams", "sources", "timers", "chat-flush"]
    flush_stage = result.report.results[-1]
    by_name = {r.name: r for r in result.report.results}
    assert flush_stage.began_at >= by_name["sources"].began_at + by_name["sources"].secs - 0.01
    assert flush_stage.began_at >= by_name["http-requests"].began_at + by_name["http-requests"].secs - 0.01


def test_a_source_that_overruns_is_reported_and_the_flush_still_runs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import lumio_ingestd.runtime.app as app_module

    monkeypatch.setattr(app_module, "SOURCES_GRACE_SECS", 0.3)
    made: dict[str, Ticker] = {}

    def builder(cfg: Config, metrics: Metrics) -> Parts:
        made["source"] = SlowFinal("source-stuck", metrics, 1.5)
        made["flush"] = Ticker("chat-flush", metrics)
        return Parts(sources=[made["source"]], flushers=[made["flush"]])

    app = App(_config(tmp_path, shutdown_timeout_secs=3), {}, builder=builder)
    def driver(stop: Callable[[], None]) -> None:
        assert wait_until(lambda: app._phase == "ingesting", 10)

    result = run_app(app, driver)
    assert result.report is not None and not result.report.complete
    assert result.report.not_stopped == ["source-stuck"]
    assert made["flush"].final_at is not None  # the flush did not wait for the stuck source
    assert made["source"].alive  # still handing over; the process would exit around it
    assert "shutdown INCOMPLETE" in caplog.text and "source-stuck still running" in caplog.text
    made["source"].join(5)


class _Held:
    """A chat queue as the depth gauge sees it: `n` messages in memory."""

    def __init__(self, n: int) -> None:
        self.n = n

    def held(self) -> int:
        return self.n


def test_what_a_source_still_running_at_exit_holds_is_counted_and_logged_lost(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import lumio_ingestd.runtime.app as app_module

    monkeypatch.setattr(app_module, "SOURCES_GRACE_SECS", 0.3)
    made: dict[str, Ticker] = {}
    told: list[float] = []
    queues = [_Held(7), _Held(0)]  # the stuck source's, and a stopped one's (released)

    def builder(cfg: Config, metrics: Metrics) -> Parts:
        made["stuck"] = SlowFinal("source-stuck", metrics, 1.5)
        made["done"] = Ticker("source-done", metrics)
        for queue in queues:
            metrics.hold_chat(queue)
        parts = Parts(sources=[made["stuck"], made["done"]])
        parts.stopping.append(lambda deadline: told.append(deadline - time.monotonic()))
        parts.events_in_progress = lambda threads: 2 if made["stuck"].ident in threads else 0
        return parts

    app = App(_config(tmp_path, shutdown_timeout_secs=3), {}, builder=builder)

    def driver(stop: Callable[[], None]) -> None:
        assert wait_until(lambda: app._phase == "ingesting", 10)

    result = run_app(app, driver)
    assert result.report is not None and result.report.not_stopped == ["source-stuck"]
    # The event path heard of the stop first, with the sources' budget.
    assert len(told) == 1 and 0.0 < told[0] <= 0.3
    assert app.metrics.registry.get_sample_value("chat_messages_total", {"path": "lost"}) == 7
    assert app.metrics.registry.get_sample_value(
        "events_persist_failures_total", {"outcome": "lost"}) == 2
    assert ("shutdown: LOST 7 chat message(s) held in memory and 2 event(s) whose insert had not "
            "returned, in source-stuck, which did not stop in time") in caplog.text
    made["stuck"].join(5)


def test_nothing_is_counted_lost_when_every_source_stopped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def builder(cfg: Config, metrics: Metrics) -> Parts:
        return Parts(sources=[Ticker("source-a", metrics)])

    app = App(_config(tmp_path), {}, builder=builder)
    result = run_app(app, lambda stop: None)
    assert result.report is not None and result.report.complete
    assert app.metrics.registry.get_sample_value("chat_messages_total", {"path": "lost"}) == 0
    assert "LOST" not in caplog.text


# --------------------------------------------------------------------------- the shutdown engine


def _stage(name: str, events: list[str], secs: float, bound: float, after: tuple[str, ...] = (),
           on_timeout: Callable[[], None] | None = None) -> Stage:
    done_at: list[float] = []

    def begin() -> None:
        events.append(f"begin {name}")
        done_at.append(time.monotonic() + secs)

    return Stage(name, begin, lambda: time.monotonic() >= done_at[0], bound, after=after,
                 pending=lambda: [name], on_timeout=on_timeout)


def test_shutdown_runs_stages_in_order_within_their_bounds() -> None:
    events: list[str] = []
    timed_out: list[str] = []
    stages = [
        _stage("a", events, 0.1, 1.0),
        _stage("b", events, 5.0, 0.2, on_timeout=lambda: timed_out.append("b")),
        _stage("c", events, 0.0, 1.0, after=("a", "b")),
    ]
    started = time.monotonic()
    report = Shutdown(stages, 5.0).run(lambda t: threading.Event().wait(t))
    assert time.monotonic() - started < 1.0
    assert events == ["begin a", "begin b", "begin c"]
    by = {r.name: r for r in report.results}
    assert by["a"].in_time and not by["b"].in_time and by["c"].in_time
    assert by["b"].pending == ("b",) and timed_out == ["b"]
    assert by["c"].began_at >= by["b"].began_at + 0.2 - 0.01
    assert not report.complete and "b NOT DONE" in report.summary()


def test_the_overall_deadline_caps_every_stage() -> None:
    events: list[str] = []
    stages = [_stage("slow", events, 10.0, 5.0), _stage("next", events, 10.0, 5.0, after=("slow",))]
    started = time.monotonic()
    report = Shutdown(stages, 0.3).run(lambda t: threading.Event().wait(t))
    assert time.monotonic() - started < 0.6
    assert [r.in_time for r in report.results] == [False, False]


def test_a_second_signal_cuts_every_wait_short() -> None:
    events: list[str] = []
    stages = [_stage("slow", events, 10.0, 5.0), _stage("last", events, 10.0, 5.0, after=("slow",))]
    calls = [0]

    def wait(timeout: float) -> bool:
        calls[0] += 1
        return calls[0] >= 3  # the second signal arrives during the third wait

    started = time.monotonic()
    report = Shutdown(stages, 8.0).run(wait)
    assert time.monotonic() - started < 0.5
    assert report.cut_short and events == ["begin slow", "begin last"]  # still begun, not waited for
    assert "cut short by a second signal" in report.summary()


def test_a_failing_step_is_reported_not_raised() -> None:
    def fail() -> None:
        raise RuntimeError("nope")

    report = Shutdown([Stage("bad", fail, lambda: True, 1.0)], 1.0).run(lambda t: False)
    assert not report.results[0].in_time and "RuntimeError: nope" in report.results[0].error


# --------------------------------------------------------------------------- signals and sd_notify


def test_signal_handler_only_queues_and_the_main_thread_receives() -> None:
    before = signal.getsignal(signal.SIGHUP)
    queue = SignalQueue()
    queue.install([signal.SIGHUP, signal.SIGUSR2])
    try:
        assert queue.wait(0.01) == []
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGUSR2)
        got: list[int] = []

        def both() -> bool:
            got.extend(queue.wait(0.05))
            return len(got) >= 2

        assert wait_until(both, 5)
        assert got == [signal.SIGHUP, signal.SIGUSR2]
        waker = threading.Timer(0.05, queue.wake)
        waker.start()
        started = time.monotonic()
        assert queue.wait(5) == [] and time.monotonic() - started < 2
        waker.join()
    finally:
        queue.restore()
    assert signal.getsignal(signal.SIGHUP) == before  # what the test runner had installed


def test_sd_notify_reaches_path_and_abstract_sockets() -> None:
    import socket

    with NotifySocket() as path_socket:
        assert Notifier({"NOTIFY_SOCKET": path_socket.path}).ready("up")
        notice = path_socket.wait_for("READY=1", 5)
        assert notice.value("STATUS") == "up"
    name = f"lumio-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as abstract:
        abstract.bind("\0" + name)
        abstract.settimeout(5)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).notify("WATCHDOG=1", "STATUS=a\nb")
        assert abstract.recv(1024) == b"WATCHDOG=1\nSTATUS=a b"
    assert not Notifier({}).notify("READY=1")
    assert not Notifier({"NOTIFY_SOCKET": "/nonexistent/socket"}).notify("READY=1")  # never raises


def test_watchdog_interval_is_half_the_period_and_honours_the_pid() -> None:
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "2"}, pid=2) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None


# --------------------------------------------------------------------------- GC policy


def test_the_gc_policy_runs_once_after_the_build_before_any_worker_starts(tmp_path: Path) -> None:
    tickers: list[Ticker] = []
    calls: list[list[int]] = []

    def builder(cfg: Config, metrics: Metrics) -> Parts:
        tickers.append(Ticker("source-ok", metrics))
        return Parts(sources=list(tickers))

    app = App(_config(tmp_path), {}, builder=builder,
              gc_policy=lambda: calls.append([t.turns for t in tickers]))

    def driver(stop: Callable[[], None]) -> None:
        assert wait_until(lambda: bool(tickers) and tickers[0].turns > 3, 10)

    result = run_app(app, driver)
    assert result.code == 0
    assert calls == [[0]]  # built, not yet turning, and only once


def test_the_gc_policy_freezes_the_start_up_objects_and_raises_the_gen0_threshold() -> None:
    # In a process of its own: the policy is process-wide.
    code = ("import gc; from lumio_ingestd.runtime import gcpolicy; gcpolicy.apply(); "
            "print(gc.get_threshold()[0], gc.get_freeze_count() > 1000, gc.isenabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=30).stdout.split()
    assert out == [str(gcpolicy.GEN0_THRESHOLD), "True", "True"]
