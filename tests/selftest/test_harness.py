"""Self-tests of the test harness, against real PostgreSQL and Redis servers."""

from __future__ import annotations

import glob
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from lumio_ingestd.devkit import servers as servers_mod
from support.harness import FaultProxy, FaultProxyFactory, HarnessError, PostgresServer, RedisServer

# -- helpers ---------------------------------------------------------------------


def _query(dsn_or_conn: str | psycopg2.extensions.connection, q: str = "SELECT 1", **kw: Any) -> Any:
    if isinstance(dsn_or_conn, str):
        conn = psycopg2.connect(dsn_or_conn, **kw)
        try:
            return _query(conn, q)
        finally:
            conn.close()
    with dsn_or_conn.cursor() as cur:
        cur.execute(q)
        if cur.description is None:  # not a row-returning statement
            return None
        row = cur.fetchone()
        return row[0] if row else None


def _redis(host: str, port: int, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis(
        host=host,
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


class _Background:
    """Run fn in a thread; lets a test see that a call hangs, then collect it."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._fn = fn
        self.thread = threading.Thread(target=self._run, name="harness-test-bg", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def finished_within(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return not self.thread.is_alive()


def _proxy_dsn(proxy: FaultProxy, dbname: str = "postgres") -> str:
    return f"host={proxy.host} port={proxy.port} user=postgres dbname={dbname}"


def _assert_tree_gone(pids: list[int]) -> None:
    left = servers_mod._wait_gone(pids, 5.0)
    assert not left, f"processes still alive: {left}"


# -- fixtures --------------------------------------------------------------------

_seen_db_names: list[str] = []


@pytest.mark.parametrize("round_", [1, 2])
def test_pg_dsn_is_a_fresh_empty_database(pg_dsn: str, pg_server: PostgresServer, round_: int) -> None:
    assert pg_dsn.startswith(f"host=127.0.0.1 port={pg_server.port} user=postgres dbname=t_")
    conn = psycopg2.connect(pg_dsn)
    try:
        conn.autocommit = True
        name = _query(conn, "SELECT current_database()")
        assert _query(conn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
        _query(conn, "CREATE TABLE leftover (x int)")
    finally:
        conn.close()
    # the previous test's database was dropped
    dbs = _query(pg_server.dsn(), "SELECT array_agg(datname::text) FROM pg_database")
    assert name in dbs
    for old in _seen_db_names:
        assert old not in dbs
    _seen_db_names.append(name)


@pytest.mark.parametrize("round_", [1, 2])
def test_redis_url_is_flushed(redis_url: str, round_: int) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=1)
    try:
        assert client.dbsize() == 0
        client.set("leftover", "x")
        assert client.get("leftover") == b"x"
    finally:
        client.close()


def test_server_addresses(pg_server: PostgresServer, redis_server: RedisServer, tmp_state_dir: Path) -> None:
    assert pg_server.dsn("a b") == f"host=127.0.0.1 port={pg_server.port} user=postgres dbname='a b'"
    assert pg_server.url("db1") == f"postgresql://postgres@127.0.0.1:{pg_server.port}/db1"
    assert _query(pg_server.url("postgres"), "SELECT 2") == 2
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    assert tmp_state_dir.is_dir() and tmp_state_dir.name == "state" and not any(tmp_state_dir.iterdir())
    conn = pg_server.connect()
    try:
        assert conn.autocommit
        assert _query(conn, "SHOW fsync") == "off"
        assert _query(conn, "SHOW listen_addresses") == "127.0.0.1"
        assert _query(conn, "SELECT current_user") == "postgres"
    finally:
        conn.close()


def test_create_and_drop_database(pg_server: PostgresServer) -> None:
    pg_server.create_database("harness_src")
    try:
        # Left open: a session on the template (as TimescaleDB's scheduler opens one now and
        # then) would make the copy fail; create_database ends it and copies.
        holder = pg_server.connect("harness_src")
        _query(holder, "CREATE TABLE t AS SELECT 41 + 1 AS x")
        pg_server.create_database("harness_copy", template="harness_src")
        with pytest.raises(psycopg2.OperationalError):
            _query(holder)
        busy = pg_server.connect("harness_copy")  # drop must terminate it
        assert _query(busy, "SELECT x FROM t") == 42
        pg_server.drop_database("harness_copy")
        with pytest.raises(psycopg2.OperationalError):
            _query(busy)
    finally:
        pg_server.drop_database("harness_src")
        pg_server.drop_database("harness_copy")


def test_missing_binaries_fail_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    servers_mod.find_redis_server.cache_clear()
    servers_mod.find_pg_bindir.cache_clear()
    try:
        with pytest.raises(HarnessError, match="apt-get install redis-server"):
            servers_mod.find_redis_server()
        with pytest.raises(HarnessError, match="apt-get install postgresql"):
            servers_mod.find_pg_bindir()
    finally:
        servers_mod.find_redis_server.cache_clear()
        servers_mod.find_pg_bindir.cache_clear()


# -- server failures ---------------------------------------------------------------


def test_private_redis_kill_stop_pause_restart(private_redis: RedisServer) -> None:
    server = private_redis
    port = server.port
    client = server.client(socket_timeout=0.3)
    assert client.set("k", "v")

    server.kill()
    assert not server.running
    with pytest.raises(redis.ConnectionError):
        client.ping()
    server.restart()
    assert server.port == port and client.ping()
    assert client.get("k") is None  # no persistence

    server.stop()
    assert not server.running
    with pytest.raises(redis.ConnectionError):
        client.ping()
    server.start()
    assert client.ping()

    server.pause()
    assert server.paused
    t0 = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.ping()
    assert time.monotonic() - t0 >= 0.25
    server.resume()
    assert client.ping()

    pid = server.pid
    assert pid is not None
    server.pause()
    server.close()  # kill works on a paused server
    assert not servers_mod._alive(pid)


def test_private_pg_kill_restart_and_no_leftovers(private_pg: PostgresServer) -> None:
    server = private_pg
    port = server.port
    conn = server.connect()
    _query(conn, "CREATE TABLE kept AS SELECT 7 AS x")
    pid = server.pid
    assert pid is not None
    tree = [pid, *servers_mod._descendants(pid)]
    assert len(tree) > 3  # postmaster, checkpointer, walwriter, our backend, ...

    server.stop("fast")  # clean shutdown: data is durable
    _assert_tree_gone(tree)
    with pytest.raises(psycopg2.OperationalError):
        _query(conn)
    server.start()
    assert server.port == port
    conn = server.connect()
    assert _query(conn, "SELECT x FROM kept") == 7

    pid = server.pid
    assert pid is not None
    tree = [pid, *servers_mod._descendants(pid)]
    server.kill()
    _assert_tree_gone(tree)
    with pytest.raises(psycopg2.OperationalError):
        _query(conn)
    server.restart()  # crash recovery, same port
    assert server.port == port
    assert _query(server.dsn(), "SELECT x FROM kept", connect_timeout=5) == 7

    server.stop("immediate")
    assert not server.running
    server.start()
    pid = server.pid
    assert pid is not None
    tree = [pid, *servers_mod._descendants(pid)]
    server.close()
    _assert_tree_gone(tree)
    assert not server.base_dir.exists() or server.base_dir.is_relative_to(Path(server.workdir))


def test_private_pg_smart_shutdown_refuses_new_sessions(private_pg: PostgresServer) -> None:
    keep = private_pg.connect()
    private_pg.begin_smart_shutdown()
    assert servers_mod.wait_until(lambda: "shutting down" in _connect_error(private_pg.dsn()), 5.0)
    assert _query(keep, "SELECT 8") == 8  # existing sessions go on
    keep.close()
    private_pg.stop()  # finishes it
    assert not private_pg.running


def _connect_error(dsn: str) -> str:
    try:
        psycopg2.connect(dsn, connect_timeout=2).close()
    except psycopg2.OperationalError as e:
        return str(e)
    return ""


def test_free_port_fixture(free_port: Callable[[], int]) -> None:
    port = free_port()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_private_pg_pause_hangs_then_resumes(private_pg: PostgresServer) -> None:
    server = private_pg
    conn = server.connect()
    server.pause()
    assert server.paused
    bg = _Background(lambda: _query(conn, "SELECT 5"))
    assert not bg.finished_within(0.5), "a query answered while postgres was paused"
    # a new TCP connection is accepted by the kernel but nothing answers
    with socket.create_connection(("127.0.0.1", server.port), timeout=1) as s:
        s.settimeout(0.3)
        s.sendall(b"\x00\x00\x00\x08\x04\xd2\x16\x2f")  # SSLRequest
        with pytest.raises(TimeoutError):
            s.recv(1)
    server.resume()
    assert bg.finished_within(5)
    assert bg.error is None and bg.result == 5
    conn.close()


# -- fault proxy ------------------------------------------------------------------


def test_proxy_pass_through(
    pg_server: PostgresServer, redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    pg_proxy = fault_proxy("127.0.0.1", pg_server.port)
    assert pg_proxy.host == "127.0.0.1" and pg_proxy.port != pg_server.port
    assert _query(_proxy_dsn(pg_proxy), "SELECT repeat('x', 200000)") == "x" * 200000
    assert pg_proxy.connections_accepted == 1

    redis_server.ensure_running()
    r_proxy = fault_proxy("127.0.0.1", redis_server.port)
    client = _redis(r_proxy.host, r_proxy.port)
    big = b"y" * 1_000_000
    client.set("harness:big", big)
    assert client.get("harness:big") == big
    client.delete("harness:big")
    client.close()


def test_proxy_latency(
    pg_server: PostgresServer, redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    conn = psycopg2.connect(_proxy_dsn(proxy), connect_timeout=5)
    proxy.latency(0.2)
    t0 = time.monotonic()
    assert _query(conn, "SELECT 1") == 1
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.4, elapsed  # 0.2 s each way
    proxy.pass_through()
    t0 = time.monotonic()
    _query(conn)
    assert time.monotonic() - t0 < 0.2
    conn.close()

    redis_server.ensure_running()
    r_proxy = fault_proxy("127.0.0.1", redis_server.port)
    client = _redis(r_proxy.host, r_proxy.port)
    assert client.ping()  # connect (several round trips) before adding latency
    r_proxy.latency(0.15)
    t0 = time.monotonic()
    assert client.ping()
    assert time.monotonic() - t0 >= 0.3
    client.close()


def test_proxy_blackhole(
    pg_server: PostgresServer, redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    conn = psycopg2.connect(_proxy_dsn(proxy), connect_timeout=5)
    proxy.blackhole()

    # existing connection: the query hangs...
    bg = _Background(lambda: _query(conn, "SELECT 3"))
    assert not bg.finished_within(0.5), "a query answered through a blackhole"
    # ... a new connection is accepted but its startup gets no answer
    t0 = time.monotonic()
    with pytest.raises(psycopg2.OperationalError, match="timeout"):
        psycopg2.connect(_proxy_dsn(proxy), connect_timeout=2)  # libpq's minimum is 2 s
    assert time.monotonic() - t0 >= 1.9
    assert proxy.connections_accepted == 2

    # healing: held bytes were not dropped, the hung query completes
    proxy.pass_through()
    assert bg.finished_within(5)
    assert bg.error is None and bg.result == 3
    conn.close()

    redis_server.ensure_running()
    r_proxy = fault_proxy("127.0.0.1", redis_server.port)
    r_proxy.blackhole()
    client = _redis(r_proxy.host, r_proxy.port, timeout=0.3)
    with pytest.raises(redis.TimeoutError):
        client.ping()
    client.close()


def test_proxy_reset(
    pg_server: PostgresServer, redis_server: RedisServer, fault_proxy: FaultProxyFactory
) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    conn = psycopg2.connect(_proxy_dsn(proxy), connect_timeout=5)
    raw = socket.create_connection(proxy.address, timeout=1)
    proxy.reset()
    assert proxy.active_connections == 0
    with pytest.raises(ConnectionResetError):
        raw.recv(1)
    raw.close()
    with pytest.raises(psycopg2.OperationalError):
        _query(conn)
    conn.close()
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(_proxy_dsn(proxy), connect_timeout=5)

    redis_server.ensure_running()
    r_proxy = fault_proxy("127.0.0.1", redis_server.port)
    client = _redis(r_proxy.host, r_proxy.port)
    assert client.ping()
    r_proxy.reset()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    r_proxy.pass_through()
    assert client.ping()  # recovers on a new connection
    client.close()


def test_proxy_refuse(pg_server: PostgresServer, fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    port = proxy.port
    held = psycopg2.connect(_proxy_dsn(proxy), connect_timeout=5)
    proxy.refuse()
    assert not proxy.listening
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=1)
    with pytest.raises(psycopg2.OperationalError, match="refused"):
        psycopg2.connect(_proxy_dsn(proxy), connect_timeout=5)
    assert _query(held, "SELECT 4") == 4  # existing connections keep working
    proxy.pass_through()
    assert proxy.port == port
    assert _query(_proxy_dsn(proxy), "SELECT 6", connect_timeout=5) == 6
    held.close()


def test_proxy_close_is_prompt_and_joins_threads(pg_server: PostgresServer) -> None:
    proxy = FaultProxy("127.0.0.1", pg_server.port).start()
    conns = [psycopg2.connect(_proxy_dsn(proxy), connect_timeout=5) for _ in range(3)]
    proxy.blackhole()
    hanging = socket.create_connection(proxy.address, timeout=1)
    assert servers_mod.wait_until(lambda: proxy.active_connections == 4, 2.0)
    t0 = time.monotonic()
    proxy.close()
    assert time.monotonic() - t0 < 1.0
    prefix = f"faultproxy-{proxy.port}-"
    assert not [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=1)
    hanging.close()
    for c in conns:
        c.close()


def test_proxy_in_front_of_a_dying_server(private_redis: RedisServer, fault_proxy: FaultProxyFactory) -> None:
    proxy = fault_proxy("127.0.0.1", private_redis.port)
    client = _redis(proxy.host, proxy.port)
    assert client.ping()
    private_redis.kill()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    private_redis.restart()
    assert client.ping()
    client.close()
