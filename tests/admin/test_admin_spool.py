"""`lumio-ingestd spool status|replay` against a real spool, real Redis and PostgreSQL.

The replay runs without the daemon, through the same handlers the daemon's
replayer uses, and refuses while another process holds the spool's lock.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import redis

import support
from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage, PlatformEvent
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.spool import Spool
from support import make_config

ROOT = support.ROOT


def cli(cfg: Config, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", str(cfg.path), "spool", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def fill_spool(cfg: Config) -> tuple[list[ChatMessage], list[PlatformEvent]]:
    base = datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC)
    chat = [ChatMessage.create(platform="kick", account_id=3 + i % 2, message_id=f"sp-{i}",
                               created_at=base + timedelta(seconds=i), user_id="u", text=f"t{i}")
            for i in range(5)]
    events = [PlatformEvent.new(account_id=4, platform="kick", type="kicks.gifted",
                                external_id=f"sp-ev-{i}", payload={"i": i},
                                created_at=datetime.now(UTC) - timedelta(minutes=1))
              for i in range(3)]
    spool = Spool(cfg.daemon.state_dir / "spool", 1 << 20, Metrics())
    spool.open()
    spool.append("chat", [m.to_entry() for m in chat[:3]])
    spool.append("event", [e.to_entry() for e in events])
    spool.append("chat", [m.to_entry() for m in chat[3:]])
    spool.close()
    return chat, events


def test_spool_status_and_replay_into_redis_refused_while_the_spool_is_held(
        tmp_path: Path, pg_url: str, redis_url: str) -> None:
    cfg = make_config(tmp_path, pg_url=pg_url, redis_url=redis_url)
    migrate(cfg.timescale)
    chat, events = fill_spool(cfg)

    status = json.loads(cli(cfg, "status", "--json").stdout)
    assert status["records"] == {"chat": 5, "event": 3} and status["held_by_pid"] is None
    assert status["oldest_created_at"] == "2026-02-03T04:05:06.000000Z"
    human = cli(cfg, "status")
    assert human.returncode == 0 and "5 chat, 3 event record(s)" in human.stdout

    holder = Spool(cfg.daemon.state_dir / "spool", 1 << 20, Metrics())
    holder.open()  # as a running daemon holds it
    try:
        refused = cli(cfg, "replay")
        assert refused.returncode == 75, refused.stderr
        assert "in use by another process" in refused.stderr and f"pid {os.getpid()}" in refused.stderr
        assert json.loads(cli(cfg, "status", "--json").stdout)["held_by_pid"] == os.getpid()
    finally:
        holder.close()

    result = cli(cfg, "replay")
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)["spool_replay"]
    assert receipt["replayed"] == {"chat": 5, "event": 3} and receipt["error"] is None
    assert receipt["pending_bytes_before"] > 0 and receipt["pending_bytes_after"] == 0
    client = redis.Redis.from_url(redis_url)
    buffered = client.lrange(rediskeys.chat_buffer(3), 0, -1) + client.lrange(rediskeys.chat_buffer(4), 0, -1)
    assert sorted(buffered) == sorted(m.to_entry() for m in chat)  # each once
    assert client.lrange(rediskeys.events_deadletter(4), 0, -1) == [e.to_entry() for e in events]
    client.close()
    after = json.loads(cli(cfg, "status", "--json").stdout)
    assert after["records"] == {"chat": 0, "event": 0} and after["pending_bytes"] == 0
    # Replaying an empty spool is a no-op, not an error.
    again = json.loads(cli(cfg, "replay").stdout)["spool_replay"]
    assert again["replayed"] == {"chat": 0, "event": 0}


def test_spool_replay_with_redis_down_stores_in_the_database_once(
        tmp_path: Path, pg_url: str, pg_dsn: str) -> None:
    cfg = make_config(tmp_path, pg_url=pg_url, redis_url=f"redis://127.0.0.1:{closed_port()}/0",
                      sections={"redis": {"connect_timeout_secs": 1, "socket_timeout_secs": 1}})
    migrate(cfg.timescale)
    chat, events = fill_spool(cfg)
    result = cli(cfg, "replay")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["spool_replay"]["replayed"] == {"chat": 5, "event": 3}
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT message_id FROM chat_messages")
        assert Counter(r[0] for r in cur.fetchall()) == Counter(m.message_id for m in chat)
        cur.execute("SELECT external_id FROM events")
        assert Counter(r[0] for r in cur.fetchall()) == Counter(e.external_id for e in events)
    conn.close()


def test_spool_replay_with_both_down_exits_69_and_keeps_everything(tmp_path: Path) -> None:
    port = closed_port()
    cfg = make_config(tmp_path, pg_url=f"postgresql://lumio@127.0.0.1:{port}/lumio",
                      redis_url=f"redis://127.0.0.1:{port}/0",
                      sections={"redis": {"connect_timeout_secs": 1, "socket_timeout_secs": 1},
                                "timescale": {"connect_timeout_secs": 2, "acquire_timeout_secs": 2}})
    fill_spool(cfg)
    before = json.loads(cli(cfg, "status", "--json").stdout)
    result = cli(cfg, "replay")
    assert result.returncode == 69, result.stderr
    receipt = json.loads(result.stdout)["spool_replay"]
    assert receipt["error"] and receipt["replayed"] == {"chat": 0, "event": 0}
    after = json.loads(cli(cfg, "status", "--json").stdout)
    assert after["records"] == before["records"] == {"chat": 5, "event": 3}
