"""TimescaleDB compression (the columnstore) of chat_messages and events.

`ensure_compression` makes the database match `[timescale] compress_after_hours`:
the two hypertables segmented by `account_id` and ordered by `created_at DESC`,
and a columnstore policy per table compressing chunks older than that. It is
idempotent, so `migrate` and every daemon start run it. On plain PostgreSQL
(or a TimescaleDB without its compression part) it changes nothing and says
why, once, as a warning.

Chat is written into day chunks (their indexes stay small enough to be cached
while they take writes) but compressed into chunks of up to `MERGE_INTERVAL`:
TimescaleDB merges a chunk it compresses into the compressed chunk before it
(`compress_chunk_time_interval`). A merge only appends the day's batches, so a
quiet account would keep one small batch per day, and a batch has a fixed
cost of some hundred bytes whatever it holds: `rebatch` then rebuilds the
batches of a merged chunk (`compress_chunk(..., recompress => true)`), one
batch per account and 1,000 rows. Merging needs the sparse indexes set on the
hypertable (`SPARSE_INDEX`): TimescaleDB merges only into a chunk compressed
with exactly the hypertable's settings, and the bloom filters it derives by
default from the btree indexes are stored with each chunk, never with the
hypertable, so without them nothing ever merges.

`run_policies` runs the policies' jobs in this session (`CALL run_job(id)`),
the way the daemon's leader-gated `CompressionWorker` does on a timer, then
`rebatch`: the background scheduler of TimescaleDB 2.28.3 on PostgreSQL 15.20
marks every job it runs as failed ("cannot drop portal "" while it is being set
up", raised after the job committed its work), and backs off; a job run from a
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
#: How long a compressed chunk of a table may grow by merging (tables not named: no
#: merging). Longer merges save more bytes but leave more of the data that
#: retention trims day by day in batches that straddle its horizon, and more to
#: rebuild after each merge (docs/operating.rst, "Compression"; the figures of
#: each length: docs/performance.rst).
MERGE_INTERVAL = {"chat_messages": "7 days"}
#: The sparse indexes of the tables that merge: a bloom filter per batch on the
#: message id (the unique check of a late row) and on the user id (GDPR erasure
#: and export by user). What TimescaleDB would derive from the btree indexes adds
#: filters on `platform` and on two composite keys, which select nothing those two
#: do not, for 3 bytes a row.
SPARSE_INDEX = {"chat_messages": "bloom(message_id), bloom(user_id)"}

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


@dataclass(frozen=True)
class _Settings:
    """A hypertable's columnstore settings as TimescaleDB reports them."""

    enabled: bool
    segmentby: str | None
    orderby: str | None
    merge_interval: str | None
    configured_sparse_index: bool  # a sparse index set on the hypertable (not derived, not the order's)


def _settings(conn: Connection, table: str) -> _Settings:
    with conn.cursor() as cur:
        cur.execute("""SELECT h.compression_enabled, s.segmentby, s.orderby, s.compress_interval_length::text,
                              coalesce(s.index @> '[{"source": "config"}]', false)
                         FROM timescaledb_information.hypertables h
                         LEFT JOIN timescaledb_information.hypertable_columnstore_settings s
                                ON s.hypertable
                                   = format('%%I.%%I', h.hypertable_schema, h.hypertable_name)::regclass
                        WHERE h.hypertable_schema = current_schema() AND h.hypertable_name = %s""", (table,))
        row = cur.fetchone()
    if row is None:
        return _Settings(False, None, None, None, False)
    return _Settings(bool(row[0]), row[1], row[2], row[3], bool(row[4]))


def enable_columnstore(conn: Connection, table: str) -> None:
    """Turn on compression of `table` with our segmenting, order and (for the tables in
    `MERGE_INTERVAL`) merging, unless it is on.

    Where it is on with our segmenting and order but merges nothing, as an earlier
    release left it, merging is added: it applies to the chunks compressed from then
    on. Settings made by hand (another order, a sparse index or merge interval of
    one's own) are left alone."""
    current = _settings(conn, table)
    merge = MERGE_INTERVAL.get(table)
    if not current.enabled:
        with conn.cursor() as cur:
            cur.execute(f"""ALTER TABLE {table} SET (
                              timescaledb.enable_columnstore = true,
                              timescaledb.segmentby = %s,
                              timescaledb.orderby = %s)""", (SEGMENT_BY, ORDER_BY))
        log.info("compression of %s set up: segment by %s, order by %s", table, SEGMENT_BY, ORDER_BY)
    elif (current.segmentby, current.orderby) != (SEGMENT_BY, ORDER_BY) \
            or current.merge_interval is not None or current.configured_sparse_index:
        return
    if merge is not None:
        with conn.cursor() as cur:
            cur.execute(f"""ALTER TABLE {table} SET (
                              timescaledb.sparse_index = %s,
                              timescaledb.compress_chunk_time_interval = %s)""", (SPARSE_INDEX[table], merge))
        log.info("compression of %s merges chunks into up to %s (sparse index %s)",
                 table, merge, SPARSE_INDEX[table])


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
    """Run each table's columnstore policy job now, then `rebatch` it; return table ->
    chunks the job compressed (merged into a compressed chunk or compressed on their own)."""
    done: dict[str, int] = {}
    with session(cfg, on_open) as conn:
        if timescaledb_version(conn) is None:
            return done
        jobs = policy_jobs(conn)
        for table, (job_id, _after) in sorted(jobs.items()):
            before = _uncompressed_chunks(conn, table)
            with conn.cursor() as cur:
                cur.execute("CALL run_job(%s)", (job_id,))
            done[table] = len(before - _uncompressed_chunks(conn, table))
            rebuilt = rebatch(conn, table)
            if rebuilt:
                log.info("compression of %s: batches of %d merged chunk(s) rebuilt", table, rebuilt)
    return done


def _uncompressed_chunks(conn: Connection, table: str) -> set[str]:
    with conn.cursor() as cur:
        cur.execute("""SELECT chunk_name FROM timescaledb_information.chunks
                        WHERE hypertable_schema = current_schema() AND hypertable_name = %s
                          AND NOT is_compressed""", (table,))
        return {str(r[0]) for r in cur.fetchall()}


def rebatch(conn: Connection, table: str) -> int:
    """Rebuild the batches of every compressed chunk of `table` that merging left with more
    batches than it needs (an account with two batches where its rows fit one); return
    how many. Only chunks wider than the table's chunk interval are looked at: a chunk
    compressed on its own has its batches built once already.

    Each rebuild is one statement (`compress_chunk(..., recompress => true)`), committed
    on its own; it holds writes to that chunk off while it runs, and reads for the
    moment it puts the new batches in place."""
    current = _settings(conn, table)
    if current.segmentby != SEGMENT_BY or current.merge_interval is None:
        return 0  # no merging, or settings of one's own: batches are as they were built
    with conn.cursor() as cur:
        cur.execute("""SELECT format('%%I.%%I', c.chunk_schema, c.chunk_name),
                              format('%%I.%%I', z.schema_name, z.table_name)
                         FROM timescaledb_information.chunks c
                         JOIN timescaledb_information.dimensions d
                           ON d.hypertable_schema = c.hypertable_schema
                          AND d.hypertable_name = c.hypertable_name
                          AND d.column_name = c.primary_dimension
                         JOIN _timescaledb_catalog.chunk u
                           ON u.schema_name = c.chunk_schema AND u.table_name = c.chunk_name
                         JOIN _timescaledb_catalog.chunk z ON z.id = u.compressed_chunk_id
                        WHERE c.hypertable_schema = current_schema() AND c.hypertable_name = %s
                          AND c.is_compressed AND c.range_end - c.range_start > d.time_interval
                        ORDER BY c.range_start""", (table,))
        merged = [(str(r[0]), str(r[1])) for r in cur.fetchall()]
    rebuilt = 0
    for chunk, compressed in merged:
        with conn.cursor() as cur:
            # Both names are TimescaleDB's own, quoted by format(%I).
            cur.execute(f"""SELECT EXISTS (
                              SELECT 1 FROM {compressed} GROUP BY {SEGMENT_BY}
                              HAVING count(*) > ceil(sum(_ts_meta_count) / current_setting(
                                         'timescaledb.compression_batch_size_limit')::numeric))""")
            row = cur.fetchone()
            if not (row and row[0]):
                continue
            cur.execute("SELECT compress_chunk(%s::regclass, recompress => true)", (chunk,))
        rebuilt += 1
    return rebuilt


def storage(conn: Connection) -> list[TableStorage] | None:
    """Chunks and bytes of each compressed-or-not table; None on plain PostgreSQL.

    The bytes of compressed chunks now are read from the relations, not from
    TimescaleDB's compression statistics, which a rebuild of the batches (`rebatch`)
    leaves at what the chunks took when first compressed.

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
                       coalesce(sum(d.total_bytes) FILTER (WHERE c.is_compressed), 0),
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
