"""TimescaleDB in the tests: what a test that needs it says where it is missing, and
compressing every chunk of chat_messages and events at once (no policy, no wait)."""

from __future__ import annotations

import psycopg2

from lumio_ingestd.db.compression import TABLES, enable_columnstore

NEEDS_TIMESCALEDB = (
    "needs TimescaleDB, which is not installed into this PostgreSQL (no timescaledb.so in "
    "`pg_config --pkglibdir`); install it (Timescale's packages, or a build from source) "
    "to run this test"
)


def compress_all(url: str) -> int:
    """Compress every chunk of both tables with the daemon's settings (`compress_chunk`,
    whatever the chunks' age); returns how many chunks are compressed afterwards."""
    conn = psycopg2.connect(url)
    try:
        conn.autocommit = True
        for table in TABLES:
            enable_columnstore(conn, table)
            with conn.cursor() as cur:
                cur.execute("SELECT count(compress_chunk(c, if_not_compressed => true)) "
                            "FROM show_chunks(%s) c", (table,))
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM timescaledb_information.chunks WHERE is_compressed "
                        "AND hypertable_name = ANY(%s)", (list(TABLES),))
            row = cur.fetchone()
        return int(row[0]) if row else 0
    finally:
        conn.close()
