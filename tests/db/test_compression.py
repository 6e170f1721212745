"""Compression of chat_messages and events on a real TimescaleDB (and its absence on
plain PostgreSQL): the settings, the policies, running them, and what storage reports."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from lumio_ingestd.config import Config
from lumio_ingestd.db.compression import ensure_compression, policy_jobs, rebatch, run_policies, storage
from lumio_ingestd.db.errors import classify
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.devkit.chat_rows import fill_chat
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


# What the earlier release set: segmenting and order, no merging, TimescaleDB's own sparse indexes.
EARLIER_SETTINGS = ("ALTER TABLE chat_messages SET (timescaledb.enable_columnstore = true, "
                    "timescaledb.segmentby = 'account_id', timescaledb.orderby = 'created_at DESC')")


def _one(url: str, query: str, params: tuple[object, ...] = ()) -> Any:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(query, params)
        row = cur.fetchone()
    return row[0] if row else None


def _chat_chunks(url: str) -> list[tuple[str, timedelta, bool]]:
    """(chunk, its time range, compressed) of chat_messages, oldest first."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("""SELECT format('%I.%I', chunk_schema, chunk_name), range_end - range_start,
                              is_compressed
                         FROM timescaledb_information.chunks WHERE hypertable_name = 'chat_messages'
                        ORDER BY range_start""")
        return [(str(r[0]), r[1], bool(r[2])) for r in cur.fetchall()]


def _surplus_batches(url: str) -> int:
    """Batches of compressed chat beyond one per account and 1,000 rows, per chunk."""
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("""SELECT format('%I.%I', z.schema_name, z.table_name)
                         FROM _timescaledb_catalog.chunk u JOIN _timescaledb_catalog.chunk z
                           ON z.id = u.compressed_chunk_id
                         JOIN _timescaledb_catalog.hypertable h ON h.id = u.hypertable_id
                        WHERE h.table_name = 'chat_messages'""")
        surplus = 0
        for (compressed,) in cur.fetchall():
            cur.execute(f"SELECT sum(b - ceil(n / 1000.0)) FROM (SELECT count(*) AS b, "
                        f"sum(_ts_meta_count) AS n FROM {compressed} GROUP BY account_id) s")
            row = cur.fetchone()
            assert row is not None
            surplus += int(row[0])
    return surplus


def _rows_digest(url: str) -> str:
    return str(_one(url, "SELECT md5(string_agg(message_id || created_at::text || extras::text, ',' "
                         "ORDER BY message_id)) FROM chat_messages"))


def test_day_chunks_merge_into_weeks_and_take_fewer_bytes_than_before(
        tmp_path: Path, timescale_url: str, pg_server: PostgresServer) -> None:
    """The same realistic chat twice: compressed as the earlier release did (a day chunk is
    a compressed chunk, with a batch per account and day), and by the daemon now (merged
    into chunks of up to seven days, each account's batches rebuilt). The second takes
    fewer bytes per uncompressed byte, and its storage figures are the relations' sizes."""
    earlier_db = f"t_earlier_{uuid.uuid4().hex[:10]}"
    pg_server.create_database(earlier_db)
    try:
        earlier_url = pg_server.url(earlier_db)
        start = datetime.now(UTC) - timedelta(days=31)
        before: dict[str, int] = {}
        for url in (timescale_url, earlier_url):
            migrate(make_config(tmp_path, pg_url=url).timescale)
            with psycopg2.connect(url) as conn, conn.cursor() as cur:
                fill_chat(cur, rows=30_000, accounts=200, days=14, start=start)
            before[url] = int(_one(url, "SELECT hypertable_size('chat_messages')"))
        digest = _rows_digest(timescale_url)
        day_chunks = len(_chat_chunks(timescale_url))
        assert day_chunks >= 14 and _rows_digest(earlier_url) == digest

        with psycopg2.connect(earlier_url) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(EARLIER_SETTINGS)
                cur.execute("SELECT count(compress_chunk(c)) FROM show_chunks('chat_messages') c")
        cfg = _cfg(tmp_path, timescale_url, 300)
        ensure_compression(cfg.timescale)
        assert run_policies(cfg.timescale)["chat_messages"] == day_chunks

        merged = _chat_chunks(timescale_url)
        assert all(compressed and span <= timedelta(days=7) for _c, span, compressed in merged), merged
        assert len(merged) == -(-day_chunks // 7)  # 7 day chunks to a compressed one
        assert _surplus_batches(timescale_url) == 0  # rebuilt: one batch per account and 1,000 rows
        assert _rows_digest(timescale_url) == digest

        ratio = {url: _one(url, "SELECT hypertable_size('chat_messages')") / before[url]
                 for url in (timescale_url, earlier_url)}
        assert ratio[timescale_url] < ratio[earlier_url], ratio

        with psycopg2.connect(timescale_url) as conn:
            chat = {s.table: s for s in storage(conn) or []}["chat_messages"]
        assert chat.compressed_chunks == len(merged) and chat.uncompressed_bytes == 0
        # The bytes the relations take now, not TimescaleDB's figures from before the rebuild.
        total = _one(timescale_url, "SELECT hypertable_size('chat_messages')")
        assert 0 < chat.compressed_after_bytes <= total

        # Nothing is fragmented any more: another run rebuilds nothing.
        assert rebatch_after_run(cfg) == 0
    finally:
        pg_server.drop_database(earlier_db)


def rebatch_after_run(cfg: Config) -> int:
    run_policies(cfg.timescale)
    with psycopg2.connect(cfg.timescale.dsn) as conn:
        conn.autocommit = True
        return rebatch(conn, "chat_messages")


def test_the_earlier_release_settings_gain_merging(tmp_path: Path, timescale_url: str,
                                                   pg_server: PostgresServer) -> None:
    """A database whose chat compression the earlier release set up (and compressed
    some chunks with) merges the chunks compressed from then on; chunks compressed
    before stay as they are. Settings made by hand are left alone."""
    cfg = _cfg(tmp_path, timescale_url, 300)
    migrate(cfg.timescale)
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        fill_chat(cur, rows=6000, accounts=20, days=10, start=datetime.now(UTC) - timedelta(days=26))
    chunks = _chat_chunks(timescale_url)
    with psycopg2.connect(timescale_url) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(EARLIER_SETTINGS)
            for chunk, _span, _compressed in chunks[:2]:
                cur.execute("SELECT compress_chunk(%s::regclass)", (chunk,))
    assert _settings(timescale_url)["chat_messages"] == ("account_id", "created_at DESC")
    ensure_compression(cfg.timescale)
    assert _one(timescale_url, """SELECT compress_interval_length::text
                                    FROM timescaledb_information.hypertable_columnstore_settings
                                   WHERE hypertable = 'chat_messages'::regclass""") == "7 days"
    run_policies(cfg.timescale)
    after = _chat_chunks(timescale_url)
    assert all(compressed for _c, _s, compressed in after)
    assert [c for c, _s, _z in after[:2]] == [c for c, _s, _z in chunks[:2]]  # as they were
    assert len(after) == 2 + -(-(len(chunks) - 2) // 7)  # the rest merged

    # Another order set by hand: left alone, no merging added.
    by_hand = f"t_by_hand_{uuid.uuid4().hex[:10]}"
    pg_server.create_database(by_hand)
    try:
        url = pg_server.url(by_hand)
        migrate(make_config(tmp_path, pg_url=url).timescale)
        with psycopg2.connect(url) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(EARLIER_SETTINGS.replace("created_at DESC", "created_at"))
        ensure_compression(_cfg(tmp_path, url, 300).timescale)
        assert _settings(url)["chat_messages"] == ("account_id", "created_at")
        assert _one(url, """SELECT compress_interval_length
                              FROM timescaledb_information.hypertable_columnstore_settings
                             WHERE hypertable = 'chat_messages'::regclass""") is None
    finally:
        pg_server.drop_database(by_hand)
