"""A held gift bomb survives a crash.

The gift bomb waits in memory (GiftLinker) for its recipients; its durable
copy in `lumio:events:held:{A}:INSTANCE` is written first. A "crash" here is
the process's memory abandoned (the linker never drained, the copy never
deleted) with its heartbeat gone; the events retry leader of another
instance then parks the copy and stores it, once. Real Redis and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lumio_ingestd.events.held import HeldGifts
from lumio_ingestd.events.retry import EventRetryWorker
from lumio_ingestd.sources.twitch.gifts import GiftLinker
from lumio_ingestd.sources.twitch.mapping import GIFT_TYPE, SUB_TYPE, Notification, map_notification
from lumio_ingestd.sources.twitch.sink import TwitchSink
from lumio_ingestd.stores import rediskeys
from support import dbname_of
from support import twitch_frames as tf
from support.events import children_of
from support.harness.servers import PostgresServer
from support.twitch import TwitchRig, make_rig

DEAD = "crashed-instance"


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[TwitchRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, None)
    try:
        yield r
    finally:
        r.close()


def _note(sub_type: str, event: dict[str, object], delivery: str) -> Notification:
    [note] = map_notification(42, sub_type, {"subscription": tf.subscription(sub_type), "event": event},
                              delivery, datetime.now(UTC))
    return note


def _sink(rig: TwitchRig, token: str) -> tuple[TwitchSink, HeldGifts]:
    held = HeldGifts(rig.redis, DEAD, token=token)
    return TwitchSink(rig.events.persist_event, rig.metrics, alerts=None, sessions=None, held=held), held


def _survivor_pass(rig: TwitchRig) -> int:
    worker = EventRetryWorker(rig.redis, rig.pool, rig.metrics, rig.cfg, instance="survivor",
                              lease_ttl_secs=5, heartbeat_ttl_secs=5)
    report = worker.run_pass()
    worker.lease.release()
    return report.inflight_recovered


def test_a_gift_bomb_held_when_the_process_dies_is_stored_once(rig: TwitchRig) -> None:
    sink, _ = _sink(rig, "host-x|1|aaaa")
    linker = GiftLinker(3.0, rig.metrics)
    assert sink.deliver(_note(GIFT_TYPE, tf.gift_event(2), "gift-1"), linker) is None  # held
    assert sink.deliver(_note(SUB_TYPE, tf.sub_event("501", is_gift=True), "sub-1"), linker) is not None
    assert rig.redis.hlen(rediskeys.events_held(42, DEAD)) == 1
    assert rig.event_ids() == {"sub-1": 1}  # the gift itself is only in memory and in the copy
    # The process dies here: nothing drains the linker. Another instance's retry leader:
    assert _survivor_pass(rig) == 1
    assert rig.event_ids() == {"sub-1": 1, "gift-1": 1}
    assert rig.redis.hlen(rediskeys.events_held(42, DEAD)) == 0
    assert _survivor_pass(rig) == 0
    assert rig.event_ids() == {"sub-1": 1, "gift-1": 1}


def test_a_gift_bomb_taken_normally_leaves_no_copy_and_keeps_its_recipients(rig: TwitchRig) -> None:
    sink, _ = _sink(rig, "host-x|1|bbbb")
    linker = GiftLinker(3.0, rig.metrics)
    sink.deliver(_note(GIFT_TYPE, tf.gift_event(2), "gift-2"), linker)
    for user in ("601", "602"):
        sink.deliver(_note(SUB_TYPE, tf.sub_event(user, is_gift=True), f"sub-{user}"), linker)
    [ready] = linker.due()
    assert sink.persist(ready).outcome == "stored"
    assert rig.redis.hlen(rediskeys.events_held(42, DEAD)) == 0
    assert _survivor_pass(rig) == 0
    assert len(children_of(rig.pg_url, ready.id)) == 2
    assert rig.event_ids() == {"gift-2": 1, "sub-601": 1, "sub-602": 1}


def test_a_copy_left_after_the_final_was_stored_is_a_harmless_repeat(rig: TwitchRig) -> None:
    sink, held = _sink(rig, "host-x|1|cccc")
    linker = GiftLinker(3.0, rig.metrics)
    sink.deliver(_note(GIFT_TYPE, tf.gift_event(1), "gift-3"), linker)
    sink.deliver(_note(SUB_TYPE, tf.sub_event("701", is_gift=True), "sub-701"), linker)
    [ready] = linker.due()
    # Stored, and the process dies before deleting the copy.
    assert rig.events.persist_event(ready).outcome == "stored"
    assert rig.redis.hlen(rediskeys.events_held(42, DEAD)) == 1
    assert _survivor_pass(rig) == 1
    assert rig.event_ids() == {"gift-3": 1, "sub-701": 1}
    assert len(children_of(rig.pg_url, ready.id)) == 1  # the final row, recipients kept
    assert rig.value("events_persist_failures_total", outcome="recovered") == 1


def test_a_restart_with_the_same_instance_id_parks_the_earlier_processes_copies(rig: TwitchRig) -> None:
    old, _ = _sink(rig, "host-x|1|dddd")
    old.deliver(_note(GIFT_TYPE, tf.gift_event(5), "gift-4"), GiftLinker(3.0, rig.metrics))
    mine, held = _sink(rig, "host-x|2|eeee")
    mine.deliver(_note(GIFT_TYPE, tf.gift_event(5), "gift-5"), GiftLinker(3.0, rig.metrics))
    # This process's own copies are live; only the earlier process's move.
    assert held.recover() == 1
    assert rig.redis.hlen(rediskeys.events_held(42, DEAD)) == 1
    assert rig.redis.llen(rediskeys.events_deadletter(42)) == 1
