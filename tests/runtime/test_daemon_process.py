"""The daemon as a real process with real signals: READY, traffic, SIGTERM, exactly once.

Each test starts `python -m lumio_ingestd -c CFG run` with a $NOTIFY_SOCKET
the test owns, puts steady chat and events through the synthetic source,
stops it with SIGTERM, and checks the exit (code 0, within the 8 s budget).
A second run without the source then drains whatever the first left in Redis
or the spool, and every message and event the first run reported generating
must be stored exactly once.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

from lumio_ingestd.config import load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.stores import rediskeys
from support import write_ini
from support.daemon import Daemon, NotifySocket, assert_exactly_once, wait_stored
from support.harness import FaultProxyFactory, PostgresServer, RedisServer
from support.harness.servers import wait_until

SHUTDOWN_BUDGET = 8.0
# The exit itself (interpreter teardown) after the 8 s drain budget.
EXIT_SLACK = 1.0


def _config(tmp_path: Path, name: str, *, redis_url: str, pg_url: str,
            synthetic: dict[str, object] | None = None, **sections: dict[str, object]) -> Path:
    merged: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": tmp_path / "state", "instance_id": f"test-{name}", "log_level": "info"},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url, "connect_timeout_secs": 2},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "chat": {"flush_interval_secs": 0.3, "deadletter_drain_interval_secs": 0.5},
        "events": {"retry_interval_secs": 0.5},
    }
    if synthetic:
        merged["synthetic"] = dict(synthetic)
    for section, keys in sections.items():
        merged.setdefault(section, {}).update(keys)
    path = write_ini(tmp_path / f"{name}.ini", merged)
    migrate(load(str(path), {}).timescale)
    return path


def _get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _drain_run(tmp_path: Path, name: str, redis_url: str, pg_url: str, dsn: str,
               first: Daemon, instance: str) -> None:
    """A second run without the synthetic source: stores what the first left behind.

    It has the first run's instance id, as a restarted unit with a fixed
    `instance_id` would, so it resumes the first run's in-flight lists at once
    instead of waiting for their heartbeat to expire.
    """
    totals = first.synthetic_totals()
    cfg = _config(tmp_path, name, redis_url=redis_url, pg_url=pg_url,
                  daemon={"instance_id": f"test-{instance}"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / f"{name}.log", notify=notify) as second:
        notify.wait_for("READY=1", 20)
        stored = wait_stored(dsn, totals, 30, alive=lambda: second.proc.poll() is None)
        second.signal(signal.SIGTERM)
        assert second.wait(SHUTDOWN_BUDGET + EXIT_SLACK) == 0, second.log
    assert_exactly_once(stored, totals)
    assert "LOST" not in first.log and "LOST" not in second.log


def _left_in_redis(redis_url: str) -> int:
    """Entries waiting in Redis lists: buffers, dead letters, in-flight lists."""
    client = redis.Redis.from_url(redis_url)
    try:
        return sum(client.llen(k) for k in client.scan_iter("lumio:*")
                   if client.type(k) == b"list" and b"quarantine" not in k)
    finally:
        client.close()


def test_sigterm_under_load_exits_0_in_time_and_nothing_is_lost(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    pg_url = pg_server.url(dbname)
    cfg = _config(tmp_path, "load", redis_url=redis_url, pg_url=pg_url,
                  synthetic={"rate_per_sec": 200, "accounts": "1, 2, 3", "event_every": 7,
                             "run_id": "load"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "load.log", notify=notify) as daemon:
        ready = notify.wait_for("READY=1", 20)
        ready_latency = ready.at - daemon.started
        http_port, metrics_port = daemon.ports()
        status = ready.value("STATUS") or ""
        assert f"http=127.0.0.1:{http_port}" in status and f"metrics=127.0.0.1:{metrics_port}" in status

        # Traffic flows end to end while it runs (liveness), and the probes answer.
        assert wait_until(lambda: _count(pg_url, "chat_messages") > 50, 15), daemon.log
        assert _get(http_port, "/healthz") == (200, {"status": "alive"})
        code, body = _get(http_port, "/readyz")
        assert code in (200, 503) and body["database"] == "ok"  # the session Redis may evict
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert "chat_messages_total" in text and "process_cpu_seconds_total" in text

        sent = daemon.signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 5, after=sent)
        assert daemon.wait(SHUTDOWN_BUDGET + EXIT_SLACK) == 0, daemon.log
        exit_secs = time.monotonic() - sent
    print(f"READY latency {ready_latency:.2f}s; SIGTERM to exit under load {exit_secs:.2f}s")
    assert exit_secs < SHUTDOWN_BUDGET, daemon.log
    assert "shutdown complete" in daemon.log, daemon.log
    # The drain leases were held (the drains ran) and were released on the way out.
    assert "lease lumio:chat:deadletter:drain:leader acquired" in daemon.log
    assert "lease lumio:events:deadletter:drain:leader released" in daemon.log
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.exists(rediskeys.CHAT_DRAIN_LEADER, rediskeys.EVENTS_DRAIN_LEADER) == 0
    finally:
        client.close()
    _drain_run(tmp_path, "load-drain", redis_url, pg_url, pg_url, daemon, "load")


def test_sigterm_with_the_database_down_exits_in_time_and_loses_nothing(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str) -> None:
    private_pg.create_database("lumio")
    pg_url = private_pg.url("lumio")
    cfg = _config(tmp_path, "dbdown", redis_url=redis_url, pg_url=pg_url,
                  synthetic={"rate_per_sec": 200, "accounts": "4, 5", "event_every": 5,
                             "run_id": "dbdown"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "dbdown.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        assert wait_until(lambda: _count(pg_url, "chat_messages") > 50, 15), daemon.log
        private_pg.stop("fast")
        # Chat keeps arriving with the database gone: buffered, events parked.
        assert wait_until(lambda: "event inserts: the database unavailable" in daemon.log, 10), daemon.log
        sent = daemon.signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 5, after=sent)
        assert daemon.wait(SHUTDOWN_BUDGET + EXIT_SLACK) == 0, daemon.log
        exit_secs = time.monotonic() - sent
    print(f"SIGTERM to exit with the database down {exit_secs:.2f}s")
    assert exit_secs < SHUTDOWN_BUDGET, daemon.log
    assert _left_in_redis(redis_url) > 0  # the final flush could not store it: it waits in Redis
    private_pg.start()
    _drain_run(tmp_path, "dbdown-drain", redis_url, pg_url, pg_url, daemon, "dbdown")


def test_a_second_sigterm_cuts_the_drain_short(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fault_proxy: FaultProxyFactory) -> None:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    pg_url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}"
    cfg = _config(tmp_path, "cut", redis_url=redis_url, pg_url=pg_url,
                  synthetic={"rate_per_sec": 200, "accounts": "6", "event_every": 3, "run_id": "cut"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "cut.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        assert wait_until(lambda: _count(pg_server.url(dbname), "chat_messages") > 20, 15), daemon.log
        # A black-holed database: inserts hang until their own bounds, so the drain is slow.
        proxy.blackhole()
        assert wait_until(lambda: "event inserts: the database unavailable" in daemon.log, 10), daemon.log
        first = daemon.signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", 5, after=first)
        second = daemon.signal(signal.SIGTERM)
        code = daemon.wait(SHUTDOWN_BUDGET + EXIT_SLACK)
        after_second = time.monotonic() - second
        total = time.monotonic() - first
    print(f"second SIGTERM to exit {after_second:.2f}s (first SIGTERM to exit {total:.2f}s)")
    assert code == 0, daemon.log
    assert after_second < 1.5, daemon.log
    assert "cut short by a second signal" in daemon.log, daemon.log


def test_a_black_holed_database_still_exits_within_the_budget(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fault_proxy: FaultProxyFactory) -> None:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    proxy = fault_proxy("127.0.0.1", pg_server.port)
    direct = pg_server.url(dbname)
    pg_url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}"
    cfg = _config(tmp_path, "hole", redis_url=redis_url, pg_url=pg_url,
                  synthetic={"rate_per_sec": 200, "accounts": "7, 8", "event_every": 4,
                             "run_id": "hole"})
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "hole.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        assert wait_until(lambda: _count(direct, "chat_messages") > 20, 15), daemon.log
        proxy.blackhole()
        assert wait_until(lambda: "event inserts: the database unavailable" in daemon.log, 10), daemon.log
        sent = daemon.signal(signal.SIGTERM)
        assert daemon.wait(SHUTDOWN_BUDGET + EXIT_SLACK) == 0, daemon.log
        exit_secs = time.monotonic() - sent
    print(f"SIGTERM to exit with the database black-holed {exit_secs:.2f}s")
    assert exit_secs < SHUTDOWN_BUDGET + EXIT_SLACK, daemon.log
    proxy.pass_through()
    _drain_run(tmp_path, "hole-drain", redis_url, direct, direct, daemon, "hole")


def test_sighup_applies_the_log_level_and_survives_a_broken_file(
        tmp_path: Path, redis_server: RedisServer, redis_url: str, pg_server: PostgresServer,
        pg_dsn: str) -> None:
    dbname = dict(kv.split("=", 1) for kv in pg_dsn.split())["dbname"]
    pg_url = pg_server.url(dbname)
    cfg = _config(tmp_path, "hup", redis_url=redis_url, pg_url=pg_url)
    original = cfg.read_text()
    with NotifySocket() as notify, Daemon(cfg, tmp_path / "hup.log", notify=notify) as daemon:
        notify.wait_for("READY=1", 20)
        http_port, _ = daemon.ports()
        _get(http_port, "/healthz")
        assert "DEBUG" not in daemon.log

        cfg.write_text(original.replace("log_level = info", "log_level = debug"))
        sent = daemon.signal(signal.SIGHUP)
        notify.wait_for("RELOADING=1", 5, after=sent)
        notify.wait_for("READY=1", 5, after=sent)
        daemon.wait_log(r"reload: applied daemon\.log_level = debug", 5)
        _get(http_port, "/healthz")
        daemon.wait_log(r"DEBUG .*http: 127\.0\.0\.1 .*GET /healthz", 5)

        cfg.write_text(original.replace("log_level = info", "log_level = loud"))
        daemon.signal(signal.SIGHUP)
        daemon.wait_log(r"reload: the configuration has 1 problem\(s\); keeping the running one: "
                        r".*\[daemon\] log_level", 5)
        assert _get(http_port, "/healthz")[0] == 200  # still running, still at debug
        assert daemon.proc.poll() is None

        cfg.write_text(original.replace("127.0.0.1:0", "127.0.0.1:1"))
        daemon.signal(signal.SIGHUP)
        daemon.wait_log(r"reload: changed keys that take effect only after a restart: "
                        r".*http\.listen", 5)
        sent = daemon.signal(signal.SIGTERM)
        assert daemon.wait(SHUTDOWN_BUDGET + EXIT_SLACK) == 0, daemon.log


def test_an_unusable_port_fails_the_start_with_69(tmp_path: Path, redis_url: str) -> None:
    import socket

    taken = socket.create_server(("127.0.0.1", 0))
    try:
        path = write_ini(tmp_path / "port.ini", {
            "daemon": {"state_dir": tmp_path / "state"},
            "redis": {"url": redis_url},
            "http": {"listen": f"127.0.0.1:{taken.getsockname()[1]}"},
            "metrics": {"listen": "127.0.0.1:0"},
        })
        with Daemon(path, tmp_path / "port.log") as daemon:
            assert daemon.wait(20) == 69, daemon.log
        assert "cannot listen on [http] listen" in daemon.log
    finally:
        taken.close()


def _count(pg_url: str, table: str) -> int:
    import psycopg2

    try:
        with psycopg2.connect(pg_url, connect_timeout=2) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")
            row = cur.fetchone()
        conn.close()
    except psycopg2.OperationalError:
        return -1
    return int(row[0]) if row else 0


def test_an_unusable_state_dir_fails_the_start_with_69(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    path = write_ini(tmp_path / "state.ini", {
        "daemon": {"state_dir": blocker},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
    })
    with Daemon(path, tmp_path / "state.log") as daemon:
        assert daemon.wait(20) == 69, daemon.log
    assert "cannot start: cannot open the spool" in daemon.log
