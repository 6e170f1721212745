"""Kick: a refused Pusher subscription is asked again, and a socket that keeps being refused is
replaced; both are counted and shown in `status`.

Against the stand-in Kick over a real Pusher socket, into real Redis and PostgreSQL:

1. Two `pusher:subscription_error` answers for the chatroom: the source subscribes again on the
   same socket after a short backoff, the chatroom is subscribed on the third try, and chat
   sent after that is stored exactly once. While it is refused, the source's status record
   (the one `lumio-ingestd status` shows) names the channel and the refusal.
2. A chatroom refused every time: after `subscribe_max_refusals` refusals on one connection the
   socket is replaced (`source_closes{code="subscribe_refused"}`); once the refusals stop, the
   chatroom is subscribed and its chat stored exactly once.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import support
from lumio_ingestd.devkit.standins.kick import KickStandin, pusher_chat
from lumio_ingestd.runtime.localstate import build_snapshot, snapshot_path, write_snapshot
from support import dbname_of
from support.harness.servers import PostgresServer, wait_until
from support.kick import CHAT_CHANNEL, CHATROOM, EVENT_CHANNEL, KickRig, make_rig

FAST = dict(subscribe_retry_min_secs=0.2, subscribe_retry_max_secs=0.4)


@pytest.fixture
def fake() -> Iterator[KickStandin]:
    with KickStandin() as f:
        yield f


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fake: KickStandin) -> Iterator[KickRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    try:
        yield r
    finally:
        r.close()


def subscribes(fake: KickStandin, n: int, channel: str) -> int:
    pc = fake.connections[n]
    return sum(f.get("event") == "pusher:subscribe" and f.get("data", {}).get("channel") == channel
               for f in list(pc.inbound))


def test_a_refused_subscription_is_asked_again_on_the_same_socket(rig: KickRig, fake: KickStandin) -> None:
    fake.refuse_next[CHAT_CHANNEL] = 2
    src = rig.source(**FAST)
    src.start()
    assert wait_until(lambda: src.refusals.get(CHAT_CHANNEL) == 1, 5)
    record = src.source_state.snapshot()
    assert record["subscribe_refusals"] >= 1 and CHAT_CHANNEL in record["unsubscribed"]
    assert "refused by the stand-in" in record["unsubscribed"][CHAT_CHANNEL]
    pc = fake.wait_subscribed(CHAT_CHANNEL, timeout=10)
    assert fake.wait_for(lambda: EVENT_CHANNEL in pc.channels, 5)
    assert len(fake.connections) == 1 and subscribes(fake, 0, CHAT_CHANNEL) == 3
    assert wait_until(lambda: rig.value("source_subscriptions_total", platform="kick",
                                        result="retried") == 2, 5)
    assert rig.value("source_subscriptions_total", platform="kick", result="failed") == 2
    assert wait_until(lambda: src.subscribed == {CHAT_CHANNEL, EVENT_CHANNEL}, 5)
    assert src.source_state.snapshot()["unsubscribed"] == {}
    mid = str(uuid.uuid4())
    assert fake.publish(CHAT_CHANNEL, "ChatMessageEvent", pusher_chat(CHATROOM, mid, "after")) == 1
    assert wait_until(lambda: rig.chat_ids() == {mid: 1}, 10)
    time.sleep(0.5)  # no further subscribe, no reconnect
    assert subscribes(fake, 0, CHAT_CHANNEL) == 3 and len(fake.connections) == 1
    assert rig.chat_ids() == {mid: 1}


def test_a_chatroom_refused_every_time_replaces_the_socket_and_shows_in_status(
        rig: KickRig, fake: KickStandin) -> None:
    fake.refuse_next[CHAT_CHANNEL] = 10**6
    src = rig.source(subscribe_max_refusals=3, **FAST)
    src.start()
    assert wait_until(lambda: len(fake.connections) >= 2, 10)
    assert subscribes(fake, 0, CHAT_CHANNEL) == 3
    assert rig.value("source_closes_total", platform="kick", code="subscribe_refused") >= 1
    # What `lumio-ingestd status` shows, from the snapshot the daemon writes.
    assert wait_until(lambda: CHAT_CHANNEL in src.source_state.snapshot()["unsubscribed"], 5)
    path = snapshot_path(rig.cfg.daemon.state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_snapshot(path, build_snapshot(instance="kick-test", phase="ingesting", started_at=time.time(),
                                        workers=[src]))
    shown = subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", str(rig.cfg.path), "status"],
                           capture_output=True, text=True, timeout=60, cwd=support.ROOT)
    assert f"not subscribed: {CHAT_CHANNEL}" in shown.stdout, shown.stdout + shown.stderr
    assert "refused by the stand-in" in shown.stdout
    # Kick stops refusing: the next socket subscribes and chat flows, exactly once.
    fake.refuse_next.clear()
    pc = fake.wait_subscribed(CHAT_CHANNEL, timeout=10)
    assert fake.wait_for(lambda: EVENT_CHANNEL in pc.channels, 5)
    ids = [str(uuid.uuid4()) for _ in range(5)]
    for mid in ids:
        fake.publish(CHAT_CHANNEL, "ChatMessageEvent", pusher_chat(CHATROOM, mid, "x"))
    assert wait_until(lambda: rig.chat_ids() == {mid: 1 for mid in ids}, 10), rig.chat_ids()
    assert wait_until(lambda: src.source_state.snapshot()["unsubscribed"] == {}, 5)
