"""Shared fixtures: real PostgreSQL and Redis servers and TCP fault proxies.

Nothing here is mocked: every fixture runs real server processes (see
tests/support/harness).  A missing binary fails the test with what to install.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:  # `from harness import ...` however pytest is run
    sys.path.insert(0, _TESTS_DIR)

from support import dbname_of  # noqa: E402
from support.corpus import report_lines  # noqa: E402
from support.harness import (  # noqa: E402
    FaultProxy,
    FaultProxyFactory,
    PostgresServer,
    RedisServer,
    install_signal_cleanup,
)
from support.harness import free_port as _free_port  # noqa: E402
from support.timescale import NEEDS_TIMESCALEDB, compress_all  # noqa: E402

# seconds each session server took to start (reported in the terminal summary)
_START_TIMES: dict[str, float] = {}


def pytest_configure(config: pytest.Config) -> None:
    # atexit does not run when the test process is killed by SIGTERM/SIGHUP
    install_signal_cleanup()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return report_lines()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    for line in report_lines():  # said again at the end, where a reader of `make test` looks
        terminalreporter.write_line(line)
    parts: list[str] = []
    if "postgres" in _START_TIMES:
        initdb = PostgresServer.initdb_seconds()
        initdb_text = f" (initdb {initdb:.2f} s)" if initdb is not None else ""
        parts.append(f"postgres started in {_START_TIMES['postgres']:.2f} s{initdb_text}")
    if "redis" in _START_TIMES:
        parts.append(f"redis in {_START_TIMES['redis']:.2f} s")
    if parts:
        terminalreporter.write_line("harness: " + ", ".join(parts))


# -- session servers ---------------------------------------------------------


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """The session's PostgreSQL server (started once, includes the one initdb)."""
    server = PostgresServer(tmp_path_factory.mktemp("pg_session"))
    try:
        t0 = time.monotonic()
        server.start()
        _START_TIMES["postgres"] = time.monotonic() - t0
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The session's Redis server (started once)."""
    server = RedisServer(tmp_path_factory.mktemp("redis_session"))
    try:
        t0 = time.monotonic()
        server.start()
        _START_TIMES["redis"] = time.monotonic() - t0
        yield server
    finally:
        server.close()


# -- per-test views of the session servers ---------------------------------------


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """redis://127.0.0.1:P/0 of the session Redis, FLUSHALL'd before the test."""
    redis_server.ensure_running()  # a previous test may have paused/stopped it
    client = redis_server.client()
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


def _database_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9_]+", "_", test_name.lower()).strip("_")[:40]
    return f"t_{stem}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def pg_dsn(pg_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """libpq DSN of a fresh, empty database on the session server; dropped after."""
    pg_server.ensure_running()  # a previous test may have paused/stopped it
    name = _database_name(request.node.name)
    pg_server.create_database(name)
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.ensure_running()
        pg_server.drop_database(name)


@pytest.fixture
def pg_url(pg_server: PostgresServer, pg_dsn: str) -> str:
    """The same fresh database as `pg_dsn`, as the postgresql:// URL the config takes."""
    return pg_server.url(dbname_of(pg_dsn))


@pytest.fixture
def timescale_url(pg_server: PostgresServer, pg_url: str) -> str:
    """`pg_url` on a server that preloads TimescaleDB; the test is skipped, saying so,
    where TimescaleDB is not installed (the rest of the suite runs without it)."""
    if not pg_server.timescaledb:
        pytest.skip(NEEDS_TIMESCALEDB)
    return pg_url


@pytest.fixture(params=["postgresql", "timescaledb"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Runs a test on both backends: a fresh database on a private plain PostgreSQL (no
    TimescaleDB preloaded), then `timescale_url`."""
    if request.param == "timescaledb":
        yield request.getfixturevalue("timescale_url")
        return
    with PostgresServer(tmp_path / "plain", timescaledb=False) as server:
        server.create_database("lumio")
        yield server.url("lumio")


@pytest.fixture(params=["uncompressed", "compressed"])
def compress(request: pytest.FixtureRequest, pg_server: PostgresServer) -> Callable[[str], int]:
    """Runs a test twice: `compress(url)` does nothing, then compresses every chunk of
    chat_messages and events (`support.timescale.compress_all`) and returns how many are
    compressed. The compressed run is skipped, saying so, without TimescaleDB."""
    if request.param == "uncompressed":
        return lambda url: 0
    if not pg_server.timescaledb:
        pytest.skip(NEEDS_TIMESCALEDB)

    def run(url: str) -> int:
        n = compress_all(url)
        assert n > 0, "nothing was compressed: the test would not test compressed chunks"
        return n

    return run


# -- private servers (for tests that stop, kill, pause or fill them) ---------------


@pytest.fixture
def private_pg(tmp_path: Path) -> Iterator[PostgresServer]:
    """A started PostgreSQL server of the test's own; killed and removed after."""
    with PostgresServer(tmp_path / "private_pg") as server:
        yield server


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A started Redis server of the test's own; killed and removed after."""
    with RedisServer(tmp_path / "private_redis") as server:
        yield server


# -- network faults and state ------------------------------------------------------


@pytest.fixture
def fault_proxy() -> Iterator[FaultProxyFactory]:
    """Factory: fault_proxy(host, port) -> a started FaultProxy; all closed after."""
    proxies: list[FaultProxy] = []

    def make(host: str, port: int) -> FaultProxy:
        proxy = FaultProxy(host, port).start()
        proxies.append(proxy)
        return proxy

    yield make
    errors: list[Exception] = []
    for proxy in proxies:
        try:
            proxy.close()
        except Exception as e:  # noqa: BLE001 - close them all, then report
            errors.append(e)
    if errors:
        raise errors[0]


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Callable returning a TCP port on 127.0.0.1 that is free right now (bind port 0)."""
    return _free_port


@pytest.fixture
def tmp_state_dir(tmp_path: Path) -> Path:
    """An empty, existing directory for the daemon's state (tmp_path / "state")."""
    state = tmp_path / "state"
    state.mkdir()
    return state
