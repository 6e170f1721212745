"""Retention, GDPR erasure and export, account dissolution, startup backfill,
each on seeded data, checking exactly what was deleted or exported and that
nothing else was touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest
import redis

from lumio_ingestd.config import Config
from lumio_ingestd.db.errors import PoolReentryError
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.db.pool import Cursor, Pool
from lumio_ingestd.lifecycle.backfill import backfill_pool, link_events_to_sessions, run_backfills
from lumio_ingestd.lifecycle.retention import run_retention
from lumio_ingestd.model import ChatMessage, EventChild, PlatformEvent
from lumio_ingestd.stores.rediskeys import (
    chat_buffer,
    chat_deadletter,
    chat_quarantine,
    events_deadletter,
    events_inflight,
)
from support import make_config
from support.harness.servers import PostgresServer, wait_until
from support.timescale import compress_all

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture
def cfg(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Config:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    c = make_config(tmp_path, pg_url=pg_server.url(dbname), redis_url=redis_url,
                    sections={"timescale": {"statement_timeout_secs": 1, "pool_size": 2}})
    migrate(c.timescale)
    return c


@pytest.fixture
def pool(cfg: Config) -> Iterator[Pool]:
    p = Pool(cfg.timescale)
    yield p
    p.close()


def _cli(cfg: Config, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", cfg.path, *args],
                          capture_output=True, text=True, timeout=120)


def chat(account: int, mid: str, user: str, at: datetime, platform: str = "twitch") -> ChatMessage:
    return ChatMessage.create(platform=platform, account_id=account, message_id=mid, created_at=at,
                              user_id=user, user_login=f"login{user}", text=f"hello {mid}")


def event(account: int, ext: str, user: str | None, at: datetime,
          recipients: tuple[str, ...] = ()) -> PlatformEvent:
    return PlatformEvent.new(account_id=account, platform="twitch", type="channel.subscription.gift",
                             payload={"n": len(recipients)}, created_at=at, external_id=ext,
                             user_id=user, children=tuple(EventChild("gift_recipient", r, f"r{r}")
                                                          for r in recipients))


def seed(cur: Cursor, chats: list[ChatMessage], events: list[PlatformEvent]) -> None:
    for m in chats:
        cur.execute("INSERT INTO chat_messages (account_id, platform, message_id, created_at, user_id,"
                    " user_login, display_name, text, extras) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)", m.row())
    for e in events:
        cur.execute("INSERT INTO events (id, created_at, account_id, platform, type, external_id, user_id,"
                    " payload) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                    (e.id, e.created_at, e.account_id, e.platform, e.type, e.external_id, e.user_id,
                     json.dumps(e.payload)))
        for i, c in enumerate(e.children):
            cur.execute("INSERT INTO event_children (event_id, event_created_at, ordinal, kind, user_id,"
                        " user_login) VALUES (%s,%s,%s,%s,%s,%s)",
                        (e.id, e.created_at, i, c.kind, c.user_id, c.user_login))


def rows(cur: Cursor, sql: str) -> set[tuple[object, ...]]:
    cur.execute(sql)
    return set(cur.fetchall())


# -- retention ---------------------------------------------------------------------


def test_retention_deletes_exactly_what_is_past_each_horizon(cfg: Config, pool: Pool,
                                                             compress: Callable[[str], int]) -> None:
    old_chat = [chat(1, f"old{i}", "u", NOW - timedelta(days=31, minutes=i)) for i in range(25)]
    new_chat = [chat(1, f"new{i}", "u", NOW - timedelta(days=29, minutes=i)) for i in range(5)]
    old_ev = [event(1, f"oe{i}", "u", NOW - timedelta(days=366), ("a", "b")) for i in range(3)]
    mid_ev = [event(1, "me", "u", NOW - timedelta(days=100), ("c",))]  # old for chat, not for events
    with pool.transaction() as cur:
        seed(cur, old_chat + new_chat, old_ev + mid_ev)
    compress(cfg.timescale.dsn)
    report = run_retention(pool, cfg, now=NOW, batch_size=7)  # several batches
    assert report.deleted == {"chat_messages": 25, "events": 3, "event_children": 6}
    with pool.transaction() as cur:
        assert rows(cur, "SELECT message_id FROM chat_messages") == {(m.message_id,) for m in new_chat}
        assert rows(cur, "SELECT external_id FROM events") == {("me",)}
        assert rows(cur, "SELECT user_id FROM event_children") == {("c",)}
    assert run_retention(pool, cfg, now=NOW).deleted == {"chat_messages": 0, "events": 0,
                                                         "event_children": 0}


def test_retention_cli_prints_what_it_deleted(cfg: Config, pool: Pool,
                                              compress: Callable[[str], int]) -> None:
    with pool.transaction() as cur:
        seed(cur, [chat(1, "x", "u", datetime.now(UTC) - timedelta(days=40)),
                   chat(1, "y", "u", datetime.now(UTC))], [])
    compress(cfg.timescale.dsn)
    result = _cli(cfg, "retention", "--once", "--batch-size", "1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["retention"]["deleted"]["chat_messages"] == 1
    assert _cli(cfg, "retention").returncode == 64  # --once is required


def test_retention_of_a_million_rows_leaves_the_pool_its_statement_timeout(cfg: Config, pool: Pool) -> None:
    # The rows sit in the 11 hours before the horizon: on TimescaleDB that is the
    # day's chunk straddling it, which is deleted in batches, not dropped.
    with pool.begin_unbounded() as cur:
        cur.execute("""INSERT INTO chat_messages (account_id, platform, message_id, created_at, text)
                       SELECT 1, 'twitch', 'm' || i, %s - make_interval(secs => i * 0.04), 'x'
                         FROM generate_series(1, 1000000) i""", (NOW - timedelta(days=30, seconds=1),))
        cur.execute("INSERT INTO chat_messages (account_id, platform, message_id, created_at) "
                    "VALUES (1, 'twitch', 'keep', %s)", (NOW,))
    result: dict[str, object] = {}

    def run() -> None:
        result["report"] = run_retention(pool, cfg, now=NOW, batch_size=50_000)

    worker = threading.Thread(target=run, name="retention-test")
    worker.start()
    try:
        # While retention runs (its own transactions are unbounded), the
        # pool's normal limit still cancels a runaway query.
        started = time.monotonic()
        with pytest.raises(psycopg2.Error) as info, pool.transaction() as cur:
            cur.execute("SELECT pg_sleep(5)")
        assert info.value.pgcode == "57014"
        assert time.monotonic() - started < 3
        assert worker.is_alive(), "retention finished before the concurrent query was cancelled"
    finally:
        worker.join(300)
    report = result["report"]
    assert getattr(report, "deleted")["chat_messages"] == 1_000_000  # noqa: B009
    with pool.transaction() as cur:
        assert rows(cur, "SELECT message_id FROM chat_messages") == {("keep",)}


# -- GDPR ----------------------------------------------------------------------------


def _redis_seed(r: redis.Redis, target: str) -> None:
    r.rpush(chat_buffer(1), chat(1, "rb1", target, NOW).to_entry(), chat(1, "rb2", "other", NOW).to_entry())
    r.rpush(chat_deadletter(2), chat(2, "rd1", target, NOW).to_entry())
    r.rpush(chat_quarantine(2), json.dumps({**json.loads(chat(2, "rq1", target, NOW).to_entry()),
                                            "reason": "permanent", "sqlstate": "22008"}))
    r.rpush(events_deadletter(1), event(1, "pe1", target, NOW).to_entry(),
            event(1, "pe2", "other", NOW, (target, "keepme")).to_entry())
    r.rpush(events_inflight(3, "host:1"), event(3, "pe3", target, NOW).to_entry())


def test_gdpr_erase_removes_the_user_everywhere_and_nothing_else(cfg: Config, pool: Pool,
                                                                 compress: Callable[[str], int]) -> None:
    target = "666"
    with pool.transaction() as cur:
        seed(cur,
             [chat(1, "c1", target, NOW), chat(2, "c2", target, NOW), chat(1, "c3", "other", NOW),
              chat(1, "c4", target, NOW, platform="kick")],
             [event(1, "e1", target, NOW, ("x",)), event(2, "e2", "other", NOW, (target, "y")),
              event(1, "e3", "other", NOW)])
    compress(cfg.timescale.dsn)
    r = redis.Redis.from_url(cfg.redis.url)
    _redis_seed(r, target)

    result = _cli(cfg, "gdpr-erase", "--platform", "twitch", "--user-id", target)
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)["erasure"]
    assert receipt == {"platform": "twitch", "user_id": target, "chat_messages": 2, "events": 1,
                       "event_children": 2, "redis_entries": 5, "redis_children": 1,
                       "refused_frames": 0, "refused_frames_pii": 0}
    with pool.transaction() as cur:
        assert rows(cur, "SELECT message_id FROM chat_messages") == {("c3",), ("c4",)}
        assert rows(cur, "SELECT external_id FROM events") == {("e2",), ("e3",)}
        assert rows(cur, "SELECT user_id FROM event_children") == {("y",)}
    assert [json.loads(x)["message_id"] for x in r.lrange(chat_buffer(1), 0, -1)] == ["rb2"]
    assert r.llen(chat_deadletter(2)) == 0 and r.llen(chat_quarantine(2)) == 0
    parked = [PlatformEvent.from_entry(x) for x in r.lrange(events_deadletter(1), 0, -1)]
    assert [(p.external_id, [c.user_id for c in p.children]) for p in parked] == [("pe2", ["keepme"])]
    assert r.llen(events_inflight(3, "host:1")) == 0


def test_export_by_user_and_by_account_streams_exactly_their_rows(
        cfg: Config, pool: Pool, tmp_path: Path, compress: Callable[[str], int]) -> None:
    target = "777"
    mine = [chat(5, f"m{i}", target, NOW + timedelta(seconds=i)) for i in range(55)]
    with pool.transaction() as cur:
        seed(cur, [*mine, chat(6, "o", "other", NOW), chat(6, "t6", target, NOW)],
             [event(5, "e5", target, NOW, ("r1",)), event(6, "e6", "other", NOW, (target,))])
        cur.execute("INSERT INTO stream_sessions (account_id, platform, started_at) VALUES (5, 'twitch', %s)",
                    (NOW,))
        cur.execute("INSERT INTO stream_stats (account_id, platform, ts, viewers_avg, viewers_max, "
                    "samples) VALUES (5, 'twitch', %s, 1, 1, 1)", (NOW,))
    compress(cfg.timescale.dsn)
    out = tmp_path / "user.jsonl"
    result = _cli(cfg, "export", "--platform", "twitch", "--user-id", target, "-o", str(out))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    by_table: dict[str, list[dict[str, object]]] = {}
    for obj in lines:
        by_table.setdefault(str(obj["table"]), []).append(obj)
    assert {o["message_id"] for o in by_table["chat_messages"]} == {m.message_id for m in mine} | {"t6"}
    assert [o["external_id"] for o in by_table["events"]] == ["e5"]
    assert [o["user_id"] for o in by_table["event_children"]] == [target]
    assert json.loads(result.stderr.strip().splitlines()[-1])["export"] == {
        "chat_messages": 56, "events": 1, "event_children": 1}

    result = _cli(cfg, "export", "--account", "5")
    assert result.returncode == 0, result.stderr
    tables = [json.loads(x)["table"] for x in result.stdout.splitlines()]
    assert tables.count("chat_messages") == 55 and tables.count("events") == 1
    assert tables.count("event_children") == 1 and tables.count("stream_sessions") == 1
    assert tables.count("stream_stats") == 1
    first = json.loads(result.stdout.splitlines()[0])
    assert first["created_at"].endswith("Z") and first["account_id"] == 5

    assert _cli(cfg, "export", "--platform", "twitch").returncode == 64
    assert _cli(cfg, "export").returncode == 64


def test_export_uses_a_server_side_cursor(cfg: Config, pool: Pool) -> None:
    import io

    from lumio_ingestd.lifecycle.gdpr import export

    with pool.transaction() as cur:
        seed(cur, [chat(9, f"m{i}", "u", NOW) for i in range(30)], [])
    seen: list[int] = []

    class Probe(io.StringIO):
        def write(self, s: str) -> int:
            # Ask the server, mid-stream, for the portal this export reads from.
            if not seen:
                with psycopg2.connect(cfg.timescale.dsn) as other, other.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_activity "
                                "WHERE query LIKE 'FETCH FORWARD 5 FROM %%lumio_export_0%%'")
                    row = cur.fetchone()
                    seen.append(row[0] if row else 0)
                other.close()
            return super().write(s)

    counts = export(pool, Probe(), account=9, itersize=5)
    assert counts["chat_messages"] == 30
    assert seen == [1]


# -- dissolution ------------------------------------------------------------------


def test_dissolve_account_deletes_its_rows_and_keys_only(cfg: Config, pool: Pool,
                                                         compress: Callable[[str], int]) -> None:
    with pool.transaction() as cur:
        seed(cur, [chat(4, "a", "u", NOW), chat(42, "b", "u", NOW)],
             [event(4, "x", "u", NOW, ("k",)), event(42, "y", "u", NOW, ("l",))])
        cur.execute("INSERT INTO stream_sessions (account_id, platform, started_at) VALUES "
                    "(4, 'twitch', %s), (42, 'twitch', %s)", (NOW, NOW))
        cur.execute("INSERT INTO stream_stats (account_id, platform, ts, viewers_avg, viewers_max, "
                    "samples) VALUES (4, 'twitch', %s, 1, 1, 1), (42, 'twitch', %s, 1, 1, 1)",
                    (NOW, NOW))
        cur.execute("INSERT INTO seventv_emote_sets (account_id, emote_set_id, version) VALUES "
                    "(4, 'set4', 1), (42, 'set42', 1)")
    compress(cfg.timescale.dsn)
    r = redis.Redis.from_url(cfg.redis.url)
    for key in (chat_buffer(4), chat_deadletter(4), events_deadletter(4), events_inflight(4, "h:1")):
        r.rpush(key, b"x")
    for key in (chat_buffer(42), events_deadletter(42)):
        r.rpush(key, b"y")
    r.set("lumio:instance:h:1", b"1")

    refused = _cli(cfg, "dissolve-account", "4")
    assert refused.returncode == 64 and "--yes" in refused.stderr
    with pool.transaction() as cur:
        assert rows(cur, "SELECT count(*) FROM chat_messages") == {(2,)}

    result = _cli(cfg, "dissolve-account", "4", "--yes")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dissolution"] == {
        "account_id": 4, "chat_messages": 1, "events": 1, "event_children": 1,
        "stream_sessions": 1, "stream_stats": 1, "seventv_emote_sets": 1, "redis_keys": 4}
    with pool.transaction() as cur:
        assert rows(cur, "SELECT account_id FROM chat_messages") == {(42,)}
        assert rows(cur, "SELECT account_id FROM events") == {(42,)}
        assert rows(cur, "SELECT user_id FROM event_children") == {("l",)}
        assert rows(cur, "SELECT account_id FROM stream_sessions") == {(42,)}
        assert rows(cur, "SELECT account_id FROM stream_stats") == {(42,)}
        assert rows(cur, "SELECT account_id FROM seventv_emote_sets") == {(42,)}
    keys = [k.decode() if isinstance(k, bytes) else k for k in r.keys("lumio:*")]
    assert sorted(keys) == sorted(
        [chat_buffer(42), events_deadletter(42), "lumio:instance:h:1"])


def test_admin_commands_exit_69_when_the_database_is_unreachable(
        tmp_path: Path, free_port: Callable[[], int]) -> None:
    c = make_config(tmp_path, pg_url=f"postgresql://postgres@127.0.0.1:{free_port()}/x",
                    sections={"timescale": {"connect_timeout_secs": 2}})
    result = _cli(c, "retention", "--once")
    assert result.returncode == 69, result.stderr
    assert "unavailable" in result.stderr


# -- backfill ------------------------------------------------------------------------


def test_backfill_links_events_to_their_sessions(cfg: Config, pool: Pool,
                                                 compress: Callable[[str], int]) -> None:
    inside, before, open_session = (event(1, "in", "u", NOW + timedelta(minutes=5)),
                                    event(1, "before", "u", NOW - timedelta(minutes=5)),
                                    event(1, "open", "u", NOW + timedelta(hours=3)))
    other_account = event(2, "other", "u", NOW + timedelta(minutes=5))
    with pool.transaction() as cur:
        seed(cur, [], [inside, before, open_session, other_account])
        cur.execute("""INSERT INTO stream_sessions (account_id, platform, started_at, ended_at) VALUES
                       (1, 'twitch', %s, %s), (1, 'twitch', %s, NULL) RETURNING id""",
                    (NOW, NOW + timedelta(hours=1), NOW + timedelta(hours=2)))
        first, second = (r[0] for r in cur.fetchall())
    compress(cfg.timescale.dsn)
    assert run_backfills(cfg) == {"link_events_to_sessions": 2}
    with pool.transaction() as cur:
        assert rows(cur, "SELECT external_id, stream_session_id FROM events") == {
            ("in", first), ("open", second), ("before", None), ("other", None)}


def test_backfill_pool_has_no_statement_timeout_and_refuses_a_nested_acquire(cfg: Config) -> None:
    bp = backfill_pool(cfg)
    try:
        with bp.transaction() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone() == ("0",)
            assert link_events_to_sessions(cur) == 0  # the helper takes the cursor it is given
            started = time.monotonic()
            with pytest.raises(PoolReentryError, match="pass that connection"), bp.transaction():
                pass
            assert time.monotonic() - started < 0.1
    finally:
        bp.close()


def test_the_daemon_runs_the_backfill_once_and_retention_on_its_own(cfg: Config, pool: Pool) -> None:
    from lumio_ingestd.lifecycle.backfill import StartupBackfill
    from lumio_ingestd.lifecycle.retention import RetentionWorker
    from lumio_ingestd.metrics import Metrics

    ev = event(1, "linked", "u", datetime.now(UTC))
    with pool.transaction() as cur:
        seed(cur, [chat(1, "old", "u", datetime.now(UTC) - timedelta(days=31)),
                   chat(1, "new", "u", datetime.now(UTC))], [ev])
        cur.execute("INSERT INTO stream_sessions (account_id, platform, started_at) VALUES (1, 'twitch', %s)",
                    (datetime.now(UTC) - timedelta(hours=1),))
    backfill, retention = StartupBackfill(cfg, Metrics()), RetentionWorker(pool, cfg, Metrics())
    backfill.start()
    retention.start()
    try:
        assert wait_until(lambda: backfill.results is not None and retention.turns >= 1, timeout=20)
        assert backfill.results == {"link_events_to_sessions": 1}
        with pool.transaction() as cur:
            assert rows(cur, "SELECT message_id FROM chat_messages") == {("new",)}
            assert rows(cur, "SELECT stream_session_id IS NOT NULL FROM events") == {(True,)}
    finally:
        for w in (backfill, retention):
            started = time.monotonic()
            w.request_stop()
            assert w.join(5) and time.monotonic() - started < 2  # idle waits end at once


# -- a heavy user across compressed chunks ---------------------------------------------


def test_lifecycle_of_a_user_with_150k_rows_is_exact(cfg: Config, pool: Pool,
                                                     compress: Callable[[str], int]) -> None:
    """Retention, export, erasure and dissolution on 325,000 chat rows over three days
    of chunks, two thirds of them one user's, the rest a crowd's in the same accounts.
    Compressed, erasing the user decompresses every batch of those accounts (the user
    shares each with the crowd): far more than TimescaleDB's default per-transaction
    limit of 100,000 rows. The results are the same both ways."""
    horizon = datetime.now(UTC) - timedelta(days=cfg.chat.retention_days)
    user = "CASE WHEN i %% 3 = 0 THEN 'crowd' || i %% 50 ELSE 'big' END"
    with pool.begin_unbounded() as cur:
        # Nothing within an hour of the horizon: the CLI's clock runs a little later.
        cur.execute(f"""INSERT INTO chat_messages
                            (account_id, platform, message_id, created_at, user_id, text)
                        SELECT 1 + i %% 2, 'twitch', 'o' || i, %s - make_interval(secs => 3600 + i * 0.5),
                               {user}, 'old message ' || i FROM generate_series(1, 100000) i""", (horizon,))
        cur.execute(f"""INSERT INTO chat_messages
                            (account_id, platform, message_id, created_at, user_id, text)
                        SELECT 1 + i %% 2, 'twitch', 'y' || i, %s + make_interval(secs => 3600 + i * 0.6),
                               {user}, 'young message ' || i FROM generate_series(1, 225000) i""", (horizon,))
        cur.execute("""INSERT INTO chat_messages (account_id, platform, message_id, created_at, user_id, text)
                       SELECT 3, 'twitch', 'x' || i, %s + make_interval(secs => -80000 + i * 80),
                              'small', 'other ' || i FROM generate_series(1, 2000) i
                        WHERE abs(-80000 + i * 80) > 3600""", (horizon,))
        small = cur.rowcount
        cur.execute("SELECT count(*) FROM chat_messages WHERE account_id = 3 AND created_at < %s",
                    (horizon,))
        row = cur.fetchone()
        small_old = int(row[0]) if row else 0
    assert 0 < small_old < small
    compress(cfg.timescale.dsn)

    result = _cli(cfg, "retention", "--once")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["retention"]["deleted"]["chat_messages"] == 100_000 + small_old

    result = _cli(cfg, "export", "--platform", "twitch", "--user-id", "big", "-o", os.devnull)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stderr.strip().splitlines()[-1])["export"]["chat_messages"] == 150_000

    result = _cli(cfg, "gdpr-erase", "--platform", "twitch", "--user-id", "big")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["erasure"]["chat_messages"] == 150_000

    result = _cli(cfg, "dissolve-account", "3", "--yes")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dissolution"]["chat_messages"] == small - small_old
    with pool.transaction() as cur:
        assert rows(cur, "SELECT user_id = 'big', count(*) FROM chat_messages GROUP BY 1") == {
            (False, 75_000)}


def test_retention_leaves_younger_compressed_chunks_compressed(tmp_path: Path, timescale_url: str) -> None:
    """Retention's batches are bounded by the horizon: they reach the one chunk that
    straddles it, not the compressed chunks after it. (Without the bound, each batch's
    outer scan decompressed every one of them into its uncompressed part.)"""
    c = make_config(tmp_path, pg_url=timescale_url)
    migrate(c.timescale)
    horizon = datetime.now(UTC) - timedelta(days=c.chat.retention_days)
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        cur.execute("""INSERT INTO chat_messages (account_id, platform, message_id, created_at, user_id)
                       SELECT 1 + i %% 3, 'twitch', 'm' || i,
                              %s + make_interval(secs => -250000 + i * 50), 'u'
                         FROM generate_series(1, 30000) i""", (horizon,))  # 17 days: 3 merged chunks
    compress_all(timescale_url)
    p = Pool(c.timescale)
    try:
        report = run_retention(p, c, batch_size=1000)
    finally:
        p.close()
    assert report.deleted["chat_messages"] == 5000
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        cur.execute("""SELECT format('%%I.%%I', chunk_schema, chunk_name) FROM timescaledb_information.chunks
                        WHERE hypertable_name = 'chat_messages' AND range_start > %s""", (horizon,))
        younger = [r[0] for r in cur.fetchall()]
        assert len(younger) >= 2
        for chunk in younger:
            cur.execute(f"SELECT count(*) FROM ONLY {chunk}")  # rows outside its compressed batches
            assert cur.fetchone() == (0,), chunk
