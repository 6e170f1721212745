"""The error classifier, fed errors that a real PostgreSQL server produced."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg2
import pytest

from lumio_ingestd.db.errors import classify
from lumio_ingestd.model import Classified, Kind
from support.harness.servers import PostgresServer

Conn = psycopg2.extensions.connection


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[Conn]:
    c = psycopg2.connect(pg_dsn)
    c.autocommit = True
    with c.cursor() as cur:
        cur.execute("CREATE TABLE t (k int PRIMARY KEY, v varchar(3), j jsonb, big text)")
        cur.execute("CREATE INDEX t_big ON t (big)")
        cur.execute("INSERT INTO t (k, v) VALUES (1, 'a'), (2, 'b')")
    yield c
    c.close()


def _raised(conn: Conn, sql: str, params: tuple[object, ...] | None = None) -> BaseException:
    with pytest.raises(Exception) as info, conn.cursor() as cur:
        cur.execute(sql, params)
    return info.value


def _check(exc: BaseException, kind: Kind, sqlstate: str | None) -> Classified:
    got = classify(exc)
    assert got.kind is kind, (exc, got)
    if sqlstate is not None:
        assert got.sqlstate == sqlstate, (exc, got)
    return got


PERMANENT_SQL: list[tuple[str, str]] = [
    ("22P02", "SELECT 'x'::int"),
    ("22001", "INSERT INTO t (k, v) VALUES (10, 'toolong')"),
    ("22P05", "SELECT '\"\\u0000\"'::jsonb"),
    ("22012", "SELECT 1/0"),
    ("23505", "INSERT INTO t (k) VALUES (1)"),
    ("23502", "INSERT INTO t (k) VALUES (NULL)"),
    ("42601", "SELEC 1"),
    ("21000", "INSERT INTO t (k) VALUES (5), (5) ON CONFLICT (k) DO UPDATE SET v = 'z'"),
    # An index row past btree's limit: incompressible text of ~10 kB.
    ("54000", "INSERT INTO t (k, big) SELECT 20, string_agg(md5(i::text), '') "
              "FROM generate_series(1, 320) i"),
]


@pytest.mark.parametrize("sqlstate,sql", PERMANENT_SQL, ids=[s for s, _ in PERMANENT_SQL])
def test_permanent_server_errors(conn: Conn, sqlstate: str, sql: str) -> None:
    _check(_raised(conn, sql), Kind.PERMANENT, sqlstate)


ENVIRONMENTAL_SQL: list[tuple[str, str]] = [
    ("42P01", "SELECT * FROM no_such_table"),
    ("42703", "SELECT no_such_column FROM t"),
    ("42883", "SELECT no_such_function(1)"),
    ("42P10", "INSERT INTO t (k, v) VALUES (3, 'c') ON CONFLICT (v) DO NOTHING"),
]


@pytest.mark.parametrize("sqlstate,sql", ENVIRONMENTAL_SQL, ids=[s for s, _ in ENVIRONMENTAL_SQL])
def test_environmental_server_errors(conn: Conn, sqlstate: str, sql: str) -> None:
    got = _check(_raised(conn, sql), Kind.ENVIRONMENTAL, sqlstate)
    assert got.retryable


def test_missing_grant_is_environmental(conn: Conn) -> None:
    with conn.cursor() as cur:
        cur.execute("CREATE ROLE lumio_nogrant")
        cur.execute("SET ROLE lumio_nogrant")
    _check(_raised(conn, "INSERT INTO t (k) VALUES (9)"), Kind.ENVIRONMENTAL, "42501")


def test_client_side_refusals_are_permanent(conn: Conn) -> None:
    nul = _raised(conn, "INSERT INTO t (k, v) VALUES (30, %s)", ("a\x00b",))
    assert isinstance(nul, ValueError)
    _check(nul, Kind.PERMANENT, None)
    surrogate = _raised(conn, "INSERT INTO t (k, v) VALUES (31, %s)", ("\ud800",))
    assert isinstance(surrogate, UnicodeEncodeError)
    _check(surrogate, Kind.PERMANENT, None)
    unadaptable = _raised(conn, "INSERT INTO t (k, v) VALUES (32, %s)", (object(),))
    _check(unadaptable, Kind.PERMANENT, None)


def test_statement_timeout_is_transient(conn: Conn) -> None:
    with conn.cursor() as cur:
        cur.execute("SET statement_timeout = '100ms'")
    _check(_raised(conn, "SELECT pg_sleep(2)"), Kind.TRANSIENT, "57014")


def test_lock_not_available_is_transient(conn: Conn, pg_dsn: str) -> None:
    holder = psycopg2.connect(pg_dsn)
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT * FROM t WHERE k = 1 FOR UPDATE")
        _check(_raised(conn, "SELECT * FROM t WHERE k = 1 FOR UPDATE NOWAIT"), Kind.TRANSIENT, "55P03")
    finally:
        holder.close()


def test_serialization_failure_is_transient(conn: Conn, pg_dsn: str) -> None:
    other = psycopg2.connect(pg_dsn)
    other.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT v FROM t WHERE k = 1")
        with other.cursor() as cur:
            cur.execute("UPDATE t SET v = 'o' WHERE k = 1")
        _check(_raised(conn, "UPDATE t SET v = 'c' WHERE k = 1"), Kind.TRANSIENT, "40001")
    finally:
        other.close()


def test_deadlock_is_transient(pg_dsn: str, conn: Conn) -> None:
    a, b = psycopg2.connect(pg_dsn), psycopg2.connect(pg_dsn)
    errors: list[BaseException] = []
    both_locked = threading.Barrier(2, timeout=10)

    def cross(c: Conn, first: int, second: int) -> None:
        try:
            with c.cursor() as cur:
                cur.execute("SET deadlock_timeout = '50ms'")
                cur.execute("UPDATE t SET v = 'x' WHERE k = %s", (first,))
                both_locked.wait()
                cur.execute("UPDATE t SET v = 'y' WHERE k = %s", (second,))
            c.commit()
        except psycopg2.Error as exc:
            errors.append(exc)
            c.rollback()

    threads = [threading.Thread(target=cross, args=(a, 1, 2)), threading.Thread(target=cross, args=(b, 2, 1))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=15)
    a.close()
    b.close()
    assert len(errors) == 1
    _check(errors[0], Kind.TRANSIENT, "40P01")


def test_read_only_transaction_is_transient(conn: Conn) -> None:
    with conn.cursor() as cur:
        cur.execute("SET default_transaction_read_only = on")
    _check(_raised(conn, "INSERT INTO t (k) VALUES (40)"), Kind.TRANSIENT, "25006")


def test_too_many_connections_is_transient(conn: Conn, pg_dsn: str) -> None:
    with conn.cursor() as cur:
        cur.execute("CREATE ROLE lumio_limited LOGIN CONNECTION LIMIT 1")
    first = psycopg2.connect(pg_dsn + " user=lumio_limited")
    try:
        with pytest.raises(psycopg2.OperationalError) as info:
            psycopg2.connect(pg_dsn + " user=lumio_limited")
        _check(info.value, Kind.TRANSIENT, None)
        # The same class-53 condition reported inside a session carries its SQLSTATE.
        assert "too many connections" in str(info.value)
    finally:
        first.close()


def test_system_error_class_58_is_transient(conn: Conn) -> None:
    _check(_raised(conn, "SELECT pg_read_file('/nonexistent/lumio')"), Kind.TRANSIENT, "58P01")


def test_terminated_backend_is_transient(conn: Conn, pg_dsn: str) -> None:
    victim = psycopg2.connect(pg_dsn)
    with victim.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        row = cur.fetchone()
        assert row is not None
        pid = row[0]
    victim.rollback()
    with conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
    exc = _raised(victim, "SELECT 1")
    assert isinstance(exc, psycopg2.OperationalError)
    got = _check(exc, Kind.TRANSIENT, None)
    assert got.sqlstate in (None, "57P01")
    victim.close()
    # Afterwards the driver says the connection is closed: still transient.
    _check(_raised(victim, "SELECT 1"), Kind.TRANSIENT, None)


def test_refused_connection_is_transient(free_port: Callable[[], int]) -> None:
    with pytest.raises(psycopg2.OperationalError) as info:
        psycopg2.connect(host="127.0.0.1", port=free_port(), dbname="x", connect_timeout=2)
    _check(info.value, Kind.TRANSIENT, None)


def test_shutting_down_server_is_transient(private_pg: PostgresServer) -> None:
    keep = private_pg.connect()
    try:
        private_pg.begin_smart_shutdown()
        with pytest.raises(psycopg2.OperationalError) as info:
            psycopg2.connect(private_pg.dsn(), connect_timeout=2)
        assert "shutting down" in str(info.value)
        _check(info.value, Kind.TRANSIENT, None)
    finally:
        keep.close()
