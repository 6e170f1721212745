"""Online migrations (`-- migrate: online`, lumio_ingestd/db/online_index.py): the index of
migration 7 is built while chat_messages takes writes, on a plain table (CONCURRENTLY)
and on a hypertable (one committed transaction per chunk), and an index an interrupted
build left invalid is built again."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import Migration, migrate, packaged_migrations
from lumio_ingestd.db.online_index import parse
from lumio_ingestd.devkit.chat_rows import fill_chat
from support import make_config
from support.harness import PostgresServer, wait_until

INDEX = "chat_messages_account_time_idx"


def _cfg(tmp_path: Path, url: str) -> Config:
    # A lock wait long enough to be seen, and no retry: a test that waits on one fails.
    return make_config(tmp_path, pg_url=url, sections={"timescale": {
        "migration_lock_timeout_secs": 30, "migration_retries": 0}})


def _before_7() -> list[Migration]:
    return [m for m in packaged_migrations() if m.version < 7]


def _one(url: str, query: str, params: tuple[object, ...] = ()) -> object:
    conn = psycopg2.connect(url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(query, params)
            row = cur.fetchone()
        return row[0] if row else None
    finally:
        conn.close()


def _valid(url: str) -> object:
    return _one(url, "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (INDEX,))


def _migrate_waits_on_a_lock(url: str) -> bool:
    return bool(_one(url, "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = "
                          "'lumio-ingestd/migrate' AND wait_event_type = 'Lock'"))


class _Migrating:
    """`migrate` in a thread of its own (what it applied, or what it raised)."""

    def __init__(self, cfg: Config) -> None:
        self.applied: list[Migration] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(cfg,), name="test-migrate")
        self.thread.start()

    def _run(self, cfg: Config) -> None:
        try:
            self.applied = migrate(cfg.timescale)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def join(self) -> list[Migration]:
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        assert self.applied is not None
        return self.applied


def _insert(url: str, at: datetime, message_id: str) -> None:
    """One chat row in a transaction of its own that waits at most 2 s for any lock."""
    conn = psycopg2.connect(url, options="-c lock_timeout=2000")
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO chat_messages (account_id, platform, message_id, created_at) "
                        "VALUES (1, 'twitch', %s, %s)", (message_id, at))
    finally:
        conn.close()


def test_plain_table_takes_writes_while_its_index_is_built(tmp_path: Path) -> None:
    """CONCURRENTLY waits for the writer open when it starts, and a later writer does not
    queue behind it (a plain CREATE INDEX's SHARE lock would hold it off)."""
    with PostgresServer(tmp_path / "plain", timescaledb=False) as server:
        server.create_database("lumio")
        url = server.url("lumio")
        cfg = _cfg(tmp_path, url)
        migrate(cfg.timescale, migrations=_before_7())
        now = datetime.now(UTC)
        with psycopg2.connect(url) as conn, conn.cursor() as cur:
            fill_chat(cur, rows=2000, accounts=10, days=2, start=now - timedelta(days=3))
        open_writer = psycopg2.connect(url)
        running: _Migrating | None = None
        try:
            with open_writer.cursor() as cur:  # a flush under way when migrate starts
                cur.execute("INSERT INTO chat_messages (account_id, platform, message_id, created_at) "
                            "VALUES (1, 'twitch', 'open', now())")
            running = _Migrating(cfg)
            assert wait_until(lambda: _migrate_waits_on_a_lock(url), 20)
            _insert(url, now, "later")  # LockNotAvailable here: writes wait for the build
            open_writer.commit()
        finally:
            open_writer.close()  # frees a migrate still waiting, so that it ends either way
            if running is not None:
                running.thread.join(60)
        assert running is not None and [m.version for m in running.join()] == [7]
        assert _valid(url) is True
        assert _one(url, "SELECT count(*) FROM chat_messages") == 2002


def test_hypertable_index_is_committed_chunk_by_chunk(tmp_path: Path, timescale_url: str) -> None:
    """While the build waits for a writer on the newest chunk, the older chunks have their
    index committed already and take writes (one transaction for all would hold them)."""
    cfg = _cfg(tmp_path, timescale_url)
    migrate(cfg.timescale, migrations=_before_7())
    start = datetime.now(UTC) - timedelta(days=4)
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        fill_chat(cur, rows=4000, accounts=10, days=3, start=start)
        cur.execute("""SELECT format('%I.%I', chunk_schema, chunk_name) FROM timescaledb_information.chunks
                        WHERE hypertable_name = 'chat_messages' ORDER BY range_start""")
        chunks = [str(r[0]) for r in cur.fetchall()]
    assert len(chunks) >= 3
    oldest, newest = chunks[0], chunks[-1]
    open_writer = psycopg2.connect(timescale_url)
    running: _Migrating | None = None
    try:
        with open_writer.cursor() as cur:  # a writer on the newest chunk alone
            cur.execute(f"LOCK TABLE {newest} IN ROW EXCLUSIVE MODE")
        running = _Migrating(cfg)

        def oldest_indexed() -> bool:
            return bool(_one(timescale_url, "SELECT count(*) > 0 FROM pg_index WHERE indrelid = %s::regclass "
                                            "AND indexrelid::regclass::text LIKE %s", (oldest, f"%{INDEX}")))

        assert wait_until(lambda: _migrate_waits_on_a_lock(timescale_url) and oldest_indexed(), 20)
        _insert(timescale_url, start + timedelta(hours=1), "into-the-oldest")
        open_writer.commit()
    finally:
        open_writer.close()
        if running is not None:
            running.thread.join(60)
    assert running is not None and [m.version for m in running.join()] == [7]
    assert _valid(timescale_url) is True
    per_chunk = _one(timescale_url, "SELECT count(*) FROM pg_index WHERE indexrelid::regclass::text LIKE %s",
                     (f"%chunk_{INDEX}",))
    assert per_chunk == len(chunks)
    assert _one(timescale_url, "SELECT count(*) FROM chat_messages") == 4001


def test_an_index_left_invalid_is_built_again(tmp_path: Path, backend_url: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    cfg = make_config(tmp_path, pg_url=backend_url)
    migrate(cfg.timescale)
    # What an interrupted build leaves: the index there but invalid, no ledger row.
    conn = psycopg2.connect(backend_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", (INDEX,))
            cur.execute("DELETE FROM schema_migrations WHERE version = 7")
    finally:
        conn.close()
    assert _valid(backend_url) is False
    with caplog.at_level(logging.WARNING, logger="lumio_ingestd.db.online_index"):
        assert [m.version for m in migrate(cfg.timescale)] == [7]
    assert _valid(backend_url) is True
    assert any("left invalid" in r.getMessage() for r in caplog.records)


def test_an_online_migration_holds_index_builds_only() -> None:
    assert [i.name for i in parse("-- migrate: online\nCREATE INDEX a_idx ON t (x, y DESC);\n"
                                  "CREATE INDEX b_idx ON t (z) WHERE z IS NOT NULL;")] == ["a_idx", "b_idx"]
    for bad in ("-- migrate: online\nALTER TABLE t ADD COLUMN c int;",
                "-- migrate: online\nCREATE UNIQUE INDEX a_idx ON t (x);",
                "-- migrate: online\n-- nothing"):
        with pytest.raises(ValueError):
            parse(bad)
