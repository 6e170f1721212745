"""Index builds that leave a live table writable: the migrations marked `-- migrate: online`.

A plain `CREATE INDEX` holds a SHARE lock on its table until it commits. On a
large chat_messages that is minutes in which no row can be written, and a
migration runs in one transaction, so every migration before this kind held
that lock for its whole build. An online migration holds nothing but
`CREATE INDEX` statements, run one by one outside a transaction:

- On a plain table: `CREATE INDEX CONCURRENTLY`, which takes a lock that
  writes do not wait for; it waits itself for the transactions open when it
  starts (each wait bounded by the migration's `lock_timeout`).
- On a hypertable, which refuses CONCURRENTLY: `CREATE INDEX ... WITH
  (timescaledb.transaction_per_chunk)`, one transaction per chunk. Only the
  chunk being indexed refuses writes while its index is built (the newest
  chunk, a day of chat, last); the hypertable's own (empty) table is locked
  for an instant at the start.

Both leave an invalid index behind when interrupted (a lock timeout, a stop);
`build` drops an invalid index of the name it builds and starts again. A valid
one of that name is kept (`IF NOT EXISTS`): running a build twice is safe,
which is what makes a retry after a lock timeout, or a crash before the
migration's ledger row, harmless.

Durable when `build` returns: the index, valid, on the table (and on every
chunk of a hypertable).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

import psycopg2.extensions

log = logging.getLogger("lumio_ingestd.db.online_index")

#: The first line of a migration whose statements are online index builds.
ONLINE_MARK = "-- migrate: online"

_IDENT = r"[a-z_][a-z0-9_]*"
_STATEMENT = re.compile(rf"CREATE INDEX (?P<name>{_IDENT}) ON (?P<table>{_IDENT})\s+"
                        r"(?P<columns>\([^;()]+\))(?:\s+WHERE\s+(?P<where>[^;]+?))?")
_COMMENT = re.compile(r"--[^\n]*")


class IndexBuildError(Exception):
    """A build that reported success left no valid index."""


@dataclass(frozen=True, slots=True)
class OnlineIndex:
    name: str
    table: str
    columns: str  # "(a, b DESC)"
    where: str | None = None

    def statement(self, *, hypertable: bool) -> str:
        where = f" WHERE {self.where}" if self.where else ""
        if hypertable:
            return (f"CREATE INDEX IF NOT EXISTS {self.name} ON {self.table} {self.columns} "
                    f"WITH (timescaledb.transaction_per_chunk){where}")
        return f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {self.name} ON {self.table} {self.columns}{where}"


def is_online(sql: str) -> bool:
    return sql.lstrip().startswith(ONLINE_MARK)


def parse(sql: str) -> list[OnlineIndex]:
    """The index builds of an online migration; ValueError naming the statement that is
    not `CREATE INDEX name ON table (columns) [WHERE predicate]`."""
    found = []
    for statement in _COMMENT.sub("", sql).split(";"):
        text = " ".join(statement.split())
        if not text:
            continue
        match = _STATEMENT.fullmatch(text)
        if match is None:
            raise ValueError(f"an online migration holds only CREATE INDEX name ON table (columns) "
                             f"[WHERE ...] statements, not: {text[:120]}")
        found.append(OnlineIndex(match["name"], match["table"], match["columns"], match["where"]))
    if not found:
        raise ValueError("an online migration without a CREATE INDEX statement")
    return found


def _one(conn: psycopg2.extensions.connection, query: str, params: tuple[object, ...]) -> object:
    with conn.cursor() as cur:
        cur.execute(query, params)
        row = cur.fetchone()
    return row[0] if row else None


def is_hypertable(conn: psycopg2.extensions.connection, table: str) -> bool:
    if not _one(conn, "SELECT to_regclass('timescaledb_information.hypertables') IS NOT NULL", ()):
        return False
    return bool(_one(conn, "SELECT EXISTS (SELECT 1 FROM timescaledb_information.hypertables "
                           "WHERE hypertable_schema = current_schema() AND hypertable_name = %s)", (table,)))


def index_valid(conn: psycopg2.extensions.connection, name: str) -> bool | None:
    """Whether the index `name` in the current schema is valid; None where there is none."""
    valid = _one(conn, """SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                           WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace""",
                 (name,))
    return None if valid is None else bool(valid)


def build(conn: psycopg2.extensions.connection, index: OnlineIndex) -> None:
    """Build `index` without holding writes off its table (see the module docstring).

    `conn` must be in autocommit; its `lock_timeout` bounds every lock wait, and a
    wait that times out raises psycopg2.errors.LockNotAvailable (the caller retries)."""
    if not conn.autocommit:
        raise ValueError("an online index build runs outside a transaction (autocommit)")
    hyper = is_hypertable(conn, index.table)
    with conn.cursor() as cur:
        if index_valid(conn, index.name) is False:
            log.warning("index %s was left invalid by an interrupted build: dropping it to build it again",
                        index.name)
            # A hypertable refuses DROP INDEX CONCURRENTLY; its drop locks the (empty) root
            # table and each chunk briefly.
            cur.execute(f"DROP INDEX {'' if hyper else 'CONCURRENTLY '}IF EXISTS {index.name}")
        started = time.monotonic()
        cur.execute(index.statement(hypertable=hyper))
    if index_valid(conn, index.name) is not True:
        raise IndexBuildError(f"index {index.name} is not valid after its build")
    log.info("index %s on %s %s built in %.1f s (%s)", index.name, index.table, index.columns,
             time.monotonic() - started, "one transaction per chunk" if hyper else "concurrently")
