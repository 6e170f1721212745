"""Compression of chat_messages and events on a real TimescaleDB (and its absence on
plain PostgreSQL): the settings, the policies, running them, and what storage reports."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.config import Config
from lumio_ingestd.db.compression import ensure_compression, policy_jobs, run_policies, storage
from lumio_ingestd.db.errors import classify
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.model import Kind
from support import make_config
from support.harness import PostgresServer
from support.timescale import compress_all


def _cfg(tmp_path: Path, url: str, hours: float) -> Config:
    return make_config(tmp_path, pg_url=url, sections={"timescale": {"compress_after_hours": hours}})


def _fill(url: str) -> None:
    """Chat and events of two accounts, 20 days old (compressible at 300 h) and 1 hour old."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("""INSERT INTO chat_messages (account_id, platform, message_id, created_at, user_id, text)
                       SELECT 1 + i % 2, 'twitch', 'm' || i, now() - interval '20 days' + i * interval '1 s',
                              'u' || i % 7, 'hello ' || i
                         FROM generate_series(1, 2000) i""")
        cur.execute("""INSERT INTO chat_messages (account_id, platform, message_id, created_at, user_id, text)
                       SELECT 1, 'twitch', 'new' || i, now() - interval '1 hour', 'u1', 'x'
                         FROM generate_series(1, 10) i""")
        cur.execute("""INSERT INTO events (id, created_at, account_id, platform, type, user_id)
                       SELECT gen_random_uuid(), now() - interval '20 days' + i * interval '1 s',
                              1 + i % 2, 'twitch', 'follow', 'u' || i
                         FROM generate_series(1, 500) i""")


def _settings(url: str) -> dict[str, tuple[str, str]]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT hypertable::text, segmentby, orderby "
                    "FROM timescaledb_information.hypertable_columnstore_settings "
                    "WHERE hypertable::text IN ('chat_messages', 'events')")
        return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


def test_policies_set_up_and_run(tmp_path: Path, timescale_url: str) -> None:
    cfg = _cfg(tmp_path, timescale_url, 300)
    migrate(cfg.timescale)
    state = ensure_compression(cfg.timescale)
    assert state.timescaledb is not None and set(state.policies) == {"chat_messages", "events"}
    assert _settings(timescale_url) == {"chat_messages": ("account_id", "created_at DESC"),
                                        "events": ("account_id", "created_at DESC")}
    _fill(timescale_url)
    with psycopg2.connect(timescale_url) as conn:
        before = {s.table: s for s in storage(conn) or []}
    assert before["chat_messages"].compressed_chunks == 0
    assert before["chat_messages"].uncompressed_chunks >= 2 and before["chat_messages"].uncompressed_bytes > 0

    done = run_policies(cfg.timescale)
    assert done["chat_messages"] >= 1 and done["events"] >= 1
    with psycopg2.connect(timescale_url) as conn:
        after = {s.table: s for s in storage(conn) or []}
    chat = after["chat_messages"]
    assert chat.compressed_chunks == done["chat_messages"]
    assert chat.uncompressed_chunks == 1  # the last hour's chunk is younger than 300 h
    assert 0 < chat.compressed_after_bytes < chat.compressed_before_bytes
    assert after["events"].compressed_chunks == done["events"] and after["events"].uncompressed_chunks == 0
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM chat_messages")
        assert cur.fetchone() == (2010,)

    # again: nothing changes; another age replaces the policies; 0 removes them
    assert ensure_compression(cfg.timescale).policies == state.policies
    moved = ensure_compression(_cfg(tmp_path, timescale_url, 500).timescale)
    with psycopg2.connect(timescale_url) as conn:
        assert {t: after for t, (_job, after) in policy_jobs(conn).items()} == {
            "chat_messages": "500:00:00", "events": "500:00:00"}
    assert set(moved.policies) == {"chat_messages", "events"}
    assert ensure_compression(_cfg(tmp_path, timescale_url, 0).timescale).policies == {}
    with psycopg2.connect(timescale_url) as conn:
        assert policy_jobs(conn) == {}
    assert _settings(timescale_url)["chat_messages"] == ("account_id", "created_at DESC")


def test_plain_postgres_only_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with PostgresServer(tmp_path / "plain", timescaledb=False) as server:
        server.create_database("plain")
        cfg = _cfg(tmp_path, server.url("plain"), 300)
        migrate(cfg.timescale)
        with caplog.at_level(logging.WARNING, logger="lumio_ingestd.db.compression"):
            state = ensure_compression(cfg.timescale)
        assert state.timescaledb is None and state.policies == {}
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "compress_after_hours = 300" in warned[0], warned
        assert "not TimescaleDB" in warned[0]
        assert run_policies(cfg.timescale) == {}
        with server.connect("plain") as conn:
            assert storage(conn) is None
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lumio_ingestd.db.compression"):
            ensure_compression(_cfg(tmp_path, server.url("plain"), 0).timescale)
        assert not caplog.records  # off: nothing to say


def test_decompression_limit_is_refused_not_an_outage(tmp_path: Path, timescale_url: str) -> None:
    """SQLSTATE 53400 (too many rows of compressed chunks for one write) fails the same
    way on every retry: permanent, not a transient outage like the rest of class 53."""
    cfg = _cfg(tmp_path, timescale_url, 300)
    migrate(cfg.timescale)
    _fill(timescale_url)
    compress_all(timescale_url)
    conn = psycopg2.connect(timescale_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET timescaledb.max_tuples_decompressed_per_dml_transaction = 10")
            with pytest.raises(psycopg2.Error) as info:
                cur.execute("DELETE FROM chat_messages WHERE user_id = 'u3'")
    finally:
        conn.close()
    assert info.value.pgcode == "53400"
    assert isinstance(info.value, psycopg2.OperationalError)  # what psycopg2 makes of class 53
    assert classify(info.value).kind is Kind.PERMANENT
