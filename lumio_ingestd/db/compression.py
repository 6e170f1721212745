"""TimescaleDB compression (the columnstore) of chat_messages and events.

`ensure_compression` makes the database match `[timescale] compress_after_hours`:
the two hypertables segmented by `account_id` and ordered by `created_at DESC`,
and a columnstore policy per table compressing chunks older than that. It is
idempotent, so `migrate` and every daemon start run it. On plain PostgreSQL
(or a TimescaleDB without its compression part) it changes nothing and says
why, once, as a warning.

`run_policies` runs the policies' jobs in this session (`CALL run_job(id)`),
the way the daemon's leader-gated `CompressionWorker` does on a timer: the
background scheduler of TimescaleDB 2.28.3 on PostgreSQL 15.20 marks every
job it runs as failed ("cannot drop portal "" while it is being set up",
raised after the job committed its work), and backs off; a job run from a
session has a portal already and does not hit it (docs/operating.rst,
"Compression").

`storage` reads, per table, the chunks and bytes compressed and not.

Both run on a connection of their own in autocommit: the policy procedure
commits once per chunk, which it cannot do inside a transaction block.

Durable when `ensure_compression` returns: the settings and policies it
reports. When `run_policies` returns: every chunk it compressed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from lumio_ingestd.config import TimescaleConfig
from lumio_ingestd.db.pool import connect_kwargs

log = logging.getLogger("lumio_ingestd.db.compression")

#: The hypertables compressed, in the order they are handled.
TABLES = ("chat_messages", "events")
#: One segment per account: the daemon's queries filter by account, and a
#: late row or a delete of one account touches only that account's batches.
SEGMENT_BY = "account_id"
ORDER_BY = "created_at DESC"

Connection = psycopg2.extensions.connection


@dataclass(frozen=True)
class CompressionState:
    """What `ensure_compression` found and left."""

    timescaledb: str | None  # the extension's version, None on plain PostgreSQL
    hours: float
    policies: dict[str, int]  # table -> policy job id
    note: str = ""  # why nothing was set up, when it was not


@dataclass(frozen=True)
class TableStorage:
    table: str
    compressed_chunks: int
    uncompressed_chunks: int
    compressed_before_bytes: int  # what the compressed chunks took before compression
    compressed_after_bytes: int  # what they take now
    uncompressed_bytes: int

    def as_dict(self) -> dict[str, int | str]:
        return {
            "table": self.table,
            "compressed_chunks": self.compressed_chunks,
            "uncompressed_chunks": self.uncompressed_chunks,
            "compressed_before_bytes": self.compressed_before_bytes,
            "compressed_after_bytes": self.compressed_after_bytes,
            "uncompressed_bytes": self.uncompressed_bytes,
        }


@contextmanager
def session(cfg: TimescaleConfig, on_open: Callable[[Connection | None], None] | None = None,
            ) -> Iterator[Connection]:
    """A connection of its own, autocommit, no statement timeout (compressing a chunk
    takes as long as it takes); `on_open` is told of it and, at the end, of None
    (so a stopping worker can cancel what runs on it)."""
    conn = psycopg2.connect(cfg.dsn, **connect_kwargs(
        cfg, application_name="lumio-ingestd/compression", statement_timeout_secs=0))
    if on_open is not None:
        on_open(conn)
    try:
        conn.autocommit = True
        yield conn
    finally:
        if on_open is not None:
            on_open(None)
        conn.close()


def timescaledb_version(conn: Connection) -> str | None:
    """The installed timescaledb extension's version in this database, or None.

    Read from pg_extension, which any role may read (unlike
    `shared_preload_libraries`)."""
    with conn.cursor() as cur:
        cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'")
        row = cur.fetchone()
    return str(row[0]) if row else None


def _hypertables(conn: Connection) -> set[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT hypertable_name FROM timescaledb_information.hypertables "
                    "WHERE hypertable_schema = current_schema() AND hypertable_name = ANY(%s)",
                    (list(TABLES),))
        return {str(r[0]) for r in cur.fetchall()}


def policy_jobs(conn: Connection) -> dict[str, tuple[int, str]]:
    """table -> (job id, compress_after as text) of the columnstore policies on our tables."""
    with conn.cursor() as cur:
        cur.execute("""SELECT hypertable_name, job_id, config->>'compress_after'
                         FROM timescaledb_information.jobs
                        WHERE proc_name = 'policy_compression'
                          AND hypertable_schema = current_schema() AND hypertable_name = ANY(%s)""",
                    (list(TABLES),))
        return {str(r[0]): (int(r[1]), str(r[2])) for r in cur.fetchall()}


def _interval_text(conn: Connection, hours: float) -> str:
    """How PostgreSQL prints `hours` as an interval (the policy's config holds that text)."""
    with conn.cursor() as cur:
        cur.execute("SELECT make_interval(secs => %s)::text", (hours * 3600.0,))
        row = cur.fetchone()
    return str(row[0]) if row else ""


def _compression_enabled(conn: Connection, table: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("""SELECT compression_enabled FROM timescaledb_information.hypertables
                        WHERE hypertable_schema = current_schema() AND hypertable_name = %s""",
                    (table,))
        row = cur.fetchone()
    return bool(row and row[0])


def enable_columnstore(conn: Connection, table: str) -> None:
    """Turn on compression of `table` with our segmenting and order, unless it is on.

    Settings made by hand (another order, say) are left alone: TimescaleDB
    refuses to change them while compressed chunks exist."""
    if _compression_enabled(conn, table):
        return
    with conn.cursor() as cur:
        cur.execute(f"""ALTER TABLE {table} SET (
                          timescaledb.enable_columnstore = true,
                          timescaledb.segmentby = %s,
                          timescaledb.orderby = %s)""", (SEGMENT_BY, ORDER_BY))
    log.info("compression of %s set up: segment by %s, order by %s", table, SEGMENT_BY, ORDER_BY)


def ensure_compression(cfg: TimescaleConfig) -> CompressionState:
    """Make compression settings and policies match `cfg.compress_after_hours`."""
    hours = cfg.compress_after_hours
    with session(cfg) as conn:
        version = timescaledb_version(conn)
        if version is None:
            note = "the database is not TimescaleDB"
            if hours > 0:
                log.warning("[timescale] compress_after_hours = %g is set, but %s: nothing is "
                            "compressed and nothing else changes", hours, note)
            return CompressionState(None, hours, {}, note)
        hyper = _hypertables(conn)
        missing = [t for t in TABLES if t not in hyper]
        if missing:
            note = f"{', '.join(missing)} not hypertables (migrated before TimescaleDB was loaded?)"
            if hours > 0:
                log.warning("[timescale] compress_after_hours = %g is set, but %s: nothing is "
                            "compressed", hours, note)
            return CompressionState(version, hours, {}, note)
        jobs = policy_jobs(conn)
        if hours <= 0:
            for table in jobs:
                with conn.cursor() as cur:
                    cur.execute("CALL remove_columnstore_policy(%s, if_exists => true)", (table,))
                log.info("compression of %s switched off: its policy removed (compressed chunks "
                         "stay compressed)", table)
            return CompressionState(version, hours, {})
        wanted = _interval_text(conn, hours)
        policies: dict[str, int] = {}
        for table in TABLES:
            try:
                enable_columnstore(conn, table)
                current = jobs.get(table)
                if current is not None and current[1] != wanted:
                    with conn.cursor() as cur:
                        cur.execute("CALL remove_columnstore_policy(%s, if_exists => true)", (table,))
                    current = None
                if current is None:
                    with conn.cursor() as cur:
                        cur.execute("CALL add_columnstore_policy(%s, after => make_interval(secs => %s), "
                                    "if_not_exists => true)", (table, hours * 3600.0))
                    log.info("compression policy of %s: chunks older than %g h", table, hours)
            except psycopg2.errors.FeatureNotSupported as exc:
                # A build without the Timescale-licensed part (apache-only) has no columnstore.
                note = f"this TimescaleDB has no compression ({str(exc).strip()})"
                log.warning("[timescale] compress_after_hours = %g is set, but %s: nothing is "
                            "compressed", hours, note)
                return CompressionState(version, hours, {}, note)
        policies = {t: job for t, (job, _after) in policy_jobs(conn).items()}
        return CompressionState(version, hours, policies)


def run_policies(cfg: TimescaleConfig,
                 on_open: Callable[[Connection | None], None] | None = None) -> dict[str, int]:
    """Run each table's columnstore policy job now; return table -> chunks it compressed."""
    done: dict[str, int] = {}
    with session(cfg, on_open) as conn:
        if timescaledb_version(conn) is None:
            return done
        jobs = policy_jobs(conn)
        for table, (job_id, _after) in sorted(jobs.items()):
            before = _compressed_count(conn, table)
            with conn.cursor() as cur:
                cur.execute("CALL run_job(%s)", (job_id,))
            done[table] = _compressed_count(conn, table) - before
    return done


def _compressed_count(conn: Connection, table: str) -> int:
    with conn.cursor() as cur:
        cur.execute("""SELECT count(*) FROM timescaledb_information.chunks
                        WHERE hypertable_schema = current_schema() AND hypertable_name = %s
                          AND is_compressed""", (table,))
        row = cur.fetchone()
    return int(row[0]) if row else 0


def storage(conn: Connection) -> list[TableStorage] | None:
    """Chunks and bytes of each compressed-or-not table; None on plain PostgreSQL.

    Runs in whatever transaction `conn` is in (read only)."""
    if timescaledb_version(conn) is None:
        return None
    hyper = _hypertables(conn)
    out: list[TableStorage] = []
    for table in TABLES:
        if table not in hyper:
            continue
        with conn.cursor() as cur:
            cur.execute("""
                SELECT count(*) FILTER (WHERE c.is_compressed),
                       count(*) FILTER (WHERE NOT c.is_compressed),
                       coalesce(sum(s.before_compression_total_bytes) FILTER (WHERE c.is_compressed), 0),
                       coalesce(sum(s.after_compression_total_bytes) FILTER (WHERE c.is_compressed), 0),
                       coalesce(sum(d.total_bytes) FILTER (WHERE NOT c.is_compressed), 0)
                  FROM timescaledb_information.chunks c
                  LEFT JOIN chunk_columnstore_stats(%s::regclass) s
                         ON s.chunk_schema = c.chunk_schema AND s.chunk_name = c.chunk_name
                  LEFT JOIN chunks_detailed_size(%s::regclass) d
                         ON d.chunk_schema = c.chunk_schema AND d.chunk_name = c.chunk_name
                 WHERE c.hypertable_schema = current_schema() AND c.hypertable_name = %s""",
                        (table, table, table))
            row = cur.fetchone()
        assert row is not None
        out.append(TableStorage(table, int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4])))
    return out
