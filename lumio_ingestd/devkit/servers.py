"""Private PostgreSQL and Redis servers: for the tests, the benchmarks and `lumio-ingestd demo`.

Every server runs as a child process of the calling process, on 127.0.0.1 and
a free port chosen by binding port 0, and can be stopped, killed, restarted
(same port) and paused (SIGSTOP, a "hung" server).  Each server registers
itself, and an atexit handler (plus SIGTERM/SIGHUP handlers, see
install_signal_cleanup) kills whatever is still running and removes the temp
dirs, so nothing outlives the process that started them.

PostgreSQL: initdb runs once per process (template_datadir); each server
copies that data directory. Where TimescaleDB is installed into that
PostgreSQL (`timescaledb_installed`), servers preload it, so migrations make
hypertables as they would on a production TimescaleDB.  When we are root, initdb and postgres run as the
`postgres` system user (else `nobody`), since initdb refuses root.

Nothing durable here: the servers run without fsync and are thrown away.
"""

from __future__ import annotations

import atexit
import functools
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import redis
from psycopg2 import sql
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "DevServerError",
    "PostgresServer",
    "RedisServer",
    "cleanup_all",
    "find_pg_bindir",
    "find_redis_server",
    "timescaledb_installed",
    "free_port",
    "scratch_root",
    "install_signal_cleanup",
    "wait_until",
]

LOCALHOST = "127.0.0.1"
REDIS_START_TIMEOUT = 10.0
PG_START_TIMEOUT = 20.0
_POLL = 0.02  # short wait between readiness probes (always under a deadline)
#: How long `create_database` retries a copy whose template another session holds.
TEMPLATE_BUSY_SECS = 10.0


class DevServerError(RuntimeError):
    """A private server could not be found, started, stopped or reached."""


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port that is free right now (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


_root_lock = threading.RLock()
_root: Path | None = None


def scratch_root() -> Path:
    """This process's temp root: /tmp/lumio-devservers-<pid>-XXXX, mode 0755.

    It lives directly under /tmp (not $TMPDIR, which may be a 0700 dir) so an
    unprivileged server user can traverse it.  Removed at exit.
    """
    global _root
    with _root_lock:
        if _root is None or not _root.is_dir():
            _root = Path(tempfile.mkdtemp(prefix=f"lumio-devservers-{os.getpid()}-", dir="/tmp"))
            os.chmod(_root, 0o755)
        return _root


def _log_tail(path: Path, offset: int = 0, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError as e:
        return f"<no log: {e}>"
    text = data.decode("utf-8", "replace").rstrip("\n")
    if not text:
        return "<log empty>"
    return "\n".join(text.splitlines()[-lines:])


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process from /proc, or None if it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = data[data.rfind(")") + 2 :].split()
    if len(fields) < 2:
        return None
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X", "x")


def _descendants(pid: int) -> list[int]:
    """All live descendants of pid (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        st = _proc_stat(int(entry.name))
        if st is None or st[0] in ("Z", "X", "x"):
            continue
        children.setdefault(st[1], []).append(int(entry.name))
    out: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _signal_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_until(pred: Callable[[], object], timeout: float, interval: float = _POLL) -> bool:
    """Poll pred() every `interval` s until it is true (-> True) or `timeout` s
    have passed (-> False).  The bounded way to wait for a condition."""
    deadline = time.monotonic() + timeout
    waiter = threading.Event()
    while True:
        if pred():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        waiter.wait(min(interval, remaining))


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    wait_until(lambda: not any(_alive(p) for p in pids), timeout)
    return [p for p in pids if _alive(p)]


def _wait_stopped(pid: int, timeout: float = 2.0) -> bool:
    def stopped() -> bool:
        st = _proc_stat(pid)
        return st is None or st[0] in ("T", "t", "Z")

    return wait_until(stopped, timeout, interval=0.005)


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user that PostgreSQL runs as when we are root."""

    name: str
    uid: int
    gid: int

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(USER=self.name, LOGNAME=self.name, HOME=pwd.getpwuid(self.uid).pw_dir or "/")
        return env


def pg_run_as() -> RunAs | None:
    """None when not root; else the `postgres` user if it exists, else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return RunAs(name, pw.pw_uid, pw.pw_gid)
    raise DevServerError(
        "running as root and neither a 'postgres' nor a 'nobody' user exists "
        "(initdb refuses root): create one, e.g. `useradd --system postgres`"
    )


def _chown_tree(path: Path, run_as: RunAs | None) -> None:
    if run_as is None:
        return
    os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), run_as.uid, run_as.gid, follow_symlinks=False)


def _traversable_by(path: Path, run_as: RunAs | None) -> bool:
    """Whether run_as can reach path (x bit on path and every parent)."""
    if run_as is None:
        return True
    p = path.resolve()
    for d in (p, *p.parents):
        try:
            st = d.stat()
        except OSError:
            return False
        if st.st_uid == run_as.uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid == run_as.gid:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------
# binaries
# --------------------------------------------------------------------------


@functools.cache
def find_redis_server() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise DevServerError("redis-server not found on PATH: apt-get install redis-server")
    return exe


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"/postgresql/([0-9.]+)/", path)
    return tuple(int(x) for x in m.group(1).split(".") if x) if m else ()


@functools.cache
def find_pg_bindir() -> Path:
    """Dir holding `postgres` and `initdb`: pg_config --bindir, then
    /usr/lib/postgresql/*/bin (newest first), then PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=False
            )
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    candidates += [
        Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    ]
    for exe in ("postgres", "initdb"):
        found = shutil.which(exe)
        if found:
            candidates.append(Path(found).resolve().parent)
    for c in candidates:
        if all(os.access(c / exe, os.X_OK) for exe in ("postgres", "initdb")):
            return c
    raise DevServerError(
        "PostgreSQL server binaries (postgres, initdb) not found in pg_config --bindir, "
        "/usr/lib/postgresql/*/bin or PATH: apt-get install postgresql"
    )


@functools.cache
def timescaledb_installed() -> bool:
    """Whether the PostgreSQL of `find_pg_bindir` has TimescaleDB installed: its
    library in `pg_config --pkglibdir` and its control file in the extension dir."""
    bindir = find_pg_bindir()
    pg_config = bindir / "pg_config" if (bindir / "pg_config").is_file() else shutil.which("pg_config")
    if pg_config is None:
        return False
    try:
        out = subprocess.run([str(pg_config), "--pkglibdir", "--sharedir"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2:
        return False
    libdir, sharedir = (Path(x) for x in lines)
    return (libdir / "timescaledb.so").is_file() and (
        sharedir / "extension" / "timescaledb.control").is_file()


# --------------------------------------------------------------------------
# registry and cleanup
# --------------------------------------------------------------------------

_registry_lock = threading.RLock()
_registry: dict[int, _Server] = {}


def cleanup_all() -> None:
    """Kill every server still running and remove this process's temp dirs."""
    global _TEMPLATE, _root
    with _registry_lock:
        servers = list(_registry.values())
    for server in servers:
        try:
            server.close()
        except Exception:  # noqa: BLE001 - best effort at exit, keep going
            pass
    with _root_lock:
        if _root is not None:
            shutil.rmtree(_root, ignore_errors=True)
            _root = None
    _TEMPLATE = None


atexit.register(cleanup_all)

_installed_signals: set[int] = set()


def _on_fatal_signal(signum: int, frame: FrameType | None) -> None:
    cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_signal_cleanup(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """Make SIGTERM/SIGHUP to this process clean up servers first (atexit
    does not run on a fatal signal).  Only from the main thread, and only for
    signals still at their default disposition."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in signals:
        if sig in _installed_signals or signal.getsignal(sig) is not signal.SIG_DFL:
            continue
        signal.signal(sig, _on_fatal_signal)
        _installed_signals.add(sig)


class _Server:
    """Common process handling for one server process."""

    kind = "server"

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._owned_dirs: list[Path] = []
        self._started_once = False
        self._lock = threading.RLock()
        with _registry_lock:
            _registry[id(self)] = self

    # -- state
    @property
    def running(self) -> bool:
        """The server process exists (it may be paused)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def _require_running(self, what: str) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            raise DevServerError(f"cannot {what}: {self.kind} is not running")
        return self._proc

    # -- launching (shared by the servers' start())
    _port: int
    _fixed_port: bool
    log_path: Path
    start_seconds: float | None

    def _launch(self, *, cwd: Path, timeout: float, port_taken: str,
                before_try: Callable[[], None] = lambda: None, **popen: Any) -> None:
        """Start the process and wait until `_probe` says it serves; on a first start
        whose port was taken meanwhile, try again on a fresh port (twice)."""
        t0 = time.monotonic()
        attempts = 1 if (self._started_once or self._fixed_port) else 3
        for attempt in range(attempts):
            before_try()
            offset = _log_size(self.log_path)
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    self._command(),  # again after a port change
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=cwd, start_new_session=True, **popen,
                )
            self._paused = False
            try:
                self._wait_ready(offset, timeout)
                break
            except DevServerError:
                if port_taken in _log_tail(self.log_path, offset) and attempt + 1 < attempts:
                    self._port = free_port()
                    continue
                raise
        self._started_once = True
        self.start_seconds = time.monotonic() - t0

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _probe(self, pid: int) -> Exception | None:
        """None when this process serves; else why not (the wait goes on)."""
        raise NotImplementedError

    def _wait_ready(self, log_offset: int, timeout: float) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + timeout
        while True:
            rc = proc.poll()
            if rc is not None:
                self._proc = None
                raise DevServerError(
                    f"{self.kind} exited with code {rc} while starting on port {self._port}; "
                    f"log {self.log_path}:\n{_log_tail(self.log_path, log_offset)}"
                )
            last = self._probe(proc.pid)
            if last is None:
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise DevServerError(
                    f"{self.kind} on port {self._port} did not serve within {timeout:.0f} s "
                    f"(last error: {str(last).strip()}); log {self.log_path}:\n"
                    f"{_log_tail(self.log_path, log_offset)}"
                )
            try:
                proc.wait(timeout=_POLL)  # returns early if it dies
            except subprocess.TimeoutExpired:
                pass

    # -- lifecycle (overridden)
    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        """Stop (if running) and start again on the same port."""
        with self._lock:
            if self.running:
                self.stop()
            self.start()

    def ensure_running(self) -> None:
        """Resume if paused, start if stopped/killed/crashed."""
        with self._lock:
            if self.paused:
                self.resume()
            if not self.running:
                self.start()

    def pause(self) -> None:
        raise NotImplementedError

    def resume(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Kill the server (if running) and remove the temp dirs it owns."""
        with self._lock:
            try:
                self.kill()
            finally:
                for d in self._owned_dirs:
                    shutil.rmtree(d, ignore_errors=True)
                self._owned_dirs.clear()
                with _registry_lock:
                    _registry.pop(id(self), None)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------


class RedisServer(_Server):
    """A private redis-server on 127.0.0.1, no persistence, port kept across restarts."""

    kind = "redis-server"
    host = LOCALHOST

    def __init__(self, workdir: Path, *, port: int | None = None, extra_args: Sequence[str] = (),
                 unixsocket: bool = False) -> None:
        super().__init__()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "redis.log"
        self._port = port if port is not None else free_port()
        self._fixed_port = port is not None
        self.extra_args = list(extra_args)
        self.start_seconds: float | None = None  # duration of the last start()
        # unixsocket=True: it also listens on a Unix socket (`unix_url`), in a short
        # directory (socket paths are limited to ~107 bytes) that any user may
        # traverse, so a daemon run as an unprivileged user reaches it too.
        self.socket_path: Path | None = None
        if unixsocket:
            sock_dir = Path(tempfile.mkdtemp(prefix="r", dir=scratch_root()))
            os.chmod(sock_dir, 0o755)
            self._owned_dirs.append(sock_dir)
            self.socket_path = sock_dir / "redis.sock"

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self._port}/0"

    @property
    def unix_url(self) -> str:
        """unix:///path/redis.sock?db=0 (only with unixsocket=True)."""
        if self.socket_path is None:
            raise DevServerError("this redis-server was started without unixsocket=True")
        return f"unix://{self.socket_path}?db=0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis.Redis with short timeouts and no retries (failures show at once)."""
        opts: dict[str, Any] = {
            "host": self.host,
            "port": self._port,
            "db": 0,
            "socket_timeout": 1.0,
            "socket_connect_timeout": 1.0,
            "retry": Retry(NoBackoff(), 0),
        }
        opts.update(kwargs)
        return redis.Redis(**opts)

    def _command(self) -> list[str]:
        return [
            find_redis_server(),
            "--port", str(self._port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--daemonize", "no",
            *(["--unixsocket", str(self.socket_path), "--unixsocketperm", "777"]
              if self.socket_path is not None else []),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> None:
        with self._lock:
            if self.running:
                raise DevServerError(f"redis-server already running on port {self._port}")
            self._launch(cwd=self.workdir, timeout=REDIS_START_TIMEOUT,
                         port_taken="Address already in use")

    def _probe(self, pid: int) -> Exception | None:
        c = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            info = c.info("server")
            if int(info.get("process_id", -1)) == pid:
                c.ping()
                return None
            return DevServerError(f"port {self._port} answered by another redis "
                                  f"(pid {info.get('process_id')})")
        except redis.RedisError as e:
            return e
        finally:
            c.close()

    def stop(self, timeout: float = 10.0) -> None:
        """SHUTDOWN NOSAVE; falls back to SIGTERM, then SIGKILL."""
        with self._lock:
            if not self.running:
                self._proc = None
                self._paused = False
                return
            proc = self._proc
            assert proc is not None
            if self._paused:
                self.resume()
            c = self.client(socket_timeout=2.0)
            try:
                c.shutdown(nosave=True)
            except Exception:  # noqa: BLE001 - the connection drops as it exits; fall back below
                pass
            finally:
                c.close()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.kill()
            self._paused = False

    def kill(self) -> None:
        """SIGKILL (also works on a paused server)."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired as e:
                    raise DevServerError(f"redis-server pid {proc.pid} survived SIGKILL") from e
            self._paused = False

    def pause(self) -> None:
        """SIGSTOP: the port still accepts TCP connections but nothing answers."""
        with self._lock:
            proc = self._require_running("pause")
            if self._paused:
                return
            os.killpg(proc.pid, signal.SIGSTOP)
            _wait_stopped(proc.pid)
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            proc = self._require_running("resume")
            os.killpg(proc.pid, signal.SIGCONT)
            self._paused = False

    def __repr__(self) -> str:
        return f"<RedisServer port={self._port} running={self.running} paused={self._paused}>"


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------

_TEMPLATE_LOCK = threading.Lock()
_TEMPLATE: Path | None = None
_INITDB_SECONDS: float | None = None

_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}

DEFAULT_PG_SETTINGS: dict[str, str] = {
    "listen_addresses": LOCALHOST,
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "100",
    "shared_buffers": "64MB",
}

# What a server gets on top when TimescaleDB is loaded: no telemetry (it would
# try to reach the internet from a test machine).
TIMESCALEDB_PG_SETTINGS: dict[str, str] = {
    "shared_preload_libraries": "timescaledb",
    "timescaledb.telemetry_level": "off",
}

_SIMPLE_VALUE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _dsn_value(value: str) -> str:
    if _SIMPLE_VALUE.match(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class PostgresServer(_Server):
    """A private PostgreSQL postmaster on 127.0.0.1, trust auth, superuser `postgres`.

    Started with Popen (not pg_ctl) in its own session, so kill() can SIGKILL
    the postmaster and every backend.  The data dir is a copy of the
    session-wide initdb template.
    """

    kind = "postgres"
    host = LOCALHOST
    user = "postgres"

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        timescaledb: bool | None = None,
    ) -> None:
        """`timescaledb`: preload TimescaleDB (None = when it is installed)."""
        super().__init__()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "postgres.log"
        self.run_as = pg_run_as()
        if _traversable_by(self.workdir, self.run_as):
            base = self.workdir / "pg"
            base.mkdir(exist_ok=True)
        else:  # e.g. pytest's tmp_path (0700, root's): use our 0755 temp root
            base = Path(tempfile.mkdtemp(prefix="pg-", dir=scratch_root()))
            self._owned_dirs.append(base)
        os.chmod(base, 0o755)
        _chown_tree(base, self.run_as)
        self.base_dir = base
        self.datadir = base / "data"
        # unix socket paths are limited to ~107 bytes: keep it short
        self.socket_dir = Path(tempfile.mkdtemp(prefix="s", dir=scratch_root()))
        self._owned_dirs.append(self.socket_dir)
        _chown_tree(self.socket_dir, self.run_as)
        self._port = port if port is not None else free_port()
        self._fixed_port = port is not None
        self.timescaledb = timescaledb_installed() if timescaledb is None else timescaledb
        self.settings = {**DEFAULT_PG_SETTINGS,
                         **(TIMESCALEDB_PG_SETTINGS if self.timescaledb else {}), **(settings or {})}
        self.start_seconds: float | None = None  # duration of the last start()

    # -- template ----------------------------------------------------------
    @classmethod
    def template_datadir(cls) -> Path:
        """The session's initdb'd data dir (initdb runs once per process)."""
        global _TEMPLATE, _INITDB_SECONDS
        with _TEMPLATE_LOCK:
            if _TEMPLATE is not None and (_TEMPLATE / "PG_VERSION").is_file():
                return _TEMPLATE
            bindir = find_pg_bindir()
            run_as = pg_run_as()
            parent = Path(tempfile.mkdtemp(prefix="template-", dir=scratch_root()))
            os.chmod(parent, 0o755)
            _chown_tree(parent, run_as)
            target = parent / "data"
            t0 = time.monotonic()
            errors: list[str] = []
            for locale in ("C.UTF-8", "C"):
                shutil.rmtree(target, ignore_errors=True)
                cmd = [
                    str(bindir / "initdb"), "-D", str(target), "-A", "trust", "-U", cls.user,
                    "--no-sync", "-E", "UTF8", f"--locale={locale}",
                ]  # fmt: skip
                kwargs: dict[str, Any] = run_as.popen_kwargs() if run_as else {}
                try:
                    res = subprocess.run(
                        cmd,
                        capture_output=True,
                        text=True,
                        timeout=120,
                        cwd=parent,
                        env=run_as.env() if run_as else None,
                        check=False,
                        **kwargs,
                    )
                except subprocess.TimeoutExpired as e:
                    raise DevServerError(f"initdb did not finish within 120 s: {cmd}") from e
                if res.returncode == 0:
                    break
                errors.append(f"--locale={locale}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
            else:
                raise DevServerError("initdb failed:\n" + "\n".join(errors))
            _INITDB_SECONDS = time.monotonic() - t0
            _TEMPLATE = target
            return target

    @classmethod
    def initdb_seconds(cls) -> float | None:
        """How long the session's initdb took (None if it has not run)."""
        return _INITDB_SECONDS

    def _prepare_datadir(self) -> None:
        if (self.datadir / "PG_VERSION").is_file():
            return
        template = self.template_datadir()
        shutil.rmtree(self.datadir, ignore_errors=True)
        shutil.copytree(template, self.datadir, symlinks=True)
        os.chmod(self.datadir, 0o700)
        _chown_tree(self.datadir, self.run_as)

    # -- addresses ---------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    def dsn(self, dbname: str = "postgres") -> str:
        """libpq keyword/value DSN."""
        return f"host={self.host} port={self._port} user={self.user} dbname={_dsn_value(dbname)}"

    def url(self, dbname: str = "postgres") -> str:
        from urllib.parse import quote

        return f"postgresql://{self.user}@{self.host}:{self._port}/{quote(dbname, safe='')}"

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg2.extensions.connection:
        """A psycopg2 connection in autocommit mode (connect_timeout 5 s unless given)."""
        kwargs.setdefault("connect_timeout", 5)
        conn: psycopg2.extensions.connection = psycopg2.connect(self.dsn(dbname), **kwargs)
        conn.autocommit = True
        return conn

    # -- lifecycle ---------------------------------------------------------
    def _command(self) -> list[str]:
        cmd = [
            str(find_pg_bindir() / "postgres"),
            "-D", str(self.datadir),
            "-p", str(self._port),
            "-k", str(self.socket_dir),
        ]  # fmt: skip
        for key, value in self.settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def start(self, timeout: float = PG_START_TIMEOUT) -> None:
        with self._lock:
            if self.running:
                raise DevServerError(f"postgres already running on port {self._port}")
            self._prepare_datadir()
            # We know our postmaster is dead; a stale pid file whose pid was
            # reused by another process would block startup.
            pidfile = self.datadir / "postmaster.pid"
            self._launch(cwd=self.base_dir, timeout=timeout,
                         port_taken="already in use",
                         before_try=lambda: pidfile.unlink(missing_ok=True),
                         env=self.run_as.env() if self.run_as else None,
                         **(self.run_as.popen_kwargs() if self.run_as else {}))

    def _probe(self, pid: int) -> Exception | None:
        try:
            conn = psycopg2.connect(self.dsn(), connect_timeout=2)
            try:
                with conn.cursor() as cur:
                    cur.execute("SHOW data_directory")
                    row = cur.fetchone()
            finally:
                conn.close()
        except psycopg2.OperationalError as e:
            return e
        if row is not None and Path(row[0]).resolve() == self.datadir.resolve():
            return None
        return DevServerError(f"port {self._port} answered by another postgres ({row})")

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Shut down: fast (SIGINT), immediate (SIGQUIT) or smart (SIGTERM).

        Waits for the postmaster and its backends to exit; SIGKILLs all of
        them if that takes longer than timeout.
        """
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"mode must be one of {sorted(_STOP_SIGNALS)}, not {mode!r}")
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self._paused = False
                return
            if self._paused:
                self.resume()
            children = _descendants(proc.pid)
            try:
                os.kill(proc.pid, _STOP_SIGNALS[mode])
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return
            except ProcessLookupError:
                proc.wait(timeout=5)
            left = _wait_gone(children, 5.0)
            if left:
                _signal_pids(left, signal.SIGKILL)
                _wait_gone(left, 5.0)
            self._paused = False

    def begin_stop(self, mode: str = "smart") -> None:
        """Send the shutdown signal and return at once (the server winds down;
        with "smart" it refuses new connections with "the database system is
        shutting down" while existing sessions go on).  stop()/kill()/close()
        still finish it."""
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"mode must be one of {sorted(_STOP_SIGNALS)}, not {mode!r}")
        with self._lock:
            proc = self._require_running("begin shutdown")
            if self._paused:
                self.resume()
            os.kill(proc.pid, _STOP_SIGNALS[mode])

    def begin_smart_shutdown(self) -> None:
        """begin_stop("smart"): SIGTERM, new connections refused, existing ones kept."""
        self.begin_stop("smart")

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (no shutdown, crash recovery on restart).

        Backends call setsid(), so they are not in the postmaster's process
        group: the postmaster is frozen first (no new forks), then it and all
        its descendants get SIGKILL.
        """
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGSTOP)
                    _wait_stopped(proc.pid, 1.0)
                except ProcessLookupError:
                    pass
                children = _descendants(proc.pid)
                _signal_pids([proc.pid, *children], signal.SIGKILL)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired as e:
                    raise DevServerError(f"postmaster pid {proc.pid} survived SIGKILL") from e
                left = _wait_gone(children, 10.0)
                if left:
                    raise DevServerError(f"postgres backends {left} survived SIGKILL")
            self._paused = False

    def close(self) -> None:
        """Immediate shutdown (SIGQUIT: the postmaster reaps its own backends,
        so no orphans are left for init), SIGKILL as a fallback; then remove
        the temp dirs."""
        with self._lock:
            try:
                if self.running:
                    self.stop("immediate", timeout=10.0)
            except Exception:  # noqa: BLE001 - super().close() SIGKILLs whatever is left
                pass
            super().close()

    def restart(self, mode: str = "fast") -> None:
        with self._lock:
            if self.running:
                self.stop(mode)
            self.start()

    def _tree(self) -> tuple[int, list[int]]:
        proc = self._require_running("signal")
        return proc.pid, _descendants(proc.pid)

    def pause(self) -> None:
        """SIGSTOP the postmaster and all backends: TCP connects still complete
        (kernel backlog) but nothing answers, on new or existing connections."""
        with self._lock:
            proc = self._require_running("pause")
            if self._paused:
                return
            os.kill(proc.pid, signal.SIGSTOP)  # first, so it forks nothing new
            _wait_stopped(proc.pid)
            pid, children = self._tree()
            _signal_pids(children, signal.SIGSTOP)
            for child in children:
                _wait_stopped(child, 0.5)
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            pid, children = self._tree()
            _signal_pids(children, signal.SIGCONT)
            os.kill(pid, signal.SIGCONT)
            self._paused = False

    # -- databases ---------------------------------------------------------
    def create_database(self, name: str, template: str | None = None) -> None:
        """CREATE DATABASE, from `template` when given.

        Copying a template needs it to have no other session. A closed
        connection's backend may still be exiting, and with TimescaleDB
        preloaded its launcher starts a scheduler in every database (again
        after it is ended): either makes the copy fail with 55006 ("being
        accessed by other users"). So the template takes no new connection
        while it is copied, its sessions are ended, and the copy is tried
        again for up to `TEMPLATE_BUSY_SECS` while one is still exiting.
        """
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is None:
            self._execute(query)
            return
        query = query + sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        source = sql.Identifier(template)
        busy: list[psycopg2.Error] = []

        def created() -> bool:
            try:
                self._execute(sql.SQL("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                      "WHERE datname = %s AND pid <> pg_backend_pid()"), (template,))
                self._execute(query)
            except psycopg2.errors.ObjectInUse as exc:
                busy[:] = [exc]
                return False
            return True

        self._execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(source))
        try:
            if not wait_until(created, TEMPLATE_BUSY_SECS, interval=0.05):
                raise busy[0]
        finally:
            self._execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(source))

    def _execute(self, query: sql.Composable, params: tuple[Any, ...] = ()) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(query, params)
        finally:
            conn.close()

    def drop_database(self, name: str) -> None:
        """Terminate its backends, then DROP DATABASE IF EXISTS ... WITH (FORCE)."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
                cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        finally:
            conn.close()

    def __repr__(self) -> str:
        return f"<PostgresServer port={self._port} running={self.running} paused={self._paused}>"
