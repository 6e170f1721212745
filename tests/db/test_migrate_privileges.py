"""`migrate` and the daemon's writes as a role with only the privileges the docs list.

The role is made by the shipped script (deploy/database-roles.sql, run with
psql by the server's superuser, as an operator would): no superuser, no
pg_read_all_settings. Migrations must not read settings only those may read
(shared_preload_libraries), on plain PostgreSQL and with TimescaleDB
preloaded, where the tables become hypertables owned by the role.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.chat.store import insert_chat
from lumio_ingestd.db.compression import ensure_compression, run_policies
from lumio_ingestd.db.migrate import EARLIER_CHECKSUMS, MigrationError, migrate, packaged_migrations
from lumio_ingestd.devkit.chat_rows import fill_chat
from lumio_ingestd.devkit.servers import find_pg_bindir, timescaledb_installed
from support import ROOT, make_config
from support.chat import make_messages
from support.harness import PostgresServer
from support.timescale import NEEDS_TIMESCALEDB

ROLES_SQL = ROOT / "deploy" / "database-roles.sql"
ROLE = "lumio_app"
DB = "lumio"


def _server(tmp_path: Path, timescaledb: bool) -> PostgresServer:
    return PostgresServer(tmp_path / "pg", timescaledb=timescaledb)


@pytest.fixture(params=["postgresql", "timescaledb"])
def role_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PostgresServer]:
    """A private server with database `lumio` and the role the shipped script makes."""
    if request.param == "timescaledb" and not timescaledb_installed():
        pytest.skip(NEEDS_TIMESCALEDB)
    with _server(tmp_path, request.param == "timescaledb") as server:
        server.create_database(DB)
        result = subprocess.run(
            [str(find_pg_bindir() / "psql"), "-X", "-q", "-h", server.host, "-p", str(server.port),
             "-U", server.user, "-d", "postgres", "-v", f"db={DB}", "-v", f"role={ROLE}",
             "-f", str(ROLES_SQL)], capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        yield server


def _url(server: PostgresServer) -> str:
    return f"postgresql://{ROLE}@{server.host}:{server.port}/{DB}"


def _one(server: PostgresServer, query: str) -> object:
    conn = server.connect(DB)
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            row = cur.fetchone()
            return row[0] if row else None
    finally:
        conn.close()


def test_migrate_needs_only_the_documented_privileges(tmp_path: Path, role_server: PostgresServer,
                                                      request: pytest.FixtureRequest) -> None:
    # The role is as unprivileged as the docs say.
    assert _one(role_server, f"SELECT rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles "
                             f"WHERE rolname = '{ROLE}'") is False
    assert _one(role_server, f"SELECT pg_has_role('{ROLE}', 'pg_read_all_settings', 'MEMBER')") is False

    cfg = make_config(tmp_path, pg_url=_url(role_server))
    applied = migrate(cfg.timescale)
    assert [m.version for m in applied] == [m.version for m in packaged_migrations()]
    assert migrate(cfg.timescale) == []

    assert _one(role_server, "SELECT tableowner FROM pg_tables WHERE tablename = 'chat_messages'") == ROLE
    assert _one(role_server, "SELECT indisvalid FROM pg_index "
                             "WHERE indexrelid = to_regclass('chat_messages_account_time_idx')") is True
    hypertables = _one(role_server, "SELECT count(*) FROM pg_extension WHERE extname = 'timescaledb'")
    if request.node.callspec.params["role_server"] == "timescaledb":
        assert hypertables == 1
        assert _one(role_server, "SELECT array_agg(hypertable_name::text ORDER BY 1) "
                                 "FROM timescaledb_information.hypertables") == \
            ["chat_messages", "events", "stream_stats"]
    else:
        assert hypertables == 0

    # The daemon's chat write with the same role: COPY through a temporary staging table.
    msgs = make_messages(20)
    conn = psycopg2.connect(host=role_server.host, port=role_server.port, user=ROLE, dbname=DB)
    try:
        with conn, conn.cursor() as cur:
            assert insert_chat(cur, msgs) == 20
        with conn, conn.cursor() as cur:
            assert insert_chat(cur, msgs) == 0
    finally:
        conn.close()
    assert _one(role_server, "SELECT count(*) FROM chat_messages") == 20


def test_index_build_and_chunk_merging_on_a_filled_table_as_the_role(
        tmp_path: Path, role_server: PostgresServer, request: pytest.FixtureRequest) -> None:
    """Migration 7 (an online index build) on a table with rows, and on TimescaleDB with
    compressed chunks merged and rebatched by the daemon's compression, all as the role."""
    timescaledb = request.node.callspec.params["role_server"] == "timescaledb"
    cfg = make_config(tmp_path, pg_url=_url(role_server),
                      sections={"timescale": {"compress_after_hours": 300}})
    migrate(cfg.timescale, migrations=[m for m in packaged_migrations() if m.version < 7])
    conn = psycopg2.connect(host=role_server.host, port=role_server.port, user=ROLE, dbname=DB)
    try:
        with conn, conn.cursor() as cur:
            fill_chat(cur, rows=6000, accounts=20, days=10, start=datetime.now(UTC) - timedelta(days=25))
    finally:
        conn.close()
    day_chunks = _one(role_server, "SELECT count(*) FROM timescaledb_information.chunks "
                                   "WHERE hypertable_name = 'chat_messages'") if timescaledb else 0
    state = ensure_compression(cfg.timescale)
    done = run_policies(cfg.timescale)
    if timescaledb:
        assert done["chat_messages"] == day_chunks
        chunks = _one(role_server, "SELECT count(*) FROM timescaledb_information.chunks "
                                   "WHERE hypertable_name = 'chat_messages' AND is_compressed")
        assert chunks == 2  # ten and a bit days, merged into chunks of up to seven
    else:
        assert state.policies == {} and done == {}

    assert [m.version for m in migrate(cfg.timescale)] == [7]
    assert _one(role_server, "SELECT indisvalid FROM pg_index "
                             "WHERE indexrelid = to_regclass('chat_messages_account_time_idx')") is True
    if timescaledb:
        assert _one(role_server, "SELECT count(*) FROM pg_index WHERE indexrelid::regclass::text "
                                 "LIKE '%chunk_chat_messages_account_time_idx'") == chunks
    assert _one(role_server, "SELECT count(*) FROM chat_messages") == 6000


def test_a_database_migrated_with_the_earlier_files_is_accepted(tmp_path: Path,
                                                                 private_pg: PostgresServer) -> None:
    """2 and 5 changed only in how they detect TimescaleDB; a database that applied the
    earlier files must not be refused as "applied with other contents"."""
    private_pg.create_database(DB)
    cfg = make_config(tmp_path, pg_url=private_pg.url(DB))
    migrate(cfg.timescale)
    conn = private_pg.connect(DB)
    try:
        with conn.cursor() as cur:
            for version, earlier in EARLIER_CHECKSUMS.items():
                cur.execute("UPDATE schema_migrations SET checksum = %s WHERE version = %s",
                            (next(iter(earlier)), version))
                assert cur.rowcount == 1
    finally:
        conn.close()
    assert migrate(cfg.timescale) == []
    # Any other change is still refused.
    conn = private_pg.connect(DB)
    try:
        with conn.cursor() as cur:
            cur.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 2")
    finally:
        conn.close()
    with pytest.raises(MigrationError, match="other contents"):
        migrate(cfg.timescale)
