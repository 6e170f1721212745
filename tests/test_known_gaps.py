"""The known gaps of the last closing note (issue 19, item 5), each closed.

- the spool directory is created 0700 whatever the umask;
- `DeadLetters.park_many` sends one MULTI per account (each MULTI touches one
  Redis Cluster slot), observed on a real Redis with MONITOR;
- refused frames are kept with their raw bytes in a bounded file quarantine
  (RELIABILITY.md B17);
- chat in-flight claims carry a claim token: two processes with one instance
  id never delete each other's claim, and the second is refused at start.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from chat_support import assert_exactly_once, counter_value, make_messages
from chat_support import make_rig as make_chat_rig
from fakes.twitch import FakeTwitch
from harness.servers import PostgresServer, wait_until
from lumio_ingestd.chat.lists import ChatLists, ClaimLost
from lumio_ingestd.cluster.instances import PROCESS_TOKEN, InstanceClaim
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.build import StartupError, _claim_instance, build
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.refused_frames import FrameQuarantine
from lumio_ingestd.stores.spool import Spool
from support import dbname_of, make_config
from twitch_support import make_rig


def test_the_spool_directory_is_created_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        spool = Spool(tmp_path / "state" / "spool", 1 << 20, Metrics())
        spool.open()
        spool.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "state" / "spool").stat().st_mode) == 0o700


def test_park_many_sends_one_multi_per_account(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    lines: list[str] = []
    ready = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            ready.set()
            for item in monitor.listen():
                command = str(item["command"])
                lines.append(command)
                if "lumio:test:park-done" in command:
                    done.set()
                    return

    watcher = threading.Thread(target=watch, name="test-monitor")
    watcher.start()
    assert ready.wait(5)
    DeadLetters(client).park_many({7: [b"a", b"b"], 8: [b"c"], 9: [b"d"]})
    client.get("lumio:test:park-done")
    assert done.wait(5) or wait_until(done.is_set, 5)
    watcher.join(5)
    blocks: list[set[str]] = []
    current: set[str] | None = None
    for line in lines:
        word = line.split(" ", 1)[0].upper()
        if word == "MULTI":
            current = set()
        elif word == "EXEC":
            assert current is not None
            blocks.append(current)
            current = None
        elif current is not None:
            current.update(re.findall(r"\{(\d+)\}", line))
    assert sorted(tuple(sorted(b)) for b in blocks) == [("7",), ("8",), ("9",)]
    for account, n in ((7, 2), (8, 1), (9, 1)):
        assert client.llen(f"lumio:events:deadletter:{{{account}}}") == n
    client.close()


def test_refused_frames_are_kept_with_their_raw_bytes_and_the_quarantine_is_bounded(
        tmp_path: Path) -> None:
    metrics = Metrics()
    frames = FrameQuarantine(tmp_path / "quarantine", metrics, max_bytes=4096, max_frame_bytes=100)
    frames.add("twitch", "json", b"\xff not json")
    frames.add("bluesky", "too_large", b"x" * 1000, "a frame of 1000 bytes")
    first, second = frames.entries()
    assert (first["platform"], first["reason"], base64.b64decode(str(first["raw_b64"]))) == \
        ("twitch", "json", b"\xff not json")
    assert (second["size"], second["truncated"], len(base64.b64decode(str(second["raw_b64"])))) == \
        (1000, True, 100)
    for i in range(200):
        frames.add("twitch", "json", f"frame {i}".encode())
    kept = frames.entries()
    total = sum(p.stat().st_size for p in (tmp_path / "quarantine").iterdir())
    assert total <= 2 * 4096 and kept[-1]["raw_b64"] == base64.b64encode(b"frame 199").decode()
    assert stat.S_IMODE((tmp_path / "quarantine").stat().st_mode) == 0o700
    assert metrics.registry.get_sample_value("frames_quarantined_total", {"result": "kept"}) == 202


def test_the_twitch_source_quarantines_a_refused_frame_with_its_bytes(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with FakeTwitch(min_keepalive=1) as fake:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
        try:
            src = rig.source()
            quarantine = FrameQuarantine(tmp_path / "q", rig.metrics)
            src.frame_quarantine = quarantine
            src.start()
            s1 = fake.wait_session(1)
            assert fake.wait_for(lambda: len(s1.subscriptions) == 11 and s1.open, 10)
            assert fake.send_raw(s1, b"\xff\xfe not utf-8")
            assert fake.send_raw(s1, "[" * 5000 + "]" * 5000)
            assert wait_until(lambda: len(quarantine.entries()) == 2, 10)
            utf8, deep = quarantine.entries()
            assert (utf8["reason"], base64.b64decode(str(utf8["raw_b64"]))) == ("utf8", b"\xff\xfe not utf-8")
            assert deep["reason"] == "too_deep" and deep["size"] == 10_000
        finally:
            rig.close()


def test_two_processes_with_one_instance_id_never_delete_each_others_claim(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    rig = make_chat_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    try:
        client = rig.oracle_redis()
        sent = make_messages(250, account=7)
        rig.ingest().persist_batch(sent)
        inflight = rediskeys.chat_inflight(7, "twin")
        # Tokens of processes on other hosts: neither can be proven dead.
        second = rig.flusher(instance="twin", claim_token="host-b|2|bbbb")
        seen: list[int] = []

        def meanwhile(step: str) -> None:
            if step == "chat.flush.claimed" and not seen:
                second.tick()  # the second process runs in the middle of the first's batch
                seen.append(client.llen(inflight))

        first = rig.flusher(instance="twin", claim_token="host-a|1|aaaa", failpoint=meanwhile)
        first.tick()
        assert seen == [100]  # the second left the first's batch alone
        assert client.get(rediskeys.instance_claim("twin")) == b"host-a|1|aaaa"
        second.tick()
        assert_exactly_once(rig.stored(), [m.message_id for m in sent])
        assert client.llen(inflight) == 0
        assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "ok"}) == 3
    finally:
        rig.close()


def test_a_list_under_another_token_is_never_finished_by_the_old_holder(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    inflight = rediskeys.chat_inflight(7, "twin")
    old = ChatLists(client, "host-a|1|aaaa")
    new = ChatLists(client, "host-b|2|bbbb", InstanceClaim(client, "twin", 10, "host-b|2|bbbb"))
    client.rpush(rediskeys.chat_buffer(7), b"e1", b"e2")
    assert old.claim(rediskeys.chat_buffer(7), inflight, 10) == ([b"e1", b"e2"], False)
    assert new.instance_claim is not None and new.instance_claim.take() is None
    assert new.claim(rediskeys.chat_buffer(7), inflight, 10) == ([b"e1", b"e2"], True)  # adopted
    with pytest.raises(ClaimLost):
        old.finish(inflight, rediskeys.chat_quarantine(7), [b"q"])
    assert old.move_all(inflight, rediskeys.chat_deadletter(7)) == 0
    assert client.llen(inflight) == 2 and client.llen(rediskeys.chat_quarantine(7)) == 0
    new.finish(inflight, rediskeys.chat_quarantine(7), [])
    assert client.llen(inflight) == 0 and not client.hlen(rediskeys.chat_claims(7))
    client.close()


def test_a_second_process_with_the_same_instance_id_is_refused_at_start(
        tmp_path: Path, redis_url: str) -> None:
    cfg = make_config(tmp_path, redis_url=redis_url,
                      sections={"daemon": {"instance_id": "twin", "state_dir": tmp_path / "state"}})
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    client.set(rediskeys.instance_claim("twin"), b"other-host|4242|cccc", px=15_000)
    with pytest.raises(StartupError, match="in use by another running process"):
        build(cfg, Metrics())
    assert not (tmp_path / "state" / "spool").exists()  # refused before anything was opened
    # A holder on this host whose pid is gone is a crashed process: taken over at once.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    client.set(rediskeys.instance_claim("twin"), f"{socket.gethostname()}|{dead}|dddd", px=15_000)
    _claim_instance(cfg, client)
    assert client.get(rediskeys.instance_claim("twin")) == PROCESS_TOKEN.encode()
    client.close()
