"""Helpers for the daemon tests: a notify socket we own, and the daemon as a real process.

`NotifySocket` is what systemd would be: a bound AF_UNIX datagram socket whose
path goes into the daemon's $NOTIFY_SOCKET; a named thread records every
message with the time it arrived. `Daemon` runs `python -m lumio_ingestd -c
CFG run` with its stderr in a file (read while it runs, never a full pipe),
and finds the bound ports in the "listening on" log line.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg2

from lumio_ingestd.runtime.app import App, RunResult
from support.harness.servers import wait_until

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Notice:
    at: float  # monotonic
    lines: tuple[str, ...]

    def has(self, line: str) -> bool:
        return line in self.lines

    def value(self, key: str) -> str | None:
        for line in self.lines:
            if line.startswith(key + "="):
                return line[len(key) + 1:]
        return None


class NotifySocket:
    """A bound datagram socket in a short temp dir (socket paths are limited to ~107 bytes)."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="ln-")
        self.path = os.path.join(self._dir, "notify.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.settimeout(0.05)
        self._lock = threading.Lock()
        self._notices: list[Notice] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="test-notify-reader")
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            notice = Notice(time.monotonic(), tuple(data.decode().split("\n")))
            with self._lock:
                self._notices.append(notice)

    @property
    def notices(self) -> list[Notice]:
        with self._lock:
            return list(self._notices)

    def first(self, line: str) -> Notice | None:
        return next((n for n in self.notices if n.has(line)), None)

    def wait_for(self, line: str, timeout: float, after: float = 0.0) -> Notice:
        found: list[Notice] = []

        def seen() -> bool:
            found[:] = [n for n in self.notices if n.has(line) and n.at >= after]
            return bool(found)

        assert wait_until(seen, timeout), f"no {line} within {timeout}s; got {self.notices}"
        return found[0]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


_LISTENING = re.compile(r"listening on http=(\S+):(\d+) metrics=(\S+):(\d+)")
_SYNTHETIC = re.compile(
    r"synthetic: stopped run=(\S+) chat=(\d+) events=(\d+) event_failures=(\d+) event_every=(\d+)")


@dataclass(frozen=True)
class SyntheticTotals:
    run_id: str
    chat: int
    events: int
    event_failures: int
    event_every: int

    def chat_ids(self) -> set[str]:
        return {f"syn-{self.run_id}-{n}" for n in range(1, self.chat + 1)}

    def event_ids(self) -> set[str]:
        return {f"syn-{self.run_id}-{n}" for n in range(1, self.chat + 1) if n % self.event_every == 0}


class Daemon:
    """`lumio-ingestd -c CONFIG run` as a child process."""

    def __init__(self, config: Path, log_path: Path, *, notify: NotifySocket | None = None,
                 env: Mapping[str, str] | None = None, code: Path | None = None) -> None:
        """`code`: the checkout whose lumio_ingestd runs (default: this one; a benchmark compares two)."""
        self.config = config
        self.log_path = log_path
        environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1"}
        if notify is not None:
            environ["NOTIFY_SOCKET"] = notify.path
        environ.update(env or {})
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()/kill()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lumio_ingestd", "-c", str(config), "run"],
            cwd=code or ROOT, env=environ, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            m = re.search(pattern, self.log)
            if m:
                found.append(m)
            return bool(m) or self.proc.poll() is not None

        wait_until(seen, timeout)
        assert found, f"{pattern!r} not logged within {timeout}s (exit {self.proc.poll()}):\n{self.log}"
        return found[0]

    def ports(self, timeout: float = 20.0) -> tuple[int, int]:
        m = self.wait_log(_LISTENING.pattern, timeout)
        return int(m.group(2)), int(m.group(4))

    def signal(self, signum: int = signal.SIGTERM) -> float:
        self.proc.send_signal(signum)
        return time.monotonic()

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the daemon did not exit within {timeout}s:\n{self.log}") from None
        self._log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def synthetic_totals(self) -> SyntheticTotals:
        m = _SYNTHETIC.search(self.log)
        assert m, f"no synthetic totals in the log:\n{self.log}"
        return SyntheticTotals(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                               int(m.group(5)))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()


def stored_counts(dsn: str, run_id: str) -> tuple[dict[str, int], dict[str, int]]:
    """How often each synthetic chat message id and event external id of `run_id` is stored."""
    like = f"syn-{run_id}-%"
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT message_id, count(*) FROM chat_messages WHERE message_id LIKE %s "
                    "GROUP BY message_id", (like,))
        chat = {str(k): int(v) for k, v in cur.fetchall()}
        cur.execute("SELECT external_id, count(*) FROM events WHERE external_id LIKE %s "
                    "GROUP BY external_id", (like,))
        events = {str(k): int(v) for k, v in cur.fetchall()}
    conn.close()
    return chat, events


def wait_stored(dsn: str, totals: SyntheticTotals, timeout: float,
                alive: Callable[[], bool] = lambda: True) -> tuple[dict[str, int], dict[str, int]]:
    """Wait until every chat message and event of the run is stored (or time runs out)."""
    want_chat, want_events = totals.chat_ids(), totals.event_ids()
    last: list[tuple[dict[str, int], dict[str, int]]] = [({}, {})]

    def done() -> bool:
        last[0] = stored_counts(dsn, totals.run_id)
        chat, events = last[0]
        return (want_chat <= set(chat) and want_events <= set(events)) or not alive()

    wait_until(done, timeout, interval=0.2)
    return last[0]


def assert_exactly_once(stored: tuple[dict[str, int], dict[str, int]], totals: SyntheticTotals) -> None:
    chat, events = stored
    assert totals.chat > 0 and totals.event_failures == 0, totals
    missing_chat = totals.chat_ids() - set(chat)
    assert not missing_chat, f"{len(missing_chat)} chat messages missing, e.g. {sorted(missing_chat)[:5]}"
    assert set(chat) == totals.chat_ids(), "chat messages stored that the run did not report"
    assert all(n == 1 for n in chat.values()), {k: n for k, n in chat.items() if n != 1}
    missing_events = totals.event_ids() - set(events)
    assert not missing_events, f"{len(missing_events)} events missing, e.g. {sorted(missing_events)[:5]}"
    assert set(events) == totals.event_ids(), "events stored that the run did not report"
    assert all(n == 1 for n in events.values()), {k: n for k, n in events.items() if n != 1}
    assert totals.events == len(totals.event_ids())


def metric_value(port: int, name: str, labels: str = "") -> float:
    """One sample of the daemon's /metrics on `port`: `name{...}` whose labels contain `labels`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if (line.startswith(f"{name}{{") or line.startswith(f"{name} ")) and labels in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{labels}}} in the metrics")


def run_app(app: App, driver: Callable[[Callable[[], None]], None]) -> RunResult:
    """app.run() here (main thread); `driver(stop)` on a thread; its failure is re-raised here.

    The app is stopped once (a second stop would cut the shutdown short): by the
    driver calling `stop`, else when the driver returns.
    """
    errors: list[BaseException] = []
    stopped = threading.Event()

    def stop() -> None:
        if not stopped.is_set():
            stopped.set()
            app.request_stop()

    def drive() -> None:
        try:
            driver(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)
        finally:
            stop()

    thread = threading.Thread(target=drive, name="test-driver")
    thread.start()
    try:
        result = app.run()
    finally:
        stop()
        thread.join(30)
    if errors:
        raise errors[0]
    return result
