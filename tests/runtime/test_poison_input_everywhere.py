"""Poison input never stalls an account or escapes a worker turn.

A JSON document nested tens of thousands deep, or megabytes large, reaches
the daemon from Redis (chat buffer, chat and event dead letters), from the
spool, over HTTP (webhooks, emit) and over sockets (Twitch, Jetstream). Each
is refused by `boundedjson` before the recursive parser runs: counted and
quarantined (or answered 4xx), while the good data around it goes through.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lumio_ingestd import boundedjson
from lumio_ingestd.chat.ingest import chat_spool_handler
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.devkit.standins.twitch_events import now_text
from lumio_ingestd.events.deadletter import DeadLetters
from lumio_ingestd.events.persist import event_spool_handler
from lumio_ingestd.model import MAX_ENTRY_BYTES, MAX_JSON_STRING
from lumio_ingestd.sources.jetstream.protocol import MAX_FRAME_BYTES, BadFrame, decode
from lumio_ingestd.sources.twitch.mapping import map_notification
from lumio_ingestd.sources.twitch.webhook import MAX_BODY_BYTES as HOOK_MAX_BODY
from lumio_ingestd.sources.twitch.webhook import PATH as HOOK_PATH
from lumio_ingestd.sources.twitch.webhook import TwitchWebhook, signature
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.quarantine import quarantine_entry
from lumio_ingestd.stores.seen import SeenDeliveries
from lumio_ingestd.web.emit import MAX_BODY_BYTES as EMIT_MAX_BODY
from lumio_ingestd.web.emit import PATH as EMIT_PATH
from lumio_ingestd.web.emit import emit_handler
from lumio_ingestd.web.server import Routes
from support import dbname_of
from support import twitch_frames as tf
from support.chat import ChatRig, assert_exactly_once, counter_value, make_messages
from support.chat import make_rig as make_chat_rig
from support.events import Rig as EventRig
from support.events import make_event, quarantined, stored_ids
from support.events import make_rig as make_event_rig
from support.harness.servers import PostgresServer, wait_until
from support.http_client import call, serving
from support.twitch import EMIT_TOKEN, WEBHOOK_SECRET, TwitchRig
from support.twitch import make_rig as make_twitch_rig

DEEP_50K = b"[" * 50_000 + b"]" * 50_000
DEEP_OBJ = b'{"v":1,"account_id":7,"x":' + b'{"a":' * 20_000 + b"1" + b"}" * 20_001


# --------------------------------------------------------------------------- the module


def test_loads_refuses_depth_and_size_before_parsing_and_only_raises_json_refused() -> None:
    for data in (DEEP_50K, DEEP_50K.decode(), DEEP_OBJ, b"[" * 100_000):
        with pytest.raises(boundedjson.JsonRefused) as info:
            boundedjson.loads(data)
        assert info.value.reason == "too_deep" and isinstance(info.value, ValueError)
    with pytest.raises(boundedjson.JsonRefused) as info:
        boundedjson.loads(b" " * 101, max_bytes=100)
    assert info.value.reason == "too_large"
    for bad, reason in ((b"{nope", "not_json"), (b"\xff\xfe\x00", "not_utf8")):
        with pytest.raises(boundedjson.JsonRefused) as info:
            boundedjson.loads(bad)
        assert info.value.reason in (reason, "not_json")
    # Brackets inside strings (escaped quotes included) are not nesting.
    text = json.dumps({"s": "[" * 10_000 + '\\"[[[' + "{" * 10_000, "n": [[[1]]]})
    assert boundedjson.loads(text)["n"] == [[[1]]]
    assert boundedjson.loads(b"[" * 64 + b"]" * 64) is not None  # exactly at the limit
    with pytest.raises(boundedjson.JsonRefused):
        boundedjson.loads(b"[" * 65 + b"]" * 65)
    # Many shallow brackets are fine and cheap.
    started = time.monotonic()
    assert len(boundedjson.loads(b"[" + b"[1]," * 200_000 + b"[1]]")) == 200_001
    assert time.monotonic() - started < 2.0


def test_quarantine_entry_keeps_a_poison_entry_as_raw() -> None:
    for poison in (DEEP_50K, DEEP_OBJ, b"{" * 100_000):
        q = json.loads(quarantine_entry(poison, "undecodable", None))
        assert q["reason"] == "undecodable" and q["raw"].startswith(poison[:10].decode())
    big = b'{"v":1,"pad":"' + b"x" * (MAX_ENTRY_BYTES + 1) + b'"}'
    assert "raw" in json.loads(quarantine_entry(big, "undecodable", None))


# --------------------------------------------------------------------------- Redis lists


@pytest.fixture
def chat_rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[ChatRig]:
    r = make_chat_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), pg_dsn, redis_url)
    yield r
    r.close()


def test_a_poison_entry_in_the_chat_buffer_is_quarantined_and_the_account_flushes(
        chat_rig: ChatRig) -> None:
    client = chat_rig.oracle_redis()
    sent = make_messages(20, account=7)
    entries = [m.to_entry() for m in sent]
    client.rpush(rediskeys.chat_buffer(7), *entries[:10], DEEP_50K, DEEP_OBJ, *entries[10:])
    flusher = chat_rig.flusher()
    flusher.tick()
    assert_exactly_once(chat_rig.stored(), [m.message_id for m in sent])
    held = chat_rig.quarantined(7)
    assert [q["reason"] for q in held] == ["undecodable", "undecodable"]
    assert held[0]["raw"].startswith("[[[")
    assert counter_value(chat_rig.metrics, "chat_quarantined_total") == 2
    assert client.llen(rediskeys.chat_buffer(7)) == 0
    assert [k for k in chat_rig.chat_keys() if "inflight" in k] == []


def test_a_poison_entry_in_the_chat_dead_letters_is_quarantined_and_the_rest_replayed(
        chat_rig: ChatRig) -> None:
    client = chat_rig.oracle_redis()
    sent = make_messages(10, account=7)
    client.rpush(rediskeys.chat_deadletter(7), DEEP_50K, *[m.to_entry() for m in sent])
    chat_rig.drain().tick()
    assert_exactly_once(chat_rig.stored(), [m.message_id for m in sent])
    assert [q["reason"] for q in chat_rig.quarantined(7)] == ["undecodable"]
    assert client.llen(rediskeys.chat_deadletter(7)) == 0


def test_a_poison_chat_entry_in_the_spool_is_counted_and_does_not_fail_the_record(
        chat_rig: ChatRig) -> None:
    sent = make_messages(3, account=7)
    handler = chat_spool_handler(chat_rig.ingest())
    handler("chat", [sent[0].to_entry(), DEEP_50K, sent[1].to_entry(), b"[" * 100_000,
                     sent[2].to_entry()])
    chat_rig.flusher().tick()
    assert_exactly_once(chat_rig.stored(), [m.message_id for m in sent])
    assert counter_value(chat_rig.metrics, "chat_messages_total", {"path": "lost"}) == 2


@pytest.fixture
def event_rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[EventRig]:
    r = make_event_rig(tmp_path, pg_url, redis_url)
    yield r
    r.close()


def test_a_poison_event_dead_letter_is_quarantined_and_the_worker_keeps_its_lease(
        event_rig: EventRig) -> None:
    good = [make_event(account=5, n=i) for i in range(3)]
    DeadLetters(event_rig.redis).park(5, [good[0].to_entry(), DEEP_50K, good[1].to_entry(),
                                          DEEP_OBJ, good[2].to_entry()])
    worker = event_rig.worker()
    report = worker.run_pass()
    assert (report.stored, report.quarantined, report.stopped) == (3, 2, None)
    assert sorted(stored_ids(event_rig.pg_url)) == sorted(str(e.id) for e in good)
    assert [q["reason"] for q in quarantined(event_rig.redis, 5)] == ["undecodable"] * 2
    assert event_rig.counter("events_quarantined_total", reason="undecodable") == 2
    assert worker.lease.still_held()
    assert event_rig.redis.llen(rediskeys.events_inflight(5, "replayer-1")) == 0


def test_a_poison_event_in_the_spool_is_counted_lost_and_the_rest_parked(event_rig: EventRig) -> None:
    good = make_event(account=5, n=1)
    handler = event_spool_handler(event_rig.ingest)
    handler("event", [DEEP_50K, good.to_entry(), DEEP_OBJ])
    assert event_rig.failures("lost") == 2
    assert [json.loads(e)["id"] for e in event_rig.redis.lrange(rediskeys.events_deadletter(5), 0, -1)] \
        == [str(good.id)]


# --------------------------------------------------------------------------- HTTP


@pytest.fixture
def trig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[TwitchRig]:
    r = make_twitch_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, None)
    try:
        yield r
    finally:
        r.close()


def test_deeply_nested_emit_and_webhook_bodies_are_400_not_500(trig: TwitchRig) -> None:
    routes = Routes()
    routes.add("POST", EMIT_PATH, emit_handler(trig.events.insert_event, trig.alerts,
                                               trig.cfg.http.emit_token, trig.metrics),
               max_body_bytes=EMIT_MAX_BODY)
    hook = TwitchWebhook(trig.cfg.twitch.webhook_secret, {"12826": 42}, trig.sink,
                         trig.chat.buffer_or_persist, SeenDeliveries(trig.redis, "twitch"), trig.metrics)
    routes.add("POST", HOOK_PATH, hook.handle, max_body_bytes=HOOK_MAX_BODY)
    auth = {"Authorization": f"Bearer {EMIT_TOKEN}", "Content-Type": "application/json"}
    with serving(routes, trig.metrics) as port:
        emitted = call(port, "POST", EMIT_PATH, b"[" * 100_000 + b"]" * 100_000, auth)
        nested_payload = b'{"account_id":42,"platform":"twitch","type":"x","payload":' + \
            b'{"a":' * 20_000 + b"1" + b"}" * 20_001
        emitted_obj = call(port, "POST", EMIT_PATH, nested_payload, auth)
        body = b'{"subscription":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
        stamp = now_text()
        headers = {"Twitch-Eventsub-Message-Id": "poison-1", "Twitch-Eventsub-Message-Type": "notification",
                   "Twitch-Eventsub-Message-Timestamp": stamp,
                   "Twitch-Eventsub-Message-Signature": signature(WEBHOOK_SECRET, "poison-1", stamp, body)}
        hooked = call(port, "POST", HOOK_PATH, body, headers)
    assert (emitted.status, emitted_obj.status, hooked.status) == (400, 400, 400)
    for reply in (emitted, emitted_obj, hooked):
        assert b"Traceback" not in reply.body and b"internal" not in reply.body
    assert trig.value("http_emit_requests_total", status="400") == 2
    assert trig.value("source_bad_frames_total", platform="twitch", reason="too_deep") == 1
    assert trig.rows("SELECT count(*) FROM events") == [(0,)]


# --------------------------------------------------------------------------- sockets


def test_a_deeply_nested_twitch_frame_is_counted_and_no_worker_error(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with TwitchStandin(min_keepalive=1) as fake:
        rig = make_twitch_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
        try:
            src = rig.source()
            src.start()
            s1 = fake.wait_session(1)
            assert fake.wait_for(lambda: len(s1.subscriptions) > 0 and s1.open, 10)
            fake.notify("channel.chat.message", tf.chat_event("before"))
            assert fake.send_raw(s1, "[" * 100_000 + "]" * 100_000)
            assert fake.send_raw(s1, '{"metadata":' + '{"a":' * 80_000 + "1" + "}" * 80_001)
            fake.notify("channel.chat.message", tf.chat_event("after"))
            assert wait_until(lambda: rig.chat_ids() == {"before": 1, "after": 1}, 10)
            assert rig.value("source_bad_frames_total", platform="twitch", reason="too_deep") == 2
            assert rig.value("worker_errors_total", worker=src.name) == 0
            assert len(fake.sessions) == 1 and s1.open
        finally:
            rig.close()


def test_a_jetstream_record_above_the_limit_is_refused_as_too_large() -> None:
    record = {"$type": "app.bsky.feed.post", "text": "x" * (5 * 1024 * 1024),
              "createdAt": "2026-01-01T00:00:00Z"}
    frame = json.dumps({"did": "did:plc:abc", "time_us": 1_725_000_000_000_000, "kind": "commit",
                        "commit": {"rev": "3l3qo2vutsw2b", "operation": "create",
                                   "collection": "app.bsky.feed.post", "rkey": "3l3qo2vuowo2b",
                                   "record": record, "cid": "bafyrei"}}).encode()
    assert len(frame) > MAX_FRAME_BYTES
    with pytest.raises(BadFrame) as info:
        decode(frame)
    assert info.value.reason == "too_large"
    with pytest.raises(BadFrame) as info:
        decode(b'{"kind":"commit","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert info.value.reason == "not_json"


def test_user_input_that_looks_like_json_is_kept_as_text_never_decoded(trig: TwitchRig) -> None:
    # user_input is a viewer's free text: stored as a string, capped, never parsed.
    nested = "[" * 50_000
    event = tf.redemption_event("red-poison")
    event["user_input"] = nested
    notes = map_notification(42, "channel.channel_points_custom_reward_redemption.add",
                             {"event": event}, "d-1", datetime.now(UTC))
    assert notes[0].event is not None
    assert notes[0].event.payload["user_input"] == "[" * MAX_JSON_STRING


def test_the_other_platforms_decoders_refuse_deep_nesting_as_a_bad_frame() -> None:
    from lumio_ingestd.sources.base import BadFrame as KickBadFrame
    from lumio_ingestd.sources.base import BadFrame as SeBadFrame
    from lumio_ingestd.sources.kick.mapping import parse_frame as kick_parse_frame
    from lumio_ingestd.sources.seventv.protocol import BadFrame as SevenTvBadFrame
    from lumio_ingestd.sources.seventv.protocol import decode as seventv_decode
    from lumio_ingestd.sources.streamelements.protocol import parse_frame as se_parse_frame

    deep = "[" * 100_000 + "]" * 100_000
    # Kick's Pusher frames carry their payload as a JSON string inside the frame.
    with pytest.raises(KickBadFrame):
        kick_parse_frame(json.dumps({"event": "App\\Events\\ChatMessageEvent", "channel": "c", "data": deep}))
    with pytest.raises(SeBadFrame):
        se_parse_frame(deep.encode())
    with pytest.raises(SevenTvBadFrame):
        seventv_decode(deep[:200_000].encode())


def test_a_poison_parked_entry_with_the_record_mark_is_not_a_record() -> None:
    from lumio_ingestd.events.records import _MARK, record_kind

    poison = b"{" + _MARK + b':"record","y":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    assert record_kind(poison) is None  # refused unparsed (it raised RecursionError)
