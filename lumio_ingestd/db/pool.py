"""A bounded, blocking pool of psycopg2 connections to TimescaleDB.

psycopg2's own pools raise when empty; ours waits up to `acquire_timeout_secs`
(or a caller's deadline) for a connection, then raises `PoolTimeout`. Every
connection is opened with the session settings the rest of the daemon relies
on: READ COMMITTED (the advisory-lock dedup of events is only correct there),
`statement_timeout`, and the libpq socket limits (connect_timeout, TCP
keepalives, tcp_user_timeout) so that a black-holed server cannot hold a
thread forever. Calls made under a deadline are also guarded by
`DeadlineGuard`, which cuts the socket when the deadline passes.

What is durable when a function here returns: whatever the transaction of
`transaction()` or `begin_unbounded()` committed, and nothing else.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from lumio_ingestd.config import TimescaleConfig
from lumio_ingestd.db.deadline import DeadlineGuard
from lumio_ingestd.db.errors import DatabaseUnavailable, DeadlineExceeded, PoolReentryError, PoolTimeout

log = logging.getLogger("lumio_ingestd.db.pool")

Connection = psycopg2.extensions.connection
Cursor = psycopg2.extensions.cursor

# libpq refuses a connect_timeout below 2 s (it rounds it up).
_MIN_CONNECT_TIMEOUT = 2


def connect_kwargs(cfg: TimescaleConfig, *, application_name: str,
                   statement_timeout_secs: float | None = None,
                   extra_options: str = "") -> dict[str, Any]:
    """libpq parameters shared by the pool, the migrator and the CLI tools."""
    stmt = cfg.statement_timeout_secs if statement_timeout_secs is None else statement_timeout_secs
    options = (
        f"-c statement_timeout={int(stmt * 1000)} "
        r"-c default_transaction_isolation=read\ committed "
        # TimescaleDB caps the rows one transaction may decompress to write into or
        # delete from compressed chunks (100,000 by default), failing the rest with
        # SQLSTATE 53400: a late chat batch checked for duplicates against its compressed
        # chunk, or a GDPR erasure across months of compressed chat, would fail every
        # time. The statement timeout bounds that work instead. On plain PostgreSQL this
        # is an inert placeholder setting.
        "-c timescaledb.max_tuples_decompressed_per_dml_transaction=0"
    )
    if extra_options:
        options += " " + extra_options
    kwargs: dict[str, Any] = {
        "application_name": application_name,
        "connect_timeout": max(_MIN_CONNECT_TIMEOUT, int(cfg.connect_timeout_secs)),
        "keepalives": 1,
        "keepalives_idle": cfg.keepalive_idle_secs,
        "keepalives_interval": max(1, cfg.keepalive_idle_secs // 3),
        "keepalives_count": 3,
        "options": options,
    }
    if cfg.tcp_user_timeout_secs > 0:
        kwargs["tcp_user_timeout"] = int(cfg.tcp_user_timeout_secs * 1000)
    if cfg.password is not None:
        kwargs["password"] = cfg.password.reveal()
    return kwargs


class Pool:
    """Up to `size` connections, shared by threads, one owner at a time."""

    def __init__(self, cfg: TimescaleConfig, *, name: str = "main",
                 size: int | None = None,
                 statement_timeout_secs: float | None = None) -> None:
        self.name = name
        self.size = size if size is not None else cfg.pool_size
        self._cfg = cfg
        self._acquire_timeout = cfg.acquire_timeout_secs
        self._kwargs = connect_kwargs(
            cfg, application_name=f"lumio-ingestd/{name}",
            statement_timeout_secs=statement_timeout_secs,
        )
        self._slots = threading.BoundedSemaphore(self.size)
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._local = threading.local()
        self._guard = DeadlineGuard(name)
        self._closed = False
        stmt = cfg.statement_timeout_secs if statement_timeout_secs is None else statement_timeout_secs
        # A caller without a deadline of its own is still not held forever by
        # a server that stopped answering: the server cancels a statement after
        # statement_timeout, so anything still waiting a connect timeout later
        # is waiting on a dead path. Without a statement timeout there is no
        # such default, and only the socket limits apply.
        self.default_bound_secs: float | None = (
            stmt + max(_MIN_CONNECT_TIMEOUT, cfg.connect_timeout_secs) if stmt > 0 else None
        )

    # -- acquiring -----------------------------------------------------------

    @contextmanager
    def connection(self, *, deadline: float | None = None,
                   bounded: bool = True) -> Iterator[Connection]:
        """Lend one connection for the block, cut at `deadline` (monotonic).

        The wait for a free connection is bounded by `acquire_timeout_secs`
        and by the deadline, whichever comes first. Without a deadline the
        block is cut after `default_bound_secs`, unless `bounded` is false
        (the long transactions of `begin_unbounded`).
        """
        if getattr(self._local, "held", False):
            raise PoolReentryError(
                f"this thread already holds a connection from pool {self.name!r}: "
                "pass that connection (or its cursor) down instead of acquiring again"
            )
        if self._closed:
            raise PoolTimeout(f"pool {self.name!r} is closed")
        wait = self._acquire_timeout
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
        if wait <= 0 or not self._slots.acquire(timeout=wait):
            raise PoolTimeout(
                f"pool {self.name!r}: no connection free within {max(wait, 0):.1f}s "
                f"(all {self.size} busy)"
            )
        self._local.held = True
        conn: Connection | None = None
        try:
            conn = self._take(deadline)
            if deadline is None and bounded and self.default_bound_secs is not None:
                deadline = time.monotonic() + self.default_bound_secs
            with self._guard.bound(conn, deadline):
                yield conn
        finally:
            # _give_back closes a connection that is gone or in an unknown state.
            self._local.held = False
            try:
                if conn is not None:
                    self._give_back(conn)
            finally:
                self._slots.release()

    @contextmanager
    def transaction(self, *, deadline: float | None = None) -> Iterator[Cursor]:
        """One transaction: committed when the block ends, rolled back if it raises.

        With a deadline, the pool wait, every statement and the commit all
        count against it.
        """
        with self.connection(deadline=deadline) as conn:
            with _transaction(conn) as cur:
                yield cur

    @contextmanager
    def begin_unbounded(self) -> Iterator[Cursor]:
        """One transaction with `statement_timeout` lifted for it alone.

        For the long work of lifecycle/ (retention, GDPR erasure and export,
        account dissolution). `SET LOCAL` ends with the transaction, so the
        connection goes back to the pool with its normal limit.
        """
        with self.connection(bounded=False) as conn:
            with _transaction(conn) as cur:
                cur.execute("SET LOCAL statement_timeout = 0")
                yield cur

    def expire_calls_of(self, thread_ident: int | None, within_secs: float) -> int:
        """Cut the database calls of one thread after at most `within_secs` more.

        For stopping: a worker's `wake()` uses it so a call stuck on a dead
        server ends now instead of at its own, longer deadline.
        """
        if thread_ident is None:
            return 0
        return self._guard.expire_thread(thread_ident, time.monotonic() + within_secs)

    def close(self) -> None:
        """Close idle connections; connections in use are closed on return."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            _close_quietly(conn)
        self._guard.close()

    # -- internals -----------------------------------------------------------

    def _take(self, deadline: float | None) -> Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open(deadline)
            if _looks_alive(conn):
                return conn
            _close_quietly(conn)

    def _open(self, deadline: float | None) -> Connection:
        kwargs = dict(self._kwargs)
        if deadline is not None:
            # libpq's connect_timeout is whole seconds and at least 2: a
            # connect that could outlive the deadline is not started at all.
            remaining = int(deadline - time.monotonic())
            if remaining < _MIN_CONNECT_TIMEOUT:
                raise DeadlineExceeded(
                    f"pool {self.name!r}: no idle connection and too little time left to open one"
                )
            kwargs["connect_timeout"] = min(kwargs["connect_timeout"], remaining)
        conn: Connection = psycopg2.connect(self._cfg.dsn, **kwargs)
        psycopg2.extras.register_uuid(conn_or_curs=conn)  # type: ignore[no-untyped-call]
        return conn

    def _give_back(self, conn: Connection) -> None:
        if conn.closed:
            return
        status = conn.info.transaction_status
        if status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            if status == psycopg2.extensions.TRANSACTION_STATUS_UNKNOWN:
                _close_quietly(conn)
                return
            try:
                with self._guard.bound(conn, time.monotonic() + 2.0):
                    conn.rollback()
            except (psycopg2.Error, DatabaseUnavailable) as exc:
                log.warning("pool %s: rollback on return failed, closing: %s", self.name, exc)
                _close_quietly(conn)
                return
        with self._lock:
            if self._closed:
                _close_quietly(conn)
            else:
                self._idle.append(conn)


@contextmanager
def _transaction(conn: Connection) -> Iterator[Cursor]:
    cur = conn.cursor()
    committed = False
    try:
        yield cur
        conn.commit()
        committed = True
    finally:
        # Any way out but a commit (an error, a KeyboardInterrupt) rolls back.
        if not committed and not conn.closed:
            try:
                conn.rollback()
            except psycopg2.Error as exc:  # the connection is gone; the pool drops it
                log.debug("rollback failed: %s", exc)
        if not cur.closed:
            cur.close()


def _looks_alive(conn: Connection) -> bool:
    """An idle connection has nothing to read; if it has, the server hung up."""
    if conn.closed:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _close_quietly(conn: Connection) -> None:
    try:
        conn.close()
    except psycopg2.Error as exc:
        log.debug("close failed: %s", exc)
