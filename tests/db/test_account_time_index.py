""""The latest N rows of an account" (the dashboard's most common read) is served by an
index on both backends: chat by chat_messages_account_time_idx (migration 7), events by
events_account_time_idx (migration 1), on plain PostgreSQL and on TimescaleDB's
uncompressed chunks. Checked on the plan (EXPLAIN), not on a timing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2

from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.devkit.chat_rows import fill_chat
from support import make_config

LATEST_CHAT = "SELECT * FROM chat_messages WHERE account_id = %s ORDER BY created_at DESC LIMIT 100"
LATEST_EVENTS = "SELECT * FROM events WHERE account_id = %s ORDER BY created_at DESC LIMIT 100"


def plan_nodes(conn: psycopg2.extensions.connection, query: str, params: tuple[Any, ...]
               ) -> list[dict[str, Any]]:
    """Every node of the plan of `query`, depth first."""
    with conn.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + query, params)
        row = cur.fetchone()
    assert row is not None
    nodes: list[dict[str, Any]] = []
    todo = [row[0][0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    return nodes


def account_with_about(conn: psycopg2.extensions.connection, table: str, rows: int) -> int:
    """The account with the number of rows in `table` nearest to `rows`."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT account_id FROM {table} GROUP BY 1 ORDER BY abs(count(*) - %s), 1 LIMIT 1",
                    (rows,))
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def test_latest_rows_of_an_account_are_read_by_index(tmp_path: Path, backend_url: str) -> None:
    migrate(make_config(tmp_path, pg_url=backend_url).timescale)
    start = datetime.now(UTC) - timedelta(days=11)
    conn = psycopg2.connect(backend_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            fill_chat(cur, rows=20_000, accounts=100, days=10, start=start)
            cur.execute("""INSERT INTO events (id, created_at, account_id, platform, type, external_id,
                                              user_id)
                           SELECT gen_random_uuid(), %s + random() * interval '10 days', 1 + i %% 20,
                                  'twitch', 'channel.follow', 'f' || i, 'u' || i
                             FROM generate_series(1, 20000) i""", (start,))
            cur.execute("ANALYZE chat_messages")
            cur.execute("ANALYZE events")
        for query, table, index in ((LATEST_CHAT, "chat_messages", "chat_messages_account_time_idx"),
                                    (LATEST_EVENTS, "events", "events_account_time_idx")):
            # An account with three times the rows asked for, a few percent of the table: the
            # dashboard's typical case. (All of an account with fewer rows than the limit is
            # read and sorted, and the busiest ones are found faster by walking back in time.)
            nodes = plan_nodes(conn, query, (account_with_about(conn, table, 300),))
            used = {str(n["Index Name"]) for n in nodes if "Index Name" in n}
            # On a hypertable each chunk has its own copy, named after the chunk and the index.
            assert any(name == index or name.endswith(f"_{index}") for name in used), (table, used)
            assert not [n for n in nodes if n["Node Type"] == "Sort"], (table, nodes)  # read in order
    finally:
        conn.close()
