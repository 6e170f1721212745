"""The daemon's compression timer against real servers: it sets compression up, runs
the policies itself (TimescaleDB's scheduler fails its runs on this build, see
docs/operating.rst, "Compression"), updates the gauges, and on plain PostgreSQL only
warns."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.config import Config
from lumio_ingestd.db.compression import policy_jobs
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.lifecycle.compression import CompressionWorker
from lumio_ingestd.metrics import Metrics
from support import make_config
from support.harness import PostgresServer, wait_until


def _cfg(tmp_path: Path, url: str, hours: float) -> Config:
    return make_config(tmp_path, pg_url=url, sections={"timescale": {"compress_after_hours": hours}})


def _old_chat(url: str) -> None:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("""INSERT INTO chat_messages (account_id, platform, message_id, created_at, text)
                       SELECT 1 + i % 3, 'twitch', 'm' || i,
                              now() - interval '20 days' + i * interval '1 min',
                              'hello ' || i FROM generate_series(1, 3000) i""")


def _metric(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_worker_compresses_what_is_due_and_reports_it(tmp_path: Path, timescale_url: str) -> None:
    cfg = _cfg(tmp_path, timescale_url, 300)
    migrate(cfg.timescale)
    _old_chat(timescale_url)
    metrics = Metrics()
    worker = CompressionWorker(cfg, metrics, interval_secs=3600)
    worker.start()
    try:
        assert wait_until(lambda: worker.turns >= 1, timeout=60)
    finally:
        worker.request_stop()
        assert worker.join(10)
    assert worker.state is not None and set(worker.state.policies) == {"chat_messages", "events"}
    assert worker.compressed["chat_messages"] >= 2
    assert _metric(metrics, "timescale_compression_runs_total", result="ok") == 1
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM timescaledb_information.chunks "
                    "WHERE hypertable_name = 'chat_messages' AND is_compressed")
        row = cur.fetchone()
    assert row is not None and _metric(metrics, "timescale_chunks", table="chat_messages",
                                       state="compressed") == row[0]
    assert row[0] < worker.compressed["chat_messages"]  # the day chunks merged
    after = _metric(metrics, "timescale_bytes", table="chat_messages", state="compressed_after")
    before = _metric(metrics, "timescale_bytes", table="chat_messages", state="compressed_before")
    assert 0 < after < before
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM chat_messages")
        assert cur.fetchone() == (3000,)


def test_migrate_command_sets_up_the_policies(tmp_path: Path, timescale_url: str) -> None:
    cfg = _cfg(tmp_path, timescale_url, 300)
    result = subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", cfg.path, "migrate"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "compression policies" in result.stderr
    with psycopg2.connect(timescale_url) as conn:
        assert {t: after for t, (_job, after) in policy_jobs(conn).items()} == {
            "chat_messages": "300:00:00", "events": "300:00:00"}


def test_worker_on_plain_postgres_warns_and_changes_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with PostgresServer(tmp_path / "plain", timescaledb=False) as server:
        server.create_database("plain")
        cfg = _cfg(tmp_path, server.url("plain"), 300)
        migrate(cfg.timescale)
        _old_chat(server.url("plain"))
        metrics = Metrics()
        worker = CompressionWorker(cfg, metrics, interval_secs=3600)
        with caplog.at_level(logging.WARNING):
            worker.start()
            try:
                assert wait_until(lambda: worker.turns >= 1, timeout=30)
            finally:
                worker.request_stop()
                assert worker.join(10)
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and "[timescale] compress_after_hours = 300" in warned[0], warned
        assert worker.compressed == {}
        assert _metric(metrics, "timescale_compression_runs_total", result="ok") == 0
        with server.connect("plain") as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM chat_messages")
            assert cur.fetchone() == (3000,)
            cur.execute("SELECT count(*) FROM pg_extension WHERE extname = 'timescaledb'")
            assert cur.fetchone() == (0,)
