"""The pool against a real server: settings, bounds, timeouts, black holes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.db.errors import DeadlineExceeded, PoolReentryError, PoolTimeout, classify
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.model import Kind
from support import make_config
from support.harness.proxy import FaultProxyFactory
from support.harness.servers import PostgresServer


def _pool(tmp_path: Path, url: str, **timescale: object) -> Pool:
    cfg = make_config(tmp_path, pg_url=url, sections={"timescale": timescale})
    return Pool(cfg.timescale)




@pytest.fixture
def pool(tmp_path: Path, pg_url: str) -> Iterator[Pool]:
    p = _pool(tmp_path, pg_url, pool_size=2, statement_timeout_secs=1, acquire_timeout_secs=0.5)
    yield p
    p.close()


def test_every_connection_gets_the_session_settings(pool: Pool) -> None:
    seen = set()
    for _ in range(3):
        with pool.transaction() as cur:
            cur.execute("SHOW statement_timeout")
            stmt = cur.fetchone()
            cur.execute("SHOW transaction_isolation")
            iso = cur.fetchone()
            tcp = cur.connection.get_dsn_parameters().get("tcp_user_timeout")
            cur.execute("SELECT pg_backend_pid()")
            seen.add(cur.fetchone())
        assert stmt == ("1s",)
        assert iso == ("read committed",)
        assert tcp == "10000"  # libpq's own socket limit, in ms
    assert len(seen) == 1  # the connection was reused, not reopened


def test_statement_timeout_cancels_and_begin_unbounded_lifts_it(pool: Pool) -> None:
    with pytest.raises(psycopg2.Error) as info, pool.transaction() as cur:
        cur.execute("SELECT pg_sleep(3)")
    assert info.value.pgcode == "57014"
    assert classify(info.value).kind is Kind.TRANSIENT

    with pool.begin_unbounded() as cur:
        cur.execute("SELECT pg_sleep(1.5), current_setting('statement_timeout')")
        assert cur.fetchone() == ("", "0")
    # SET LOCAL ended with the transaction: the same connection is bounded again.
    with pool.transaction() as cur:
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone() == ("1s",)


def test_acquire_times_out_when_every_connection_is_held(pool: Pool) -> None:
    held = threading.Barrier(3, timeout=10)
    release = threading.Event()

    def hold() -> None:
        with pool.connection():
            held.wait()
            release.wait(10)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for th in holders:
        th.start()
    try:
        held.wait()
        started = time.monotonic()
        with pytest.raises(PoolTimeout), pool.connection():
            pass
        waited = time.monotonic() - started
        assert 0.4 <= waited < 2.0
        assert classify(PoolTimeout("x")).kind is Kind.TRANSIENT
    finally:
        release.set()
        for th in holders:
            th.join(timeout=5)
    with pool.transaction() as cur:  # the slots came back
        cur.execute("SELECT 1")


def test_deadline_shortens_the_acquire_wait(pool: Pool) -> None:
    gate = threading.Event()
    ready = threading.Barrier(3, timeout=10)

    def hold() -> None:
        with pool.connection():
            ready.wait()
            gate.wait(10)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for th in holders:
        th.start()
    try:
        ready.wait()
        started = time.monotonic()
        with pytest.raises(PoolTimeout), pool.connection(deadline=time.monotonic() + 0.2):
            pass
        assert time.monotonic() - started < 0.45
    finally:
        gate.set()
        for th in holders:
            th.join(timeout=5)


def test_second_acquire_on_the_same_thread_fails_fast(pool: Pool) -> None:
    with pool.connection():
        started = time.monotonic()
        with pytest.raises(PoolReentryError, match="pass that connection"), pool.connection():
            pass
        assert time.monotonic() - started < 0.1


def test_black_holed_database_cannot_hold_a_caller_past_its_deadline(
        tmp_path: Path, pg_server: PostgresServer, fault_proxy: FaultProxyFactory, pg_dsn: str) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    p = _pool(tmp_path, f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}",
              pool_size=1, statement_timeout_secs=30, acquire_timeout_secs=5)
    try:
        with p.transaction() as cur:  # open a connection while the path is healthy
            cur.execute("SELECT 1")
        proxy.blackhole()
        # An established connection is cut at the deadline; a new one cannot
        # get past libpq's connect_timeout, which the pool caps at the deadline.
        for expected in (DeadlineExceeded, psycopg2.OperationalError):
            started = time.monotonic()
            with pytest.raises(expected) as info, p.transaction(deadline=time.monotonic() + 3.0) as cur:
                cur.execute("INSERT INTO nowhere VALUES (1)")
            elapsed = time.monotonic() - started
            assert elapsed < 3.3, elapsed
            assert classify(info.value).kind is Kind.TRANSIENT
        proxy.pass_through()
        with p.transaction(deadline=time.monotonic() + 5) as cur:  # the cut connection was replaced
            cur.execute("SELECT 2")
            assert cur.fetchone() == (2,)
    finally:
        p.close()


def test_black_holed_database_without_deadline_is_bounded_by_the_default(
        tmp_path: Path, pg_server: PostgresServer, fault_proxy: FaultProxyFactory, pg_dsn: str) -> None:
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    p = _pool(tmp_path, f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}",
              pool_size=1, statement_timeout_secs=1, acquire_timeout_secs=1, connect_timeout_secs=2)
    try:
        with p.transaction() as cur:
            cur.execute("SELECT 1")
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded), p.transaction() as cur:
            cur.execute("SELECT 1")
        assert p.default_bound_secs == 3.0
        assert time.monotonic() - started < p.default_bound_secs + 0.5
    finally:
        p.close()


def test_restarted_server_does_not_fail_the_next_caller(
        tmp_path: Path, private_pg: PostgresServer) -> None:
    p = _pool(tmp_path, private_pg.url("postgres"), pool_size=2)
    try:
        with p.transaction() as cur:
            cur.execute("SELECT 1")
        private_pg.restart()
        with p.transaction() as cur:  # the dead idle connection was dropped, not handed out
            cur.execute("SELECT 2")
            assert cur.fetchone() == (2,)
    finally:
        p.close()


def test_failed_transaction_rolls_back_and_returns_a_clean_connection(pool: Pool) -> None:
    with pool.transaction() as cur:
        cur.execute("CREATE TABLE k (x int PRIMARY KEY)")
    with pytest.raises(psycopg2.IntegrityError), pool.transaction() as cur:
        cur.execute("INSERT INTO k VALUES (1)")
        cur.execute("INSERT INTO k VALUES (1)")
    with pool.transaction() as cur:
        cur.execute("SELECT count(*) FROM k")
        assert cur.fetchone() == (0,)
