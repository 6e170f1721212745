"""The chaos soak's PostgreSQL keeps every acknowledged commit across an immediate shutdown.

The soak counts a chat message as missing when it is not in the database
after a run of PostgreSQL restarts. That is only the daemon's fault if the
server keeps what it acknowledged: the test servers run with fsync and
synchronous_commit off (`-c` on their command line, which ALTER SYSTEM
cannot override), and then an immediate shutdown drops the last commits it
acknowledged. These tests pin the soak's server settings and its refusal to
run on a server that is not durable.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lumio_ingestd.devkit.servers import DevServerError, PostgresServer
from tools.soak import DURABLE_PG, require_durable

ROWS_PER_COMMIT = 100


def _acknowledged_then_immediate_restart(server: PostgresServer, secs: float) -> tuple[int, int]:
    """Commit batches for `secs`, stop immediately, start: (rows acknowledged, rows stored)."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE acked (batch int NOT NULL, i int NOT NULL)")
            batch, end = 0, time.monotonic() + secs
            while time.monotonic() < end:
                # autocommit: the commit is acknowledged when execute returns
                cur.execute("INSERT INTO acked SELECT %s, generate_series(1, %s)",
                            (batch, ROWS_PER_COMMIT))
                batch += 1
    finally:
        conn.close()
    server.stop("immediate")
    server.start()
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*), count(DISTINCT (batch, i)) FROM acked")
            stored, distinct = cur.fetchone() or (0, 0)
    finally:
        conn.close()
    assert stored == distinct, "a row stored twice"
    return batch * ROWS_PER_COMMIT, int(stored)


def test_the_soak_refuses_a_server_without_durability(tmp_path: Path) -> None:
    with PostgresServer(tmp_path / "pg") as server:
        # What the soak used to do: the server's `-c ...=off` still wins.
        conn = server.connect()
        try:
            with conn.cursor() as cur:
                for name in DURABLE_PG:
                    cur.execute(f"ALTER SYSTEM SET {name} = on")
                cur.execute("SELECT pg_reload_conf()")
        finally:
            conn.close()
        with pytest.raises(DevServerError, match=r"synchronous_commit=off \(from command line\)"):
            require_durable(server.url("postgres"))


def test_the_soak_server_keeps_every_acknowledged_commit_across_an_immediate_shutdown(
        tmp_path: Path) -> None:
    with PostgresServer(tmp_path / "pg", settings=DURABLE_PG) as server:
        require_durable(server.url("postgres"))
        acknowledged, stored = _acknowledged_then_immediate_restart(server, 1.0)
        assert acknowledged > 0
        assert stored == acknowledged, f"{acknowledged - stored} acknowledged rows lost"
