"""A Twitch session lost without a close leaves orphaned subscriptions; the source takes them back.

The stand-in keeps a dead session's subscriptions enabled for 120 s (as
Twitch does for a while): the new session's POSTs get 409 and the
notifications go to the dead session. The real source, storing into real
Redis and PostgreSQL, must list the account's subscriptions, delete the
orphans and create them again, so that chat sent shortly after the
reconnect is stored, exactly once; a session left with no subscription of
its own is never reported healthy, and `status` names who holds them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import support
from lumio_ingestd.devkit.standins.twitch import StandinError, StandinSession, TwitchStandin
from lumio_ingestd.runtime.localstate import build_snapshot, snapshot_path, write_snapshot
from lumio_ingestd.sources.twitch.helix import SUBSCRIPTIONS
from support import dbname_of
from support import twitch_frames as tf
from support.harness.servers import PostgresServer, wait_until
from support.twitch import TwitchRig, make_rig

CHAT = "channel.chat.message"
ALL = len(SUBSCRIPTIONS)
#: How long the stand-in keeps a dead session's subscriptions: far longer than any test runs.
ORPHAN_SECS = 120.0
#: Chat sent from this long after the new session's welcome must all be stored.
SHORTLY_SECS = 1.0


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1, orphan_secs=ORPHAN_SECS) as f:
        yield f


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fake: TwitchStandin) -> Iterator[TwitchRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    try:
        yield r
    finally:
        r.close()


def _subscribed(fake: TwitchStandin) -> StandinSession:
    s1 = fake.wait_session(1)
    assert fake.wait_for(lambda: len(s1.subscriptions) == ALL, 10)
    return s1


def _chat_through_the_loss(fake: TwitchStandin, secs: float) -> list[tuple[float, str, bool]]:
    """Chat at about 50 a second for `secs` from now, as Twitch routes it (to an orphan too):
    (when, the chat message id, whether Twitch delivered it to a live socket)."""
    sent: list[tuple[float, str, bool]] = []
    pace = threading.Event()  # never set: its timed wait spaces the messages out
    end = time.monotonic() + secs
    while time.monotonic() < end:
        mid = str(uuid.uuid4())
        try:
            envelope = fake.notify(CHAT, tf.chat_event(mid, "after the loss"))
        except StandinError:  # between an orphan's delete and the create: Twitch sends nothing
            sent.append((time.monotonic(), mid, False))
        else:
            sent.append((time.monotonic(), mid, envelope not in fake.undelivered))
        pace.wait(0.02)
    return sent


def _stored_once_after_the_reconnect(rig: TwitchRig, fake: TwitchStandin,
                                     sent: list[tuple[float, str, bool]]) -> None:
    s2 = fake.wait_session(2, subscribed=False)
    assert s2.welcomed_at is not None
    late = [mid for at, mid, _ in sent if at >= s2.welcomed_at + SHORTLY_SECS]
    assert len(late) >= 25, f"only {len(late)} chat message(s) sent after the reconnect"
    delivered = [mid for _, mid, ok in sent if ok]
    # Everything Twitch delivered is stored once; what it sent to the dead session is counted there.
    assert wait_until(lambda: set(delivered) <= set(rig.chat_ids()), 10), (
        f"{sum(1 for m in late if m in rig.chat_ids())} of {len(late)} sent from {SHORTLY_SECS}s "
        f"after the reconnect stored")
    stored = rig.chat_ids()
    assert {mid: stored[mid] for mid in late} == {mid: 1 for mid in late}
    assert set(stored) == set(delivered) and set(stored.values()) == {1}


def test_a_cut_connection_orphans_the_subscriptions_and_the_source_takes_them_back(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source()
    src.start()
    s1 = _subscribed(fake)
    fake.cut(s1)  # the TCP connection dies: no close frame either way
    assert fake.holder(CHAT) is s1  # Twitch still sends there

    sent = _chat_through_the_loss(fake, 3.0)
    _stored_once_after_the_reconnect(rig, fake, sent)
    s2 = fake.sessions[1]
    assert len(s2.subscriptions) == ALL and s1.subscriptions == {}
    assert rig.value("source_subscriptions_total", platform="twitch", result="orphan_replaced") == ALL
    assert {m for m, _ in fake.eventsub_requests} == {"POST", "GET", "DELETE"}
    assert src.source_state.state == "connected" and src.source_state.snapshot()["held_elsewhere"] == []


def test_a_black_hole_ends_in_a_keepalive_timeout_and_the_orphans_are_taken_back(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source(keepalive_secs=1, keepalive_margin_secs=1.0)
    src.start()
    s1 = _subscribed(fake)
    fake.black_hole(s1)  # nothing gets through; our close frame after the timeout never arrives
    sent = _chat_through_the_loss(fake, 5.0)
    _stored_once_after_the_reconnect(rig, fake, sent)
    assert rig.value("source_closes_total", platform="twitch", code="keepalive") == 1
    assert rig.value("source_subscriptions_total", platform="twitch", result="orphan_replaced") == ALL


def test_a_session_holding_none_of_its_own_is_never_healthy_and_status_names_the_holder(
        rig: TwitchRig, fake: TwitchStandin) -> None:
    src = rig.source()
    src.start()
    s1 = _subscribed(fake)
    assert wait_until(lambda: src.source_state.state == "connected", 5)
    fake.eventsub_faults["DELETE"] = [500] * 10_000  # the orphans cannot be deleted
    fake.cut(s1)
    assert fake.wait_for(lambda: len(fake.sessions) >= 4, 15)  # three sessions tried and given up
    assert rig.value("source_connects_total", platform="twitch") == 1  # none reported connected
    assert src.source_state.state in ("connecting", "backoff")
    assert all(not s.subscriptions for s in fake.sessions[1:])
    held = src.source_state.snapshot()["held_elsewhere"]
    assert {(h["subscription"], h["session_id"], h["ours"], h["account"]) for h in held} == {
        (s.type, s1.id, False, 42) for s in SUBSCRIPTIONS}
    assert rig.value("source_subscriptions_total", platform="twitch", result="failed") >= 2 * ALL

    # What `lumio-ingestd status` shows, from the snapshot the daemon writes.
    path = snapshot_path(rig.cfg.daemon.state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_snapshot(path, build_snapshot(instance="twitch-test", phase="ingesting", started_at=time.time(),
                                        workers=[src]))
    shown = subprocess.run([sys.executable, "-m", "lumio_ingestd", "-c", str(rig.cfg.path), "status"],
                           capture_output=True, text=True, timeout=60, cwd=support.ROOT)
    assert f"held elsewhere (account 42): {CHAT}\n        by session {s1.id} (not ours, enabled)" in (
        shown.stdout), shown.stdout + shown.stderr
    assert "its orphan could not be deleted (500: forced 500)" in shown.stdout

    # Twitch lets the deletes through again: the next session takes them back and is healthy.
    fake.eventsub_faults.clear()
    assert wait_until(lambda: src.source_state.state == "connected", 10)
    assert src.source_state.snapshot()["held_elsewhere"] == []
    mid = fake.notify(CHAT, tf.chat_event("after-the-faults"))
    assert mid not in fake.undelivered
    assert wait_until(lambda: rig.chat_ids().get("after-the-faults") == 1, 10)
