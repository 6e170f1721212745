"""`lumio-ingestd status` against real Redis, PostgreSQL, a real spool and a running daemon.

The daemon runs in this process (`App` in the main thread, as in
test_daemon_supervisor) with two real sources: one connected to a local TCP
listener, one failing to connect to a closed port. The command itself runs
as a separate process, as an operator runs it. Every figure it prints is
compared with what the test put into Redis, the database and the spool.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
import redis

import support
from lumio_ingestd.cluster.instances import Heartbeat
from lumio_ingestd.cluster.lease import Lease
from lumio_ingestd.config import Config
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage, PlatformEvent
from lumio_ingestd.runtime.app import App
from lumio_ingestd.runtime.build import Parts
from lumio_ingestd.runtime.localstate import read_snapshot, snapshot_path
from lumio_ingestd.sources.base import Source, SourceClosed
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.quarantine import quarantine_entry
from lumio_ingestd.stores.spool import Spool
from support import make_config
from support.daemon import run_app
from support.harness.servers import wait_until

ROOT = support.ROOT

# --------------------------------------------------------------------------- the JSON contract

# The shape `status --json` promises ("v": 1). Keys may be added in later versions (then this
# test is updated with them); none may disappear or change type. A list holds items of one shape.
OPT_STR = (str, type(None))
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))
_LIST = {"total": int, "accounts": int, "largest": [{"account": int, "depth": int}]}
SCHEMA: dict[str, Any] = {
    "v": int, "generated_at": str, "config": str,
    "daemon": {
        "snapshot": str, "found": bool, "running": bool, "problem": OPT_STR, "instance": OPT_STR,
        "pid": OPT_INT, "phase": OPT_STR, "written_at": OPT_STR, "age_secs": OPT_NUM,
        "sources": [{"name": OPT_STR, "platform": OPT_STR, "state": OPT_STR, "since": OPT_STR,
                     "last_connect": OPT_STR, "last_error": OPT_STR, "last_error_at": OPT_STR,
                     "connects": int, "reconnects": int, "connect_failures": int,
                     "disconnects": int, "subscribe_refusals": int,
                     "unsubscribed": [{"channel": str, "error": str}],
                     "held_elsewhere": [{"account": OPT_INT, "subscription": OPT_STR,
                                         "session_id": OPT_STR, "status": OPT_STR, "ours": bool,
                                         "why": OPT_STR}]}],
        "workers": [{"name": OPT_STR, "alive": bool, "healthy": bool}],
    },
    "redis": {
        "ok": bool, "error": OPT_STR, "primary": OPT_STR,
        "instances": [{"instance": str, "pid": OPT_INT, "host": OPT_STR, "last_beat": OPT_STR,
                       "age_secs": OPT_NUM, "ttl_secs": OPT_NUM, "problem": OPT_STR}],
        "leases": [{"lease": str, "holder": OPT_STR, "ttl_secs": OPT_NUM}],
        "lists": {name: _LIST for name in (
            "chat_buffer", "chat_inflight", "chat_deadletter", "chat_quarantine",
            "events_deadletter", "events_inflight", "events_quarantine")},
        "problems": [str],
    },
    "database": {
        "ok": bool, "error": OPT_STR,
        "migrations": {"applied": [{"version": int, "name": str, "applied_at": OPT_STR}],
                       "pending": [{"version": int, "name": str}]},
        "jetstream_cursors": [{"name": str, "time_us": int, "cursor_at": OPT_STR,
                               "lag_secs": OPT_NUM, "updated_at": OPT_STR}],
        "timescaledb": OPT_STR,
        "storage": [{"table": str, "compressed_chunks": int, "uncompressed_chunks": int,
                     "compressed_before_bytes": int, "compressed_after_bytes": int,
                     "uncompressed_bytes": int}],
        "gaps": {key: [{"account_id": int, "platform": str, "source": str, "started_at": str,
                        "ended_at": str, "seconds": OPT_NUM, "status": str, "healed_rows": int,
                        "detail": OPT_STR, "closed_at": OPT_STR}] for key in ("open", "last")},
    },
    "spool": {
        "directory": str, "exists": bool, "segments": int, "pending_bytes": int,
        "records": {"chat": int, "event": int}, "oldest_created_at": OPT_STR,
        "oldest_age_secs": OPT_NUM, "held_by_pid": OPT_INT, "problems": [str],
    },
}


def check_schema(value: Any, schema: Any, where: str = "$") -> None:
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: expected an object, got {value!r}"
        assert set(value) == set(schema), \
            f"{where}: keys differ: missing {set(schema) - set(value)}, extra {set(value) - set(schema)}"
        for key, sub in schema.items():
            check_schema(value[key], sub, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{where}: expected a list, got {value!r}"
        for i, item in enumerate(value):
            check_schema(item, schema[0], f"{where}[{i}]")
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        # bool is an int in Python: an int field must not hold one, nor a bool field an int.
        ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        assert ok, f"{where}: {value!r} is not {types}"


# --------------------------------------------------------------------------- helpers


def run_cli(cfg: Config, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", str(cfg.path), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def status_json(cfg: Config) -> tuple[int, dict[str, Any]]:
    result = run_cli(cfg, "status", "--json")
    assert result.stdout, result.stderr
    doc = json.loads(result.stdout)
    check_schema(doc, SCHEMA)
    return result.returncode, doc


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def config(tmp_path: Path, pg_url: str, redis_url: str) -> Config:
    return make_config(tmp_path, pg_url=pg_url, redis_url=redis_url, sections={
        "daemon": {"instance_id": "inst-a", "state_dir": tmp_path / "state"},
        "http": {"listen": "127.0.0.1:0"}, "metrics": {"listen": "127.0.0.1:0"},
        "timescale": {"connect_timeout_secs": 2},
        "redis": {"connect_timeout_secs": 1, "socket_timeout_secs": 1}})


class TcpSource(Source):
    """Connects to a local TCP port and reads nothing; the listener never answers."""

    platform = "twitch"
    reconnect_min_secs = 0.05
    reconnect_max_secs = 0.1

    def __init__(self, name: str, port: int, metrics: Metrics) -> None:
        super().__init__(name, metrics)
        self.port = port
        self.sock: socket.socket | None = None

    def connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
        self.sock.settimeout(0.1)

    def read_once(self) -> None:
        if self.sock is None:
            raise SourceClosed("closed")
        try:
            if not self.sock.recv(1024):
                raise SourceClosed("peer closed")
        except TimeoutError:
            return

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


def push(client: redis.Redis, key: str, n: int) -> None:
    if n:
        client.rpush(key, *[f"{key}#{i}".encode() for i in range(n)])


# What the test puts into Redis, and so what `status` must report.
CHAT_BUFFERS = {a: 2 * a for a in range(1, 13)}          # 12 accounts: the top 10 are 12..3
CHAT_INFLIGHT = {(5, "inst-a"): 3, (5, "inst-b.dl"): 4, (6, "inst-a"): 1}
CHAT_DEADLETTERS = {3: 5, 4: 1}
CHAT_QUARANTINE = {9: 2}
EVENT_DEADLETTERS = {2: 4, 8: 6}
EVENT_INFLIGHT = {(2, "inst-a"): 1}
EVENT_QUARANTINE = {8: 3}


def seed_redis(client: redis.Redis, metrics: Metrics) -> None:
    for a, n in CHAT_BUFFERS.items():
        push(client, rediskeys.chat_buffer(a), n)
    for (a, owner), n in CHAT_INFLIGHT.items():
        push(client, rediskeys.chat_inflight(a, owner), n)
    for a, n in CHAT_DEADLETTERS.items():
        push(client, rediskeys.chat_deadletter(a), n)
    for a, n in CHAT_QUARANTINE.items():
        for i in range(n):
            client.rpush(rediskeys.chat_quarantine(a), quarantine_entry(b'{"v":1,"x":%d}' % i,
                                                                        "permanent", "22P02"))
    for a, n in EVENT_DEADLETTERS.items():
        push(client, rediskeys.events_deadletter(a), n)
    for (a, owner), n in EVENT_INFLIGHT.items():
        push(client, rediskeys.events_inflight(a, owner), n)
    for a, n in EVENT_QUARANTINE.items():
        push(client, rediskeys.events_quarantine(a), n)
    # Keys status must not count: not a list of ours, and a malformed account id.
    client.set("lumio:webhooks:twitch:seen:abc", b"1", ex=60)
    push(client, "lumio:chat:buffer:{not-a-number}", 7)
    Heartbeat(client, "inst-a", 30.0).beat(force=True)
    client.set(rediskeys.instance_heartbeat("inst-b"), b"pid=77", px=20_000)  # an older format
    assert Lease(client, rediskeys.CHAT_DRAIN_LEADER, 30.0, metrics, owner="inst-a").acquire()
    client.set(rediskeys.EVENTS_DRAIN_LEADER, b"inst-b:0123abcd", px=20_000)


def expected_list(per_account: dict[int, int]) -> dict[str, Any]:
    largest = sorted(per_account.items(), key=lambda ad: (-ad[1], ad[0]))[:10]
    return {"total": sum(per_account.values()), "accounts": len(per_account),
            "largest": [{"account": a, "depth": d} for a, d in largest]}


def by_account(d: dict[tuple[int, str], int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for (a, _), n in d.items():
        out[a] = out.get(a, 0) + n
    return out


# --------------------------------------------------------------------------- tests


def test_status_reports_what_redis_the_database_the_spool_and_the_daemon_hold(
        tmp_path: Path, pg_url: str, pg_dsn: str, redis_url: str) -> None:
    cfg = config(tmp_path, pg_url, redis_url)
    migrate(cfg.timescale)
    metrics = Metrics()
    client = redis.Redis.from_url(redis_url)
    seed_redis(client, metrics)
    cursor_at = datetime.now(UTC) - timedelta(seconds=90)
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO jetstream_cursor (name, time_us) VALUES ('default', %s)",
                    (int(cursor_at.timestamp() * 1_000_000),))
        cur.execute("SELECT version, name FROM schema_migrations ORDER BY version")
        migrations = [{"version": v, "name": n} for v, n in cur.fetchall()]
    conn.close()
    spool = Spool(cfg.daemon.state_dir / "spool", 1 << 20, metrics)
    spool.open()  # held by this process, as the daemon holds it
    chat = [ChatMessage.create(platform="twitch", account_id=1, message_id=f"m{i}",
                               created_at=datetime(2026, 1, 2, 3, 4, 5, i, tzinfo=UTC), text="hi")
            for i in range(3)]
    spool.append("chat", [m.to_entry() for m in chat])
    spool.append("event", [PlatformEvent.new(account_id=2, platform="kick", type="kicks.gifted",
                                             payload={"n": i}).to_entry() for i in range(2)])

    listener = socket.create_server(("127.0.0.1", 0))
    good_port = listener.getsockname()[1]
    sources: list[TcpSource] = []

    def builder(c: Config, m: Metrics) -> Parts:
        sources.extend([TcpSource("source-good", good_port, m),
                        TcpSource("source-bad", closed_port(), m)])
        return Parts(sources=list(sources))

    app = App(cfg, {}, builder=builder)
    seen: dict[str, Any] = {}

    def snapshot_shows_both() -> bool:
        doc, _ = read_snapshot(snapshot_path(cfg.daemon.state_dir))
        if doc is None:
            return False
        states = {s["name"]: s for s in doc["sources"]}
        return bool(states.get("source-good", {}).get("state") == "connected"
                    and states.get("source-bad", {}).get("connect_failures", 0) >= 2)

    def driver(stop: Callable[[], None]) -> None:
        assert wait_until(snapshot_shows_both, 15), read_snapshot(snapshot_path(cfg.daemon.state_dir))
        seen["code"], seen["doc"] = status_json(cfg)
        human = run_cli(cfg, "status")
        seen["human"], seen["human_code"] = human.stdout, human.returncode

    try:
        result = run_app(app, driver)
    finally:
        listener.close()
    assert result.code == 0
    code, doc = seen["code"], seen["doc"]
    assert code == 0, doc

    # Redis: every list figure equals what was pushed; malformed keys are not counted.
    r = doc["redis"]
    assert r["ok"] and r["error"] is None and r["problems"] == []
    assert r["primary"] and redis_url.startswith(f"redis://{r['primary']}/"), r["primary"]
    assert r["lists"]["chat_buffer"] == expected_list(CHAT_BUFFERS)
    assert [x["account"] for x in r["lists"]["chat_buffer"]["largest"]] == list(range(12, 2, -1))
    assert r["lists"]["chat_inflight"] == expected_list(by_account(CHAT_INFLIGHT))
    assert r["lists"]["chat_deadletter"] == expected_list(CHAT_DEADLETTERS)
    assert r["lists"]["chat_quarantine"] == expected_list(CHAT_QUARANTINE)
    assert r["lists"]["events_deadletter"] == expected_list(EVENT_DEADLETTERS)
    assert r["lists"]["events_inflight"] == expected_list(by_account(EVENT_INFLIGHT))
    assert r["lists"]["events_quarantine"] == expected_list(EVENT_QUARANTINE)
    instances = {i["instance"]: i for i in r["instances"]}
    assert set(instances) == {"inst-a", "inst-b"}
    # inst-a: beaten by the test (JSON value), and by nobody else: the app ran no flusher.
    assert instances["inst-a"]["pid"] == os.getpid() and instances["inst-a"]["age_secs"] < 60
    assert 0 < instances["inst-a"]["ttl_secs"] <= 30
    assert instances["inst-b"]["pid"] == 77 and instances["inst-b"]["last_beat"] is None
    leases = {x["lease"]: x for x in r["leases"]}
    assert set(leases) == {rediskeys.CHAT_DRAIN_LEADER, rediskeys.EVENTS_DRAIN_LEADER}
    assert leases[rediskeys.CHAT_DRAIN_LEADER]["holder"] == "inst-a"
    assert 0 < leases[rediskeys.CHAT_DRAIN_LEADER]["ttl_secs"] <= 30
    assert leases[rediskeys.EVENTS_DRAIN_LEADER]["holder"] == "inst-b"
    assert 0 < leases[rediskeys.EVENTS_DRAIN_LEADER]["ttl_secs"] <= 20

    # The database: the ledger as it is, nothing pending, the cursor's lag.
    d = doc["database"]
    assert d["ok"] and [{"version": m["version"], "name": m["name"]}
                        for m in d["migrations"]["applied"]] == migrations
    assert d["migrations"]["pending"] == []
    [cursor] = d["jetstream_cursors"]
    assert cursor["name"] == "default" and 85 <= cursor["lag_secs"] <= 150

    # The spool: what it holds, who holds it, its oldest record.
    s = doc["spool"]
    assert s["exists"] and s["held_by_pid"] == os.getpid()
    assert s["records"] == {"chat": 3, "event": 2}
    assert s["pending_bytes"] == spool.pending_bytes() > 0 and s["segments"] == 1
    assert s["oldest_created_at"] == "2026-01-02T03:04:05.000000Z"
    spool.close()

    # The daemon on this machine: its phase and each source's state and last error.
    dm = doc["daemon"]
    assert dm["found"] and dm["running"] and dm["phase"] == "ingesting" and dm["pid"] == os.getpid()
    assert dm["instance"] == "inst-a" and dm["problem"] is None
    src = {x["name"]: x for x in dm["sources"]}
    assert src["source-good"]["state"] == "connected" and src["source-good"]["connects"] == 1
    assert src["source-good"]["last_connect"] is not None and src["source-good"]["last_error"] is None
    assert src["source-bad"]["state"] in ("backoff", "connecting")
    assert src["source-bad"]["connects"] == 0 and src["source-bad"]["connect_failures"] >= 2
    assert "ConnectionRefusedError" in src["source-bad"]["last_error"]
    assert {w["name"] for w in dm["workers"]} >= {"source-good", "source-bad"}

    # The human form: the same figures, in 100 columns.
    human = seen["human"]
    assert seen["human_code"] == 0
    assert all(len(line) <= 100 for line in human.splitlines()), human
    assert "chat buffers" in human and " 156 in    12 account(s)  12=24 11=22" in human
    assert "source-bad" in human and "ConnectionRefusedError" in human
    assert "held by pid" in human and "3 chat, 2 event record(s)" in human

    # After the stop: the last snapshot says so, every source stopped.
    code, doc = status_json(cfg)
    assert code == 0
    assert doc["daemon"]["phase"] == "stopped" and not doc["daemon"]["running"]
    assert {x["state"] for x in doc["daemon"]["sources"]} == {"stopped"}
    assert doc["spool"]["held_by_pid"] is None
    client.close()


def test_status_with_redis_down_exits_69_and_still_prints_the_database(
        tmp_path: Path, pg_url: str, pg_dsn: str) -> None:
    cfg = config(tmp_path, pg_url, f"redis://127.0.0.1:{closed_port()}/0")
    migrate(cfg.timescale)
    code, doc = status_json(cfg)
    assert code == 69
    assert not doc["redis"]["ok"] and doc["redis"]["error"]
    assert doc["database"]["ok"] and len(doc["database"]["migrations"]["applied"]) >= 3
    assert not doc["daemon"]["found"] and "no snapshot" in doc["daemon"]["problem"]
    human = run_cli(cfg, "status")
    assert human.returncode == 69
    assert "Redis: UNREACHABLE" in human.stdout and "migrations: " in human.stdout
    assert all(len(line) <= 100 for line in human.stdout.splitlines())


def test_status_with_the_database_down_exits_69_and_still_prints_redis(
        tmp_path: Path, redis_url: str) -> None:
    cfg = config(tmp_path, f"postgresql://lumio@127.0.0.1:{closed_port()}/lumio", redis_url)
    client = redis.Redis.from_url(redis_url)
    push(client, rediskeys.chat_buffer(42), 5)
    client.close()
    started = time.monotonic()
    code, doc = status_json(cfg)
    assert code == 69 and time.monotonic() - started < 30
    assert not doc["database"]["ok"] and doc["database"]["error"]
    assert doc["redis"]["ok"]
    assert doc["redis"]["lists"]["chat_buffer"] == expected_list({42: 5})


def gauge(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_source_state_record_and_gauge_follow_connects_failures_losses_and_stop() -> None:
    metrics = Metrics()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    source = TcpSource("source-t", port, metrics)

    def states() -> dict[str, float]:
        return {s: gauge(metrics, "source_state", platform="twitch", state=s)
                for s in ("connecting", "connected", "backoff", "stopped")}

    assert states() == {"connecting": 1, "connected": 0, "backoff": 0, "stopped": 0}
    source.run_once()
    snap = source.source_state.snapshot()
    assert snap["state"] == "connected" and snap["connects"] == 1 and snap["last_connect"] is not None
    assert states() == {"connecting": 0, "connected": 1, "backoff": 0, "stopped": 0}
    conn, _ = listener.accept()
    conn.close()  # the peer hangs up: the source loses the connection
    assert wait_until(lambda: (source.run_once(), source.source_state.state)[1] == "backoff", 5)
    snap = source.source_state.snapshot()
    assert snap["disconnects"] == 1 and snap["last_error"] == "peer closed"
    listener.close()  # now connecting fails
    source.run_once()
    snap = source.source_state.snapshot()
    assert snap["state"] == "backoff" and snap["connect_failures"] == 1
    assert snap["last_error"].startswith("ConnectionRefusedError")
    assert states() == {"connecting": 0, "connected": 0, "backoff": 1, "stopped": 0}
    source.final()
    assert source.source_state.state == "stopped"
    assert states() == {"connecting": 0, "connected": 0, "backoff": 0, "stopped": 1}
    assert snap["reconnects"] == 0


def test_the_heartbeat_says_who_beat_and_when_and_sets_its_gauge(redis_url: str) -> None:
    metrics = Metrics()
    client = redis.Redis.from_url(redis_url)
    before = time.time()
    Heartbeat(client, "inst-h", 30.0, metrics).beat(force=True)
    raw = client.get(rediskeys.instance_heartbeat("inst-h"))
    value = json.loads(raw if isinstance(raw, bytes) else b"")
    assert value["pid"] == os.getpid() and value["host"] == socket.gethostname()
    assert before - 1 <= value["at"] <= time.time() + 1
    assert before - 1 <= gauge(metrics, "instance_heartbeat_timestamp_seconds") <= time.time() + 1
    client.close()


# Heartbeat values another writer may leave: none of them is a time status can show.
ODD_HEARTBEATS = {
    "odd-ms": b'{"pid":11,"host":"h","at":1767225600123}',      # milliseconds
    "odd-inf": b'{"pid":12,"host":"h","at":1e999}',             # infinity once parsed
    "odd-nan": b'{"pid":13,"host":"h","at":NaN}',
    "odd-neg": b'{"pid":14,"host":"h","at":-1e20}',
    "odd-bare": b"1e999",                                        # the bare-number format
    "odd-text": b"\xff\xfegarbage",
    "odd-pid": b'{"pid":true,"host":"h","at":"soon"}',
}


def test_status_shows_odd_heartbeat_values_as_unreadable_and_goes_on(
        tmp_path: Path, pg_url: str, pg_dsn: str, redis_url: str) -> None:
    cfg = config(tmp_path, pg_url, redis_url)
    migrate(cfg.timescale)
    client = redis.Redis.from_url(redis_url)
    for name, value in ODD_HEARTBEATS.items():
        client.set(rediskeys.instance_heartbeat(name), value, px=60_000)
    client.hset(rediskeys.instance_heartbeat("odd-hash"), "at", "1")  # not even a string
    Heartbeat(client, "fine", 30.0).beat(force=True)
    push(client, rediskeys.chat_buffer(7), 3)
    client.set(rediskeys.chat_buffer(8), b"not a list")  # a list's name, a string's value
    client.hset(rediskeys.events_deadletter(9), "x", "y")
    # The same class of value in the database: a cursor far beyond year 9999.
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO jetstream_cursor (name, time_us) VALUES ('odd', %s)",
                    (9_000_000_000_000_000_000,))
    conn.close()
    # And in the local snapshot: NaN and infinite times, a pid no process can have.
    snap = snapshot_path(cfg.daemon.state_dir)
    snap.parent.mkdir(parents=True, exist_ok=True)
    snap.write_text('{"v": 1, "phase": "ingesting", "pid": 99999999999999999999, '
                    '"written_at": NaN, "interval_secs": Infinity, "instance": "inst-a", '
                    '"sources": [{"name": "s", "since": 1e999, "last_connect": -1e20, '
                    '"connects": "many", "reconnects": -3}], "workers": []}')

    code, doc = status_json(cfg)  # valid JSON (no NaN), the promised shape
    assert code == 0, doc
    instances = {i["instance"]: i for i in doc["redis"]["instances"]}
    assert set(instances) == {*ODD_HEARTBEATS, "odd-hash", "fine"}
    for name in [*ODD_HEARTBEATS, "odd-hash"]:
        odd = instances[name]
        assert odd["last_beat"] is None and odd["age_secs"] is None, odd
        assert odd["problem"] and "unreadable" in odd["problem"], odd
        assert odd["pid"] in (None, 11, 12, 13, 14) and odd["pid"] is not True
    assert "1767225600123" in instances["odd-ms"]["problem"]
    assert instances["fine"]["problem"] is None and instances["fine"]["age_secs"] < 60
    assert doc["redis"]["lists"]["chat_buffer"] == expected_list({7: 3})
    assert sorted(doc["redis"]["problems"]) == [
        f"{rediskeys.chat_buffer(8)} is not a list (ResponseError: WRONGTYPE Operation against a "
        "key holding the wrong kind of value)",
        f"{rediskeys.events_deadletter(9)} is not a list (ResponseError: WRONGTYPE Operation "
        "against a key holding the wrong kind of value)"]
    [cursor] = doc["database"]["jetstream_cursors"]
    assert cursor["cursor_at"] is None and cursor["lag_secs"] is None
    daemon = doc["daemon"]
    assert daemon["found"] and not daemon["running"] and daemon["pid"] is None
    assert daemon["written_at"] is None and daemon["age_secs"] is None
    [source] = daemon["sources"]
    assert source["since"] is None and source["last_connect"] is None
    assert source["connects"] == 0 and source["reconnects"] == 0

    human = run_cli(cfg, "status")
    assert human.returncode == 0, human.stderr
    assert "Traceback" not in human.stderr
    lines = human.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines), human.stdout
    for name in [*ODD_HEARTBEATS, "odd-hash"]:
        [line] = [x for x in lines if x.strip().startswith(name)]
        assert "last beat  unreadable" in line, line
    assert "heartbeat unreadable time 1767225600123 (not Unix seconds)" in human.stdout
    assert "odd                            at an unreadable time" in human.stdout
    assert "chat buffers" in human.stdout and "7=3" in human.stdout
    assert f"problem: {rediskeys.chat_buffer(8)} is not a list" in human.stdout
    # Each odd value is named in the log (stderr), so the operator can find and fix it.
    for name in [*ODD_HEARTBEATS, "odd-hash"]:
        assert f"instance {name!r}" in human.stderr, human.stderr
    client.close()


def test_status_shows_compressed_and_uncompressed_chunks_and_bytes(
        tmp_path: Path, timescale_url: str, redis_url: str) -> None:
    cfg = config(tmp_path, timescale_url, redis_url)
    migrate(cfg.timescale)
    with psycopg2.connect(timescale_url) as conn, conn.cursor() as cur:
        cur.execute("""INSERT INTO chat_messages (account_id, platform, message_id, created_at, text)
                       SELECT 1 + i % 4, 'twitch', 'm' || i, now() - i * interval '20 s', 'hello ' || i
                         FROM generate_series(1, 20000) i""")  # 4.6 days: five or six chunks
    _code, doc = status_json(cfg)
    before = {t["table"]: t for t in doc["database"]["storage"]}
    assert doc["database"]["timescaledb"]
    assert before["chat_messages"]["compressed_chunks"] == 0
    chunks = before["chat_messages"]["uncompressed_chunks"]
    assert chunks >= 5 and before["chat_messages"]["uncompressed_bytes"] > 0
    assert before["events"] == {"table": "events", "compressed_chunks": 0, "uncompressed_chunks": 0,
                                "compressed_before_bytes": 0, "compressed_after_bytes": 0,
                                "uncompressed_bytes": 0}
    compress_all_but(timescale_url, keep=chunks - 3)
    _code, doc = status_json(cfg)
    after = {t["table"]: t for t in doc["database"]["storage"]}["chat_messages"]
    assert after["compressed_chunks"] == 3 and after["uncompressed_chunks"] == chunks - 3
    assert 0 < after["compressed_after_bytes"] < after["compressed_before_bytes"]
    assert after["uncompressed_bytes"] < before["chat_messages"]["uncompressed_bytes"]
    human = run_cli(cfg, "status").stdout
    assert "TimescaleDB " in human and "chat_messages  compressed     3: " in human, human
    assert all(len(line) <= 100 for line in human.splitlines())


def compress_all_but(url: str, *, keep: int) -> None:
    """Compress the chat chunks but the newest `keep` (with the daemon's settings)."""
    from lumio_ingestd.db.compression import enable_columnstore

    conn = psycopg2.connect(url)
    try:
        conn.autocommit = True
        enable_columnstore(conn, "chat_messages")
        with conn.cursor() as cur:
            cur.execute("""SELECT compress_chunk(c) FROM (
                             SELECT c, row_number() OVER (ORDER BY r.range_end DESC) AS n
                               FROM show_chunks('chat_messages') c
                               JOIN timescaledb_information.chunks r
                                 ON format('%%I.%%I', r.chunk_schema, r.chunk_name)::regclass = c) x
                            WHERE n > %s""", (keep,))
    finally:
        conn.close()
