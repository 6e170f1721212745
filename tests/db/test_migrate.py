"""Migrations against a real server: idempotence, lock retries, concurrent runs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import (
    Migration,
    MigrationError,
    MigrationLockTimeout,
    migrate,
    packaged_migrations,
)
from lumio_ingestd.db.pool import Pool
from support import make_config

TABLES = {"chat_messages", "events", "event_children", "stream_sessions",
          "bsky_records", "jetstream_cursor", "schema_migrations"}

ALTER = Migration(9001, "test_alter_chat",
                  "ALTER TABLE chat_messages ADD COLUMN test_flag boolean NOT NULL DEFAULT false")


def _cfg(tmp_path: Path, url: str, **timescale: object) -> Config:
    base: dict[str, object] = {"migration_lock_timeout_secs": 0.3, "migration_retry_interval_secs": 0.3,
                               "migration_retries": 6}
    base.update(timescale)
    return make_config(tmp_path, pg_url=url, sections={"timescale": base})




def _tables(dsn_url: str) -> set[str]:
    with psycopg2.connect(dsn_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in cur.fetchall()}


def _ledger(dsn_url: str) -> list[tuple[int, str]]:
    with psycopg2.connect(dsn_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT version, name FROM schema_migrations ORDER BY version")
        return [(r[0], r[1]) for r in cur.fetchall()]


def test_migrate_twice_is_a_noop(tmp_path: Path, pg_url: str) -> None:
    cfg = _cfg(tmp_path, pg_url)
    first = migrate(cfg.timescale)
    assert [m.version for m in first] == [m.version for m in packaged_migrations()]
    assert _tables(pg_url) >= TABLES
    assert migrate(cfg.timescale) == []
    assert _ledger(pg_url) == [(m.version, m.name) for m in packaged_migrations()]


def test_schema_keys_match_the_contract(tmp_path: Path, pg_url: str) -> None:
    migrate(_cfg(tmp_path, pg_url).timescale)
    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute("""SELECT t.relname, array_agg(a.attname ORDER BY k.ord)
                         FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
                         CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
                         JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
                        WHERE i.indisprimary GROUP BY t.relname""")
        pkeys = dict(cur.fetchall())
    assert pkeys["events"] == ["id", "created_at"]
    assert pkeys["bsky_records"] == ["did", "collection", "rkey"]
    assert pkeys["jetstream_cursor"] == ["name"]
    assert "created_at" in pkeys["chat_messages"] and "message_id" in pkeys["chat_messages"]


def test_migration_settings_never_reach_the_pool(tmp_path: Path, pg_url: str) -> None:
    cfg = _cfg(tmp_path, pg_url, statement_timeout_secs=7)
    migrate(cfg.timescale)
    pool = Pool(cfg.timescale)
    try:
        with pool.transaction() as cur:
            cur.execute("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')")
            assert cur.fetchone() == ("7s", "0")
    finally:
        pool.close()


def _hold_lock(url: str, table: str, seconds: float) -> tuple[threading.Thread, threading.Event]:
    locked = threading.Event()

    def hold() -> None:
        conn = psycopg2.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")
                locked.set()
                cur.execute("SELECT pg_sleep(%s)", (seconds,))
            conn.commit()
        finally:
            conn.close()

    th = threading.Thread(target=hold, name="lock-holder")
    th.start()
    assert locked.wait(10)
    return th, locked


def test_lock_timeout_is_retried_until_the_lock_frees(tmp_path: Path, pg_url: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    # The shipped lock_timeout (5 s) against a lock held for ~7 s: the first
    # try gives up at 5 s, the retry queues behind the holder and succeeds.
    cfg = _cfg(tmp_path, pg_url, migration_lock_timeout_secs=5, migration_retry_interval_secs=1)
    migrate(cfg.timescale)
    holder, _ = _hold_lock(pg_url, "chat_messages", 7)
    started = time.monotonic()
    applied = migrate(cfg.timescale, migrations=[*packaged_migrations(), ALTER])
    elapsed = time.monotonic() - started
    holder.join(10)
    assert [m.version for m in applied] == [9001]
    assert elapsed >= 6.5  # it really waited for the holder
    assert any("retry 1/6" in r.getMessage() for r in caplog.records)
    with psycopg2.connect(pg_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT test_flag FROM chat_messages LIMIT 0")


def test_lock_held_past_the_budget_fails_and_applies_nothing(tmp_path: Path, pg_url: str) -> None:
    cfg = _cfg(tmp_path, pg_url, migration_retries=2)
    migrate(cfg.timescale)
    holder, _ = _hold_lock(pg_url, "chat_messages", 4)
    try:
        with pytest.raises(MigrationLockTimeout, match="after 2 retries"):
            migrate(cfg.timescale, migrations=[*packaged_migrations(), ALTER])
        assert 9001 not in [v for v, _ in _ledger(pg_url)]
    finally:
        holder.join(10)


def test_lock_budget_exhausted_makes_the_cli_exit_nonzero(tmp_path: Path, pg_url: str) -> None:
    cfg = _cfg(tmp_path, pg_url, migration_retries=1)
    # Another migrator holds the advisory lock for longer than our budget.
    blocker = psycopg2.connect(pg_url)
    try:
        with blocker.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (0x6C756D696F6D6967,))
        result = subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", cfg.path, "migrate"],
                                capture_output=True, text=True, timeout=60)
    finally:
        blocker.close()
    assert result.returncode == 69, result.stderr
    assert "another migrate is running" in result.stderr


def test_two_migrations_at_once_apply_the_schema_once(tmp_path: Path, pg_url: str) -> None:
    cfg = _cfg(tmp_path, pg_url, migration_retries=60)
    cmd = [sys.executable, "-m", "lumio_ingestd", "-c", cfg.path, "migrate"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert _ledger(pg_url) == [(m.version, m.name) for m in packaged_migrations()]
    assert _tables(pg_url) >= TABLES


def test_changed_migration_is_refused(tmp_path: Path, pg_url: str) -> None:
    cfg = _cfg(tmp_path, pg_url)
    migrate(cfg.timescale, migrations=[*packaged_migrations(), ALTER])
    edited = Migration(ALTER.version, ALTER.name, ALTER.sql + " -- edited")
    with pytest.raises(MigrationError, match="other contents"):
        migrate(cfg.timescale, migrations=[*packaged_migrations(), edited])


def test_failing_migration_rolls_back_whole(tmp_path: Path, pg_url: str) -> None:
    cfg = _cfg(tmp_path, pg_url)
    broken = Migration(9002, "broken", "CREATE TABLE half_done (x int); SELECT no_such_fn();")
    with pytest.raises(MigrationError, match="9002_broken failed: 42883"):
        migrate(cfg.timescale, migrations=[*packaged_migrations(), broken])
    assert "half_done" not in _tables(pg_url)
    assert 9002 not in [v for v, _ in _ledger(pg_url)]
    assert _tables(pg_url) >= TABLES  # what came before it stays applied
