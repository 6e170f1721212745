"""Chat in normal operation: the source queue, the buffer, the flusher, bad input.

Real Redis and PostgreSQL; every test ends with the exactly-once oracle.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.chat.ingest import ChatQueue
from lumio_ingestd.model import MAX_TEXT, ChatMessage
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


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    yield r
    r.close()


def _rpush_calls(rig: ChatRig) -> int:
    stats = rig.oracle_redis().info("commandstats")
    return int(stats.get("cmdstat_rpush", {}).get("calls", 0))


def test_queue_hands_over_in_pipelined_batches_and_the_flusher_stores_them(rig: ChatRig) -> None:
    ingest = rig.ingest()
    clock = [100.0]
    queue = ChatQueue(ingest, rig.metrics, max_batch=200, max_delay_secs=0.5, clock=lambda: clock[0])
    sent = make_messages(450, account=7) + make_messages(50, account=8)
    rig.oracle_redis().config_resetstat()

    for msg in sent[:450]:
        queue.add(msg)
    # two full batches went out, one RPUSH each; 50 wait in memory
    assert _rpush_calls(rig) == 2
    assert len(queue) == 50
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 50
    queue.poll()  # not due yet
    assert len(queue) == 50
    clock[0] += 0.6
    queue.poll()  # the oldest waited max_delay: handed over without a new message
    assert len(queue) == 0 and _rpush_calls(rig) == 3
    for msg in sent[450:]:
        queue.add(msg)
    counts = queue.drain()  # a stopping source hands over the rest
    assert counts == {"buffered": 50}
    assert queue.totals == {"buffered": 500}
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 0
    assert counter_value(rig.metrics, "chat_messages_total", {"path": "buffered"}) == 500

    flusher = rig.flusher()
    flusher.tick()

    assert_exactly_once(rig.stored(), [m.message_id for m in sent])
    assert rig.chat_keys() == []  # buffers drained, nothing in flight
    assert counter_value(rig.metrics, "chat_messages_flushed_total") == 500
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "ok"}) == 6
    assert counter_value(rig.metrics, "chat_buffer_depth") == 0
    assert counter_value(rig.metrics, "chat_dead_letter_depth") == 0


def test_flusher_thread_runs_at_once_and_final_flush_on_stop(rig: ChatRig) -> None:
    ingest = rig.ingest()
    flusher = rig.flusher()
    flusher.interval_secs = 3600.0  # after its first turn only the final flush can store more
    first = make_messages(30)
    for msg in first:
        assert ingest.buffer_or_persist(msg) == "buffered"
    flusher.start()
    assert wait_until(lambda: flusher.turns == 1, timeout=10)
    assert_exactly_once(rig.stored(), [m.message_id for m in first])
    second = make_messages(20)
    assert ingest.persist_batch(second) == {"buffered": 20}
    flusher.request_stop()
    assert flusher.join(10)
    assert_exactly_once(rig.stored(), [m.message_id for m in first + second])
    # a clean stop deletes the heartbeat: leftovers would be recovered at once
    assert not rig.oracle_redis().exists(rediskeys.instance_heartbeat(flusher.instance))


def test_bad_values_are_repaired_at_the_edge(rig: ChatRig) -> None:
    nul = ChatMessage.create(platform="twitch", account_id=7, message_id="m-nul",
                             created_at=make_messages(1)[0].created_at, text="a\x00b",
                             user_login="x\x00")
    surrogate = ChatMessage.create(platform="twitch", account_id=7, message_id="m-sur\ud83d",
                                   created_at=nul.created_at, text="smile \ud83d!",
                                   extras={"reply": {"text": "\udc00 and \x00"}})
    long = ChatMessage.create(platform="twitch", account_id=7, message_id="m-long",
                              created_at=nul.created_at, text="y" * (MAX_TEXT + 5000))
    fine = make_messages(10)
    assert nul.sanitized and surrogate.sanitized and long.sanitized
    ingest = rig.ingest()
    counts = ingest.persist_batch([*fine[:5], nul, surrogate, long, *fine[5:]])
    assert counts == {"buffered": 13}
    rig.flusher().tick()

    sent = [m.message_id for m in [*fine, nul, surrogate, long]]
    assert_exactly_once(rig.stored(), sent)
    rows = rig.rows()
    assert rows["m-nul"][6] == "a\ufffdb" and rows["m-nul"][4] == "x\ufffd"
    assert rows["m-sur\ufffd"][6] == "smile \ufffd!"
    assert rows["m-sur\ufffd"][7] == {"reply": {"text": "\ufffd and \ufffd"}}
    assert len(rows["m-long"][6]) == MAX_TEXT
    assert counter_value(rig.metrics, "chat_sanitized_total") == 3
    assert counter_value(rig.metrics, "chat_quarantined_total") == 0


def test_a_row_the_database_refuses_is_isolated_not_dead_lettered(rig: ChatRig) -> None:
    """Bisection: entries no edge repair can save sit among good ones in a buffer."""
    good = make_messages(300, account=7)
    client = rig.oracle_redis()
    bad_account = json.loads(good[0].to_entry())
    bad_account.update(message_id="bad-bigint", account_id=2**70)  # beyond bigint: SQLSTATE 22003
    nul_in_json = json.loads(good[0].to_entry())
    nul_in_json.update(message_id="nul-in-entry", text="hand\u0000built")  # repaired on decode
    entries = [m.to_entry() for m in good]
    entries.insert(17, json.dumps(bad_account).encode())
    entries.insert(150, b"this is not json")
    entries.insert(151, json.dumps({"v": 99, "message_id": "from-the-future"}).encode())
    entries.insert(200, json.dumps(nul_in_json).encode())
    number_time = json.loads(good[0].to_entry())
    number_time.update(message_id="number-time", created_at=12)  # from_entry lets AttributeError out
    entries.insert(250, json.dumps(number_time).encode())
    client.rpush(rediskeys.chat_buffer(7), *entries)

    flusher = rig.flusher()
    for _ in range(rig.cfg.chat.max_flush_failures + 1):  # more passes than would dead-letter
        flusher.tick()

    quarantined = rig.quarantined(7)
    reasons = {q.get("message_id", q.get("raw")): (q["reason"], q["sqlstate"]) for q in quarantined}
    assert reasons["bad-bigint"][1] == "22003"
    assert "out of range" in reasons["bad-bigint"][0]
    assert reasons["this is not json"] == ("undecodable", None)
    assert reasons["from-the-future"] == ("undecodable", None)
    assert reasons["number-time"] == ("undecodable", None)
    assert len(quarantined) == 4
    sent = [m.message_id for m in good] + ["bad-bigint", "nul-in-entry"]
    assert_exactly_once(rig.stored(), sent, quarantined=["bad-bigint"])
    assert rig.rows()["nul-in-entry"][6] == "hand\ufffdbuilt"
    assert not client.exists(rediskeys.chat_deadletter(7))
    assert counter_value(rig.metrics, "chat_quarantined_total") == 4
    assert counter_value(rig.metrics, "chat_sanitized_total") == 1
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "failed"}) == 0
    assert counter_value(rig.metrics, "chat_flush_batches_total", {"result": "deadlettered"}) == 0
    assert rig.chat_keys() == [rediskeys.chat_quarantine(7)]


def test_a_message_built_past_the_edge_is_repaired_not_dropped(rig: ChatRig) -> None:
    from dataclasses import replace

    good = make_messages(5)
    raw = replace(good[0], message_id="past-edge", text="lone \ud83d", extras={"k": "\x00"})
    assert rig.ingest().persist_batch([raw, *good]) == {"buffered": 6}
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), ["past-edge", *(m.message_id for m in good)])
    assert rig.rows()["past-edge"][6] == "lone \ufffd"
    assert counter_value(rig.metrics, "chat_sanitized_total") == 1


def test_a_batch_whose_hand_over_raises_stays_queued_and_is_stored_once(rig: ChatRig) -> None:
    """persist_batch counts what it cannot place; if an error escapes it anyway (a bug), the
    queue keeps the batch for the next hand-over instead of dropping it uncounted."""
    ingest = rig.ingest()
    real = ingest.persist_batch
    calls = [0]

    def first_call_raises(items: list[ChatMessage]) -> object:
        calls[0] += 1
        if calls[0] == 1:
            raise RecursionError("a bug below persist_batch")
        return real(items)

    ingest.persist_batch = first_call_raises  # type: ignore[method-assign,assignment]
    queue = ChatQueue(ingest, rig.metrics, max_batch=10)
    sent = make_messages(15, account=7)
    with pytest.raises(RecursionError):
        for msg in sent:
            queue.add(msg)
    assert len(queue) == 10  # nothing vanished with the error
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 10
    for msg in sent[10:]:
        queue.add(msg)
    queue.drain()
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 0
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), [m.message_id for m in sent])


def test_the_depth_gauge_counts_every_held_message_at_every_scrape(rig: ChatRig) -> None:
    """No `.inc()` per message: the gauge sums the queues' `held()` when read, so it is exact
    between hand-overs, during one (the batch is still only in memory) and across queues."""
    ingest = rig.ingest()
    real = ingest.persist_batch
    seen_during: list[float] = []

    def persist_and_look(items: Any) -> Any:
        seen_during.append(counter_value(rig.metrics, "chat_persistence_queue_depth"))
        return real(items)

    ingest.persist_batch = persist_and_look  # type: ignore[method-assign,assignment]
    first = ChatQueue(ingest, rig.metrics, max_batch=10, max_delay_secs=60)
    second = ChatQueue(ingest, rig.metrics, max_batch=10, max_delay_secs=60)
    sent = make_messages(13, account=7) + make_messages(4, account=8)
    for i, msg in enumerate(sent[:13]):
        first.add(msg)
        if i < 9:
            assert counter_value(rig.metrics, "chat_persistence_queue_depth") == i + 1
    assert seen_during == [10.0]  # the batch being handed over was still counted
    for msg in sent[13:]:
        second.add(msg)
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 3 + 4
    assert first.held() == 3 and second.held() == 4
    second.drain()
    assert seen_during[-1] == 7.0
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 3
    first.drain()
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 0
    del first, second
    gc.collect()
    assert counter_value(rig.metrics, "chat_persistence_queue_depth") == 0  # a dropped queue: gone
    rig.flusher().tick()
    assert_exactly_once(rig.stored(), [m.message_id for m in sent])
