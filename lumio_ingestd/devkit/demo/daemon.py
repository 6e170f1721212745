"""The real daemon, `python -m lumio_ingestd -c CONFIG run`, as a child process of the demo.

A child process, not threads in the demo's own process, because that is how
the daemon runs for real: its own signal handling, its own shutdown chain,
its own exit code, and a SIGTERM that means exactly what it means under
systemd. It runs in a session of its own, so the Ctrl-C the terminal sends to
the demo's process group does not reach it: the demo decides when to send
SIGTERM (and a second one to cut the drain short). Its log (stderr and
stdout) goes to a file; the bound ports are read from its "listening on" line.

Nothing durable here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from lumio_ingestd.devkit.servers import wait_until

_LISTENING = re.compile(r"listening on http=(\S+):(\d+) metrics=(\S+):(\d+)")
_DRAINED = re.compile(r"shutdown (complete|INCOMPLETE)[^:]* in ([0-9.]+)s")
#: Variables of the calling environment that would make the child think it runs under systemd.
_NOT_INHERITED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM",
                  "LUMIO_INGESTD_CONFIG", "CREDENTIALS_DIRECTORY", "LISTEN_FDS", "LISTEN_PID")


class DaemonFailed(RuntimeError):
    """The daemon did not start, or stopped on its own; the message ends with its log's tail."""


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment minus systemd's variables, with this package importable."""
    env = {k: v for k, v in environ.items() if k not in _NOT_INHERITED}
    env["PYTHONUNBUFFERED"] = "1"
    # Works from a source checkout that is not installed as well as from an install.
    package_parent = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return env


class DaemonProcess:
    def __init__(self, config: Path, log_path: Path, environ: Mapping[str, str]) -> None:
        self.config = config
        self.log_path = log_path
        self._env = child_environment(environ)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()/kill()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "lumio_ingestd", "-c", str(self.config), "run"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=self._env,
            cwd=self.config.parent, start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_listening(self, timeout: float) -> tuple[int, int]:
        """(http port, metrics port) once the daemon logged them; DaemonFailed if it exits first."""
        found: list[re.Match[str]] = []

        def listening() -> bool:
            m = _LISTENING.search(self.log_text())
            if m:
                found.append(m)
            return m is not None or not self.alive

        wait_until(listening, timeout, interval=0.05)
        if not found:
            code = self._proc.poll() if self._proc is not None else None
            state = "still running" if code is None else f"exited with code {code}"
            raise DaemonFailed(f"the daemon did not come up within {timeout:.0f}s ({state}); "
                               f"its log {self.log_path} ends with:\n{self.log_tail()}")
        return int(found[0].group(2)), int(found[0].group(4))

    def stop(self, timeout: float, interrupted: Callable[[float], bool]) -> int:
        """SIGTERM, then wait for the drain and the exit; returns the exit code.

        `interrupted(secs)` waits up to secs and says whether the user asked
        again (a second Ctrl-C): then a second SIGTERM cuts the daemon's waits
        short, as under systemd. SIGKILL only if it is still there at `timeout`.
        """
        proc = self._proc
        if proc is None:
            return 0
        deadline = time.monotonic() + timeout
        proc.send_signal(signal.SIGTERM)
        cut_short = False
        while proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                break
            if interrupted(min(0.2, left)) and not cut_short:
                proc.send_signal(signal.SIGTERM)
                cut_short = True
        code = proc.wait(10)
        self._close_log()
        return code

    def kill(self) -> None:
        """SIGKILL if still running (the cleanup path after a failure)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._close_log()

    def drain(self) -> tuple[bool, float] | None:
        """(complete, seconds) of the shutdown the daemon logged, if it logged one."""
        m = _DRAINED.search(self.log_text())
        return (m.group(1) == "complete", float(m.group(2))) if m else None

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
