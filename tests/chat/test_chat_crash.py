"""A flushing (or draining) process SIGKILLed at each step: nothing lost, nothing doubled.

The worker runs in a subprocess (tests/support/chat_kill_worker.py) that kills itself
at a named failpoint. Afterwards a fresh worker of another instance, once the
dead instance's heartbeat has expired, must store every message exactly once
and leave no list behind.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import support
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support.chat import (
    ChatRig,
    assert_exactly_once,
    counter_value,
    make_messages,
    make_rig,
)
from support.harness.servers import PostgresServer, wait_until

KILL_WORKER = support.ROOT / "tests" / "support" / "chat_kill_worker.py"
DEAD = "test-1"  # the instance id in the rig's config, used by the subprocess


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url, instance=DEAD)
    yield r
    r.close()


def _run_and_kill(rig: ChatRig, role: str, step: str) -> None:
    proc = subprocess.run([sys.executable, str(KILL_WORKER), rig.cfg.path, role, step],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -9, f"exit {proc.returncode}: {proc.stderr[-2000:]}"


def _wait_dead(rig: ChatRig) -> None:
    client = rig.oracle_redis()
    assert wait_until(lambda: not client.exists(rediskeys.instance_heartbeat(DEAD)), timeout=10)


@pytest.mark.parametrize("step", ["chat.flush.claimed", "chat.flush.inserted", "chat.flush.deleted"])
def test_flusher_killed_at_each_step(rig: ChatRig, step: str) -> None:
    sent = make_messages(250, account=7) + make_messages(30, account=8)
    assert rig.ingest().persist_batch(sent) == {"buffered": 280}

    _run_and_kill(rig, "flush", step)

    client = rig.oracle_redis()
    inflight = rediskeys.chat_inflight(7, DEAD)
    assert client.llen(inflight) == (0 if step.endswith("deleted") else 100)
    assert len(rig.stored()) == (0 if step.endswith("claimed") else 100)
    assert client.llen(rediskeys.chat_buffer(7)) == 150

    _wait_dead(rig)
    fresh = rig.flusher(instance="fresh")
    fresh.tick()
    assert_exactly_once(rig.stored(), [m.message_id for m in sent])
    assert rig.chat_keys() == []


def test_flusher_restarted_under_the_same_instance_resumes_its_batch(rig: ChatRig) -> None:
    sent = make_messages(150, account=7)
    rig.ingest().persist_batch(sent)
    _run_and_kill(rig, "flush", "chat.flush.inserted")
    # No wait for the heartbeat: the same instance id resumes its own in-flight list.
    again = rig.flusher(instance=DEAD)
    again.tick()
    assert_exactly_once(rig.stored(), [m.message_id for m in sent])
    assert rig.chat_keys() == []
    # The resumed batch (100 rows committed before the kill) and the last 50 are all flushed.
    assert counter_value(rig.metrics, "chat_messages_flushed_total") == 150
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "ok"}) == 2


@pytest.mark.parametrize("step", ["chat.drain.claimed", "chat.drain.inserted", "chat.drain.deleted"])
def test_drain_killed_at_each_step(rig: ChatRig, step: str) -> None:
    sent = make_messages(230, account=7)
    client = rig.oracle_redis()
    client.rpush(rediskeys.chat_deadletter(7), *[m.to_entry() for m in sent])
    client.expire(rediskeys.chat_deadletter(7), 3600)

    _run_and_kill(rig, "drain", step)

    inflight = rediskeys.chat_inflight(7, DEAD + ".dl")
    assert client.llen(inflight) == (0 if step.endswith("deleted") else 100)
    assert len(rig.stored()) == (0 if step.endswith("claimed") else 100)
    assert client.llen(rediskeys.chat_deadletter(7)) == 130

    _wait_dead(rig)
    assert wait_until(lambda: not client.exists(rediskeys.CHAT_DRAIN_LEADER), timeout=10)
    # The flusher returns the dead drain's batch to the buffer and stores it;
    # a new drain leader replays the rest of the dead-letter list.
    rig.flusher(instance="fresh").tick()
    rig.drain(instance="fresh").tick()
    assert_exactly_once(rig.stored(), [m.message_id for m in sent])
    assert rig.chat_keys() == []
    assert counter_value(rig.metrics, "chat_dead_letters_replayed_total") == 130
