"""`lumio-ingestd quarantine` against real Redis and PostgreSQL, with the real workers.

Entries get into the quarantine the way production puts them there: a CHECK
constraint makes the database refuse them for good (SQLSTATE 23514), the
chat flusher and the event retry worker quarantine them. Then the cause is
fixed (the constraint dropped), the command requeues them, and the same
workers store them: each exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import support
from lumio_ingestd.admin.quarantine import Quarantines
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.events.retry import EventRetryWorker
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.quarantine import entry_ident, quarantine_entry
from support.chat import ChatRig, assert_exactly_once, make_messages, make_rig
from support.harness.servers import wait_until

ROOT = support.ROOT


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_url, pg_dsn, redis_url, chat={"flush_interval_secs": 0.02})
    yield r
    r.close()


def cli(rig: ChatRig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", str(rig.cfg.path),
                           "quarantine", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def sql(rig: ChatRig, statement: str) -> list[tuple[Any, ...]]:
    with rig.db() as conn, conn.cursor() as cur:
        cur.execute(statement)
        return cur.fetchall() if cur.description else []


def raw_list(rig: ChatRig, key: str) -> list[bytes]:
    return [x if isinstance(x, bytes) else x.encode() for x in rig.oracle_redis().lrange(key, 0, -1)]


def event(account: int, n: int, type_: str) -> PlatformEvent:
    return PlatformEvent.new(account_id=account, platform="twitch", type=type_,
                             external_id=f"ext-{n}-{uuid.uuid4().hex[:6]}", payload={"n": n},
                             created_at=datetime.now(UTC) - timedelta(minutes=5))


def test_requeue_of_a_chat_and_an_event_entry_after_the_fix_stores_each_once(rig: ChatRig) -> None:
    sql(rig, "ALTER TABLE chat_messages ADD CONSTRAINT op_no_poison CHECK (text NOT LIKE 'poison%')")
    sql(rig, "ALTER TABLE events ADD CONSTRAINT op_no_bad CHECK (type <> 'bad.type')")
    good = make_messages(5, account=7, prefix="good")
    poison = make_messages(1, account=7, prefix="bad")[0]
    poison = type(poison).create(platform=poison.platform, account_id=7, message_id=poison.message_id,
                                 created_at=poison.created_at, text="poison pill")
    rig.ingest().persist_batch([*good, poison])
    flusher = rig.flusher()
    flusher.tick()
    ev_ok, ev_bad = event(8, 1, "channel.cheer"), event(8, 2, "bad.type")
    DeadLetters(rig.client).park(8, [ev_ok.to_entry(), ev_bad.to_entry()])
    worker = EventRetryWorker(rig.client, rig.pool, rig.metrics, rig.cfg, instance="test-1")
    report = worker.run_pass()
    assert report.stored == 1 and report.quarantined == 1
    assert rig.stored() == Counter({m.message_id: 1 for m in good})

    # list: one line per entry, with its reason and SQLSTATE.
    listed = cli(rig, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[:4] == ["chat", "7", poison.message_id, "23514"]
    assert lines[0].endswith('violates check constraint "op_no_poison"')
    assert lines[1].split()[:4] == ["events", "8", str(ev_bad.id), "23514"]
    assert lines[1].split()[-3:] == ["twitch", "bad.type", "permanent"]
    assert cli(rig, "list", "--kind", "events").stdout.splitlines() == [lines[1]]
    assert cli(rig, "list", "--account", "7").stdout.splitlines() == [lines[0]]

    shown = cli(rig, "show", "--id", str(ev_bad.id))
    assert shown.returncode == 0
    entry = json.loads(shown.stdout)
    assert entry["entry"]["type"] == "bad.type" and entry["sqlstate"] == "23514"

    # Requeue before the fix: the worker quarantines again; nothing is lost or stored twice.
    # After the fix: requeue, and the workers store each once.
    sql(rig, "ALTER TABLE chat_messages DROP CONSTRAINT op_no_poison")
    sql(rig, "ALTER TABLE events DROP CONSTRAINT op_no_bad")
    result = cli(rig, "requeue")
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)["requeue"]
    assert receipt["counts"] == {"moved": 2, "gone": 0, "skipped": 0}
    assert {(m["kind"], m["id"], m["to"]) for m in receipt["moved"]} == {
        ("chat", poison.message_id, rediskeys.chat_buffer(7)),
        ("events", str(ev_bad.id), rediskeys.events_deadletter(8))}
    # Moved, stripped back to the very bytes that were once quarantined; the quarantine is empty.
    assert raw_list(rig, rediskeys.chat_buffer(7)) == [poison.to_entry()]
    assert raw_list(rig, rediskeys.events_deadletter(8)) == [ev_bad.to_entry()]
    assert rig.oracle_redis().ttl(rediskeys.events_deadletter(8)) > 71 * 3600
    assert not rig.oracle_redis().exists(rediskeys.chat_quarantine(7), rediskeys.events_quarantine(8))

    flusher.tick()
    assert worker.run_pass().stored == 1
    assert_exactly_once(rig.stored(), [m.message_id for m in good] + [poison.message_id])
    rows = sql(rig, "SELECT id::text, count(*) FROM events GROUP BY id")
    assert sorted(rows) == sorted([(str(ev_ok.id), 1), (str(ev_bad.id), 1)])
    assert rig.chat_keys() == []

    # Nothing left to requeue: said so (66), and nothing moves twice.
    again = cli(rig, "requeue")
    assert again.returncode == 66 and "no quarantined entry matches" in again.stderr


def test_a_requeue_racing_a_running_flush_loses_and_duplicates_nothing(rig: ChatRig) -> None:
    """The flusher keeps quarantining B entries into the same list while A entries are requeued."""
    sql(rig, "ALTER TABLE chat_messages ADD CONSTRAINT op_no_a CHECK (text NOT LIKE 'poisonA%')")
    sql(rig, "ALTER TABLE chat_messages ADD CONSTRAINT op_no_b CHECK (text NOT LIKE 'poisonB%')")
    ingest = rig.ingest()

    def poisoned(kind: str, n: int, start: int = 0) -> list[Any]:
        return [type(m).create(platform=m.platform, account_id=7, message_id=m.message_id,
                               created_at=m.created_at, text=f"poison{kind} {i}")
                for i, m in enumerate(make_messages(n, account=7, prefix=f"p{kind}", start=start))]

    a_msgs = poisoned("A", 120)
    ingest.persist_batch(a_msgs)
    flusher = rig.flusher()
    while rig.oracle_redis().llen(rediskeys.chat_buffer(7)):
        flusher.tick()
    assert rig.stored() == Counter()
    sql(rig, "ALTER TABLE chat_messages DROP CONSTRAINT op_no_a")  # the cause of A is fixed

    good_ids: list[str] = []
    b_ids: list[str] = []
    feeding_done = threading.Event()

    def feed() -> None:
        for round_ in range(30):
            good = make_messages(10, account=7, prefix="g", start=round_ * 10)
            bad = poisoned("B", 2, start=round_ * 2)
            ingest.persist_batch([*good, *bad])
            good_ids.extend(m.message_id for m in good)
            b_ids.extend(m.message_id for m in bad)
            threading.Event().wait(0.01)
        feeding_done.set()

    def flusher_turned(before: int) -> Callable[[], bool]:
        return lambda: flusher.turns > before

    flusher.start()
    feeder = threading.Thread(target=feed, name="test-feeder")
    feeder.start()
    store = Quarantines(rig.client)
    moved: list[str] = []
    gone: list[str] = []
    a_ids = [m.message_id for m in a_msgs]
    b_quarantined_during: list[int] = []
    for i in range(0, len(a_ids), 8):  # small requeues, each after a flush pass, while B arrives
        assert wait_until(flusher_turned(flusher.turns), 10)
        b_quarantined_during.append(sum(1 for q in rig.quarantined(7)
                                        if q["text"].startswith("poisonB")))
        result = store.requeue(store.entries(account=7, kind="chat", ids=a_ids[i:i + 8]))
        moved += [m["id"] for m in result["moved"]]
        gone += [m["id"] for m in result["gone"]]
        assert not result["skipped"]
    feeder.join(30)
    assert feeding_done.is_set()
    redis_ = rig.oracle_redis()
    assert wait_until(lambda: not redis_.exists(rediskeys.chat_buffer(7))
                      and not redis_.exists(rediskeys.chat_inflight(7, "test-1")), 30)
    flusher.request_stop()
    assert flusher.join(10)

    assert sorted(moved) == sorted(a_ids) and gone == []
    # It did race: the flusher quarantined B entries between the first and the last requeue.
    assert b_quarantined_during[-1] > b_quarantined_during[0], b_quarantined_during
    quarantined = Counter(q["message_id"] for q in rig.quarantined(7))
    assert quarantined == Counter(dict.fromkeys(b_ids, 1)), "a B entry lost or doubled"
    assert_exactly_once(rig.stored(), [*good_ids, *a_ids, *b_ids], quarantined=b_ids)
    assert rig.chat_keys() == [rediskeys.chat_quarantine(7)]


def test_drop_removes_exactly_the_named_entries(rig: ChatRig) -> None:
    r = rig.oracle_redis()
    chat = [quarantine_entry(m.to_entry(), "permanent", "22P02")
            for m in make_messages(3, account=1, prefix="c")]
    raw = quarantine_entry(b"\xff not json", "undecodable", None)
    events = [quarantine_entry(event(2, n, "channel.cheer").to_entry(), "stuck", "XX000")
              for n in range(3)]
    r.rpush(rediskeys.chat_quarantine(1), *chat, raw)
    r.rpush(rediskeys.events_quarantine(2), *events)
    ids = [entry_ident(json.loads(e), e) for e in [*chat, raw, *events]]
    raw_id = ids[3]
    assert raw_id.startswith("sha256:")

    # A broad drop needs --all; an unknown id is said so (66); neither removes anything.
    assert cli(rig, "drop", "--account", "1").returncode == 64
    assert cli(rig, "drop", "--kind", "events", "--id", ids[0]).returncode == 66
    # The raw entry cannot go back (its bytes are gone): skipped, left in place.
    skipped = json.loads(cli(rig, "requeue", "--id", raw_id).stdout)["requeue"]
    assert skipped["counts"] == {"moved": 0, "gone": 0, "skipped": 1}
    assert raw_list(rig, rediskeys.chat_quarantine(1)) == [*chat, raw]
    assert raw_list(rig, rediskeys.events_quarantine(2)) == events

    result = cli(rig, "drop", "--id", ids[1], "--id", raw_id, "--id", ids[6], "--id", "nope")
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)["drop"]
    assert receipt["counts"] == {"dropped": 3, "gone": 0} and receipt["not_found"] == ["nope"]
    assert sorted(d["id"] for d in receipt["dropped"]) == sorted([ids[1], raw_id, ids[6]])
    by_id = {d["id"]: d for d in receipt["dropped"]}
    assert by_id[ids[1]]["entry"] == json.loads(chat[1])  # the receipt keeps what was deleted
    assert by_id[raw_id]["entry"] == json.loads(raw)
    assert raw_list(rig, rediskeys.chat_quarantine(1)) == [chat[0], chat[2]]
    assert raw_list(rig, rediskeys.events_quarantine(2)) == [events[0], events[1]]

    everything = cli(rig, "drop", "--kind", "events", "--all")
    assert json.loads(everything.stdout)["drop"]["counts"]["dropped"] == 2
    assert raw_list(rig, rediskeys.chat_quarantine(1)) == [chat[0], chat[2]]
    assert not r.exists(rediskeys.events_quarantine(2))


def test_requeue_onto_a_target_of_the_wrong_type_moves_nothing_and_names_the_key(
        rig: ChatRig) -> None:
    r = rig.oracle_redis()
    chat = [quarantine_entry(m.to_entry(), "permanent", "22P02")
            for m in make_messages(3, account=5, prefix="w")]
    events = [quarantine_entry(event(6, n, "channel.cheer").to_entry(), "permanent", "23514")
              for n in range(2)]
    r.rpush(rediskeys.chat_quarantine(5), *chat)
    r.rpush(rediskeys.events_quarantine(6), *events)
    # Someone wrote the targets with the wrong type: a string for chat, a hash for events.
    r.set(rediskeys.chat_buffer(5), b"oops")
    r.hset(rediskeys.events_deadletter(6), "x", "y")

    for _ in range(3):  # each retry used to lose one more entry
        result = cli(rig, "requeue")
        assert result.returncode == 65, (result.returncode, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert f"{rediskeys.chat_buffer(5)} holds a string, not a list" in result.stderr
        assert f"{rediskeys.events_deadletter(6)} holds a hash, not a list" in result.stderr
        receipt = json.loads(result.stdout)["requeue"]
        assert receipt["counts"] == {"moved": 0, "gone": 0, "skipped": 5}
        assert all("not a list" in s["why"] for s in receipt["skipped"])
        assert raw_list(rig, rediskeys.chat_quarantine(5)) == chat
        assert raw_list(rig, rediskeys.events_quarantine(6)) == events
        assert r.get(rediskeys.chat_buffer(5)) == b"oops"
        assert r.hgetall(rediskeys.events_deadletter(6)) == {b"x": b"y"}

    # The key put right, the same command moves every entry, once.
    r.delete(rediskeys.chat_buffer(5), rediskeys.events_deadletter(6))
    result = cli(rig, "requeue")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requeue"]["counts"] == {"moved": 5, "gone": 0, "skipped": 0}
    assert len(raw_list(rig, rediskeys.chat_buffer(5))) == 3
    assert len(raw_list(rig, rediskeys.events_deadletter(6))) == 2
    assert not r.exists(rediskeys.chat_quarantine(5), rediskeys.events_quarantine(6))
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), [json.loads(c)["message_id"] for c in chat])
    worker = EventRetryWorker(rig.client, rig.pool, rig.metrics, rig.cfg, instance="test-w")
    assert worker.run_pass().stored == 2
    assert sorted(n for (n,) in sql(rig, "SELECT count(*) FROM events GROUP BY id")) == [1, 1]
