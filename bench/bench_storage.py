"""Benchmark of chat storage: what compression leaves of realistic chat, and "the latest 100
messages of one account" with and without its index, on plain PostgreSQL and on
TimescaleDB uncompressed and compressed.

    .venv/bin/python bench/bench_storage.py [--rows 10000000] [--ratio-rows 300000]
                                            [--accounts 1000] [--days 30]

The rows: `lumio_ingestd.devkit.chat_rows` (Twitch chat as the daemon stores it, accounts
by Zipf's law, chat while live), over `--accounts` accounts and `--days` days ending 14
days ago (so every chunk is due for compression at the daemon's 300 h), in day chunks.

(1) Compression, on `--ratio-rows` rows, on TimescaleDB. Each way in a database of its
own, filled with the same rows and migrated completely (the account index of migration
7 included; the bytes before it are given too):

    earlier         what the earlier release did: every day chunk its own compressed
                    chunk (segment by account, order by time), TimescaleDB's own sparse
                    indexes
    week chunks     the same on chunks of 7 days (the chunk interval, for writes too)
    merged          day chunks merged into compressed chunks of up to 7 days, batches
                    as the merge leaves them (a batch per account and day)
    now             the daemon's: `ensure_compression` and `run_policies`
                    (lumio_ingestd.db.compression): merged into 7 days, each merged
                    chunk's batches rebuilt, two bloom filters
    now, TimescaleDB's sparse indexes
                    the same with the five bloom filters TimescaleDB derives from the
                    btree indexes
    merged into 14 / 30 days
                    the same as now, merging up to 14 or 30 days

Per way: bytes per row before and after (hypertable_size), their ratio, the chunks, the
time to compress, and the latest 100 messages of an account of median traffic.

(2) Reads, on `--rows` rows: on plain PostgreSQL and on TimescaleDB, migrated without
migration 7 and filled: the median of 20 warm runs of the latest 100 messages of an
account of median traffic, and of its messages per minute over a day, each with its plan
(the indexes it reads, whether it sorts after reading); then migration 7 as `migrate`
applies it (online, timed), and the same again. On TimescaleDB then compressed as the
daemon does, and again; and in a second database with the same rows, compressed the
earlier way, and again.

Writes bench/results/bench_storage.json. Not a test: no thresholds here.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _paths import ROOT  # noqa: E402 - first: it sets up sys.path

from lumio_ingestd.config import Config  # noqa: E402
from lumio_ingestd.db.compression import ensure_compression, rebatch, run_policies  # noqa: E402
from lumio_ingestd.db.migrate import Migration, migrate, packaged_migrations  # noqa: E402
from lumio_ingestd.devkit.chat_rows import fill_chat  # noqa: E402
from lumio_ingestd.devkit.servers import PostgresServer, timescaledb_installed  # noqa: E402
from support import make_config  # noqa: E402

RUNS = 20
COMPRESS_AFTER_HOURS = 300.0

LAST_100 = ("SELECT * FROM chat_messages WHERE account_id = %s "
            "ORDER BY created_at DESC LIMIT 100")
PER_MINUTE = ("SELECT date_trunc('minute', created_at) AS minute, count(*) FROM chat_messages "
              "WHERE account_id = %s AND created_at >= %s AND created_at < %s + interval '1 day' "
              "GROUP BY 1 ORDER BY 1")

EARLIER = ("ALTER TABLE chat_messages SET (timescaledb.enable_columnstore = true, "
           "timescaledb.segmentby = 'account_id', timescaledb.orderby = 'created_at DESC')")
DERIVED_SPARSE = ("bloom(platform, message_id, created_at), bloom(platform), bloom(message_id), "
                  "bloom(platform, created_at, user_id), bloom(user_id)")


def _one(cur: Any, sql: str, params: Any = None) -> Any:
    cur.execute(sql, params)
    row = cur.fetchone()
    return row[0] if row else None


def _size(cur: Any) -> int:
    if _one(cur, "SELECT to_regclass('timescaledb_information.hypertables') IS NOT NULL") and \
            _one(cur, "SELECT count(*) FROM timescaledb_information.hypertables "
                      "WHERE hypertable_name = 'chat_messages'"):
        return int(_one(cur, "SELECT hypertable_size('chat_messages')"))
    return int(_one(cur, "SELECT pg_total_relation_size('chat_messages')"))


def _median_ms(cur: Any, sql: str, params: Any) -> float:
    cur.execute(sql, params)  # warm
    cur.fetchall()
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        cur.execute(sql, params)
        cur.fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


# How TimescaleDB names a chunk's copy of an index: "_hyper_1_5_chunk_<index>", and
# "5_<index>" for a constraint's; a compressed chunk's own: "compress_hyper_4_9_chunk_...".
_CHUNK_PREFIX = re.compile(r"^((compress)?_hyper_\d+_\d+_chunk_|\d+_)")


def plan(cur: Any, sql: str, params: Any) -> dict[str, Any]:
    """The indexes `sql` reads (a chunk's copy named as the hypertable's; a compressed
    chunk's own index as `columnstore: ...`) and whether it sorts rows after reading."""
    cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
    nodes, todo = [], [cur.fetchone()[0][0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    indexes = set()
    for node in nodes:
        name = node.get("Index Name")
        if name:
            short = _CHUNK_PREFIX.sub("", name)
            indexes.add(f"columnstore: {short}" if name.startswith("compress_") else short)
    # A sort of whole compressed batches by their first/last time is how TimescaleDB reads
    # them in order; a sort of the rows themselves is what the index saves.
    row_sorts = [n for n in nodes if n["Node Type"] == "Sort"
                 and not any("_ts_meta" in k for k in n.get("Sort Key", []))]
    return {"indexes": sorted(indexes), "sorts_rows": bool(row_sorts)}


def _reads(cur: Any, account: int, day: Any) -> dict[str, Any]:
    return {"last_100_ms": _median_ms(cur, LAST_100, (account,)),
            "per_minute_day_ms": _median_ms(cur, PER_MINUTE, (account, day, day)),
            "last_100_plan": plan(cur, LAST_100, (account,))}


def _median_account(cur: Any) -> tuple[int, int]:
    cur.execute("SELECT account_id, count(*) FROM chat_messages GROUP BY 1 ORDER BY 2, 1")
    ranked = cur.fetchall()
    account, rows = ranked[len(ranked) // 2]
    return int(account), int(rows)


class Database:
    """One database on `server`, migrated (without migration 7 unless `all_migrations`)
    and filled; an autocommit connection of its own."""

    def __init__(self, server: PostgresServer, work: Path, name: str, *, rows: int, accounts: int,
                 days: int, all_migrations: bool, chunk_interval: str | None = None) -> None:
        server.create_database(name)
        (work / name).mkdir()
        self.cfg: Config = make_config(work / name, pg_url=server.url(name), sections={
            "timescale": {"compress_after_hours": COMPRESS_AFTER_HOURS}})
        migrate(self.cfg.timescale, migrations=None if all_migrations else _before_7())
        self.conn = server.connect(name)
        self.cur = self.conn.cursor()
        self.cur.execute("SET statement_timeout = 0")
        if chunk_interval is not None:
            self.cur.execute("SELECT set_chunk_time_interval('chat_messages', %s::interval)",
                             (chunk_interval,))
        started = time.perf_counter()
        self.start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) \
            - timedelta(days=days + 14)
        fill_chat(self.cur, rows=rows, accounts=accounts, days=days, start=self.start)
        self.fill_secs = time.perf_counter() - started
        self.cur.execute("VACUUM ANALYZE chat_messages")
        self.rows = int(_one(self.cur, "SELECT count(*) FROM chat_messages"))
        self.account, self.account_rows = _median_account(self.cur)
        self.day = self.start + timedelta(days=days // 2)

    def bytes_per_row(self) -> float:
        return _size(self.cur) / self.rows

    def chunks(self) -> int:
        return int(_one(self.cur, "SELECT count(*) FROM show_chunks('chat_messages')"))

    def reads(self) -> dict[str, Any]:
        self.cur.execute("ANALYZE chat_messages")
        return _reads(self.cur, self.account, self.day)

    def close(self) -> None:
        self.conn.close()


def _before_7() -> list[Migration]:
    return [m for m in packaged_migrations() if m.version < 7]


def compress_in_time_order(db: Database) -> None:
    """Every chunk, oldest first, one transaction each (as the policy does)."""
    db.cur.execute("""SELECT format('%I.%I', chunk_schema, chunk_name) FROM timescaledb_information.chunks
                       WHERE hypertable_name = 'chat_messages' ORDER BY range_start""")
    for (chunk,) in db.cur.fetchall():
        db.cur.execute("SELECT compress_chunk(%s::regclass)", (chunk,))


def compress_earlier(db: Database) -> None:
    db.cur.execute(EARLIER)
    compress_in_time_order(db)


def compress_now(db: Database) -> None:
    ensure_compression(db.cfg.timescale)
    run_policies(db.cfg.timescale)


def _merging(interval: str, sparse: str, rebuild: bool) -> Callable[[Database], None]:
    def way(db: Database) -> None:
        db.cur.execute(EARLIER)
        db.cur.execute("ALTER TABLE chat_messages SET (timescaledb.sparse_index = %s, "
                       "timescaledb.compress_chunk_time_interval = %s)", (sparse, interval))
        compress_in_time_order(db)
        if rebuild:
            rebatch(db.conn, "chat_messages")
    return way


LEAN_SPARSE = "bloom(message_id), bloom(user_id)"
#: (name, chunk interval to write into, how to compress)
WAYS: list[tuple[str, str | None, Callable[[Database], None]]] = [
    ("earlier", None, compress_earlier),
    ("week chunks", "7 days", compress_earlier),
    ("merged", None, _merging("7 days", LEAN_SPARSE, rebuild=False)),
    ("now", None, compress_now),
    ("now, TimescaleDB's sparse indexes", None, _merging("7 days", DERIVED_SPARSE, rebuild=True)),
    ("merged into 14 days", None, _merging("14 days", LEAN_SPARSE, rebuild=True)),
    ("merged into 30 days", None, _merging("30 days", LEAN_SPARSE, rebuild=True)),
]


def compression_ways(server: PostgresServer, work: Path, rows: int, accounts: int,
                     days: int) -> dict[str, Any]:
    """(1): each way of compressing the same rows, in a database of its own."""
    out: dict[str, Any] = {"rows": rows, "accounts": accounts, "days": days, "ways": {}}
    for i, (name, interval, compress) in enumerate(WAYS):
        db = Database(server, work, f"ways{i}", rows=rows, accounts=accounts, days=days,
                      all_migrations=False, chunk_interval=interval)
        try:
            without_index = db.bytes_per_row()
            migrate(db.cfg.timescale)  # migration 7: the account index
            chunks_before = db.chunks()
            before = db.bytes_per_row()
            started = time.perf_counter()
            compress(db)
            secs = time.perf_counter() - started
            db.cur.execute("VACUUM ANALYZE chat_messages")
            after = db.bytes_per_row()
            out["ways"][name] = {
                "bytes_per_row_before": round(before, 1),
                "bytes_per_row_before_without_account_index": round(without_index, 1),
                "bytes_per_row_after": round(after, 1), "ratio": after / before,
                "ratio_to_without_account_index": after / without_index,
                "chunks_before": chunks_before, "chunks_after": db.chunks(),
                "compress_secs": round(secs, 1),
                "last_100_ms": _median_ms(db.cur, LAST_100, (db.account,))}
            if db.rows != rows:
                raise SystemExit(f"{name}: {db.rows} rows stored of {rows}")
        finally:
            db.close()
    return out


def reads(server: PostgresServer, work: Path, name: str, rows: int, accounts: int, days: int,
          timescaledb: bool) -> dict[str, Any]:
    """(2) on one backend: before and after migration 7, and compressed both ways."""
    db = Database(server, work, name, rows=rows, accounts=accounts, days=days, all_migrations=False)
    try:
        out: dict[str, Any] = {"rows": db.rows, "fill_secs": round(db.fill_secs, 1), "account": db.account,
                               "account_rows": db.account_rows,
                               "without_index": {"bytes_per_row": db.bytes_per_row(), **db.reads()}}
        started = time.perf_counter()
        applied = migrate(db.cfg.timescale)
        out["index_build_secs"] = round(time.perf_counter() - started, 1)
        assert [m.version for m in applied] == [7]
        out["with_index"] = {"bytes_per_row": db.bytes_per_row(), **db.reads()}
        if not timescaledb:
            return out
        started = time.perf_counter()
        compress_now(db)
        out["compress_secs"] = round(time.perf_counter() - started, 1)
        db.cur.execute("VACUUM ANALYZE chat_messages")
        out["compressed"] = {"bytes_per_row": db.bytes_per_row(), "chunks": db.chunks(), **db.reads()}
        out["compressed"]["ratio"] = out["compressed"]["bytes_per_row"] / out["with_index"]["bytes_per_row"]
    finally:
        db.close()
    earlier = Database(server, work, f"{name}_earlier", rows=rows, accounts=accounts, days=days,
                       all_migrations=True)
    try:
        started = time.perf_counter()
        compress_earlier(earlier)
        secs = time.perf_counter() - started
        earlier.cur.execute("VACUUM ANALYZE chat_messages")
        out["compressed_earlier"] = {"bytes_per_row": earlier.bytes_per_row(), "chunks": earlier.chunks(),
                                     "compress_secs": round(secs, 1), **earlier.reads()}
    finally:
        earlier.close()
    return out


def run(rows: int = 10_000_000, ratio_rows: int = 300_000, accounts: int = 1000,
        days: int = 30) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    result: dict[str, Any] = {"rows": rows, "ratio_rows": ratio_rows, "accounts": accounts, "days": days}
    try:
        tsdb = timescaledb_installed()
        if tsdb:
            with PostgresServer(work / "timescaledb", timescaledb=True) as server:
                result["compression"] = compression_ways(server, work, ratio_rows, accounts, days)
                result["timescaledb"] = reads(server, work, "tsdb_reads", rows, accounts, days,
                                              timescaledb=True)
        with PostgresServer(work / "plain", timescaledb=False) as server:
            result["plain"] = reads(server, work, "plain_reads", rows, accounts, days, timescaledb=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the reads part (2)")
    parser.add_argument("--ratio-rows", type=int, default=300_000, help="rows of the compression part (1)")
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    result = run(args.rows, args.ratio_rows, args.accounts, args.days)
    out = ROOT / "bench" / "results" / "bench_storage.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
