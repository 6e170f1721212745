"""Conformance: every Twitch frame of the shared corpus, through the parsers and through the live source.

The corpus (written outside this project) is read at test time from
`../shared/corpus` next to the repository; it is never copied in. Where it is
missing (a user's clone), the project's own frames of every kind take its
place (`support.corpus`: every type the source subscribes to, two it does not,
payload-only lines, a revocation, two session_reconnects, and two webhook
requests signed with secrets of its own). Every frame must become
chat, an event, a control message or an explicit "unsupported type"; none may
be refused as malformed or crash the source. Through the live source every
frame is sent as Twitch would send it (payload-only lines in a notification
envelope, and the channel its subscription names made the account's own: a
notification for another channel is refused by the source); the corpus's
session_reconnect frames each drive a real hand-off (their reconnect_url
pointed at the stand-in). Notifications of types the source never subscribes
to are refused and counted ("unsubscribed"), not stored.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.config import Secret
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.devkit.standins.twitch_events import now_text
from lumio_ingestd.events.store import DEDUP_WINDOW
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import parse_time
from lumio_ingestd.sources.twitch.helix import SUBSCRIPTIONS
from lumio_ingestd.sources.twitch.mapping import (
    CHAT_TYPE,
    interpret,
    map_notification,
    subscription_type_of,
)
from lumio_ingestd.sources.twitch.webhook import PATH, TwitchWebhook, signature
from lumio_ingestd.stores.seen import SeenDeliveries
from lumio_ingestd.web.server import Routes
from support import dbname_of
from support.corpus import CORPUS
from support.harness.servers import PostgresServer, wait_until
from support.http_client import call, serving
from support.twitch import TwitchRig, make_rig

WS_FILE = "twitch_eventsub_ws.jsonl"
WEBHOOK_FILE = "twitch_eventsub_webhook.jsonl"
DELIVERY = datetime(2026, 1, 5, 18, 0, tzinfo=UTC)


def lines(name: str) -> list[dict[str, Any]]:
    return CORPUS.lines(name)


def full_frame(line: dict[str, Any]) -> str:
    """The frame's text: the source's own bytes where they are JSON, else the cleaned parse (JSONC)."""
    try:
        json.loads(line["raw"])
    except (ValueError, KeyError):
        return json.dumps(line["frame"])
    return str(line["raw"])


def test_every_websocket_frame_parses_into_chat_an_event_control_or_unsupported() -> None:
    kinds: dict[str, int] = {}
    for n, line in enumerate(lines(WS_FILE)):
        frame = line["frame"]
        if "metadata" in frame:
            it = interpret(42, full_frame(line))
            kinds[it.kind] = kinds.get(it.kind, 0) + 1
            md = frame["metadata"]
            if it.kind == "control":
                assert md["message_type"] in line["kind"], (n, line["kind"])
                continue
            assert it.kind in ("chat", "event"), (n, line["kind"], it.kind)
            items = it.items
            stamp = parse_time(md["message_timestamp"])
            sub_type = md["subscription_type"]
        else:  # "PAYLOAD ONLY": the payload of a notification whose envelope the source dropped
            sub_type = subscription_type_of(frame)
            items = tuple(map_notification(42, sub_type, frame, f"corpus-{n}", DELIVERY))
            stamp = DELIVERY
            kinds["payload"] = kinds.get("payload", 0) + 1
        for item in items:
            if sub_type == CHAT_TYPE:
                assert item.chat is not None and item.chat.message_id == frame_event(frame)["message_id"]
                assert item.chat.created_at == stamp
            else:
                assert item.event is not None and item.event.type == sub_type, (n, line["kind"])
                assert item.event.external_id
    at_least = ({"control": 7, "chat": 1, "event": 15, "payload": 20} if CORPUS.recorded
                else {"control": 6, "chat": 1, "event": 12, "payload": 5})
    assert all(kinds.get(k, 0) >= n for k, n in at_least.items()), kinds


def frame_event_of_chat() -> dict[str, Any]:
    """A channel.chat.message event of the corpus (a captured one), as the template of a probe."""
    for line in lines(WS_FILE):
        md = line["frame"].get("metadata", {})
        if md.get("subscription_type") == CHAT_TYPE:
            return frame_event(line["frame"])
    raise AssertionError("no channel.chat.message frame in the corpus")


def frame_event(frame: dict[str, Any]) -> dict[str, Any]:
    payload = frame.get("payload", frame)
    return dict(payload["event"])


def test_every_webhook_body_maps_through_the_same_mapping() -> None:
    notifications = 0
    for n, line in enumerate(lines(WEBHOOK_FILE)):
        body = line["frame"]
        headers = line.get("headers") or {}
        message_type = headers.get("Twitch-Eventsub-Message-Type", "notification")
        if message_type != "notification":
            assert message_type in ("webhook_callback_verification", "revocation")
            continue
        sub_type = headers.get("Twitch-Eventsub-Subscription-Type") or subscription_type_of(body)
        items = map_notification(42, sub_type, body, f"corpus-{n}", DELIVERY)
        assert len(items) == 1, line["kind"]
        item = items[0]
        if sub_type == CHAT_TYPE:
            assert item.chat is not None
        else:
            assert item.event is not None and item.event.type == sub_type
        notifications += 1
    assert notifications >= (78 if CORPUS.recorded else 13)


def test_the_real_signed_requests_verify_and_are_answered(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    signed = [line for line in lines(WEBHOOK_FILE) if line.get("verify")]
    assert len(signed) == 2
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, None)
    try:
        for line in signed:
            headers = {k: v for k, v in line["headers"].items() if k != "Content-Length"}
            raw = line["raw"].encode()
            secret = line["verify"]["hmac_secret"]
            assert signature(secret, headers["Twitch-Eventsub-Message-Id"],
                             headers["Twitch-Eventsub-Message-Timestamp"], raw) == \
                headers["Twitch-Eventsub-Message-Signature"]
            sent = parse_time(headers["Twitch-Eventsub-Message-Timestamp"])

            def clock(sent: datetime = sent) -> datetime:
                return sent

            # The requests are years old: this receiver's clock is set to when they were sent.
            hook = TwitchWebhook(Secret(secret), {"44429626": 42, "88525095": 42}, rig.sink,
                                 rig.chat.buffer_or_persist, SeenDeliveries(rig.redis, "twitch"),
                                 rig.metrics, clock=clock)
            routes = Routes()
            routes.add("POST", PATH, hook.handle)
            with serving(routes) as port:
                reply = call(port, "POST", PATH, raw, headers)
                forged = call(port, "POST", PATH, raw + b" ", headers)  # one byte more
            assert forged.status == 403
            if headers["Twitch-Eventsub-Message-Type"] == "webhook_callback_verification":
                assert reply.status == 200
                assert reply.body == json.loads(raw)["challenge"].encode()
            else:
                assert reply.status == 204
                assert rig.event_ids() == {headers["Twitch-Eventsub-Message-Id"]: 1}
        # Signed for their own secrets only.
        other = TwitchWebhook(Secret("a-different-secret"), {}, rig.sink, rig.chat.buffer_or_persist,
                              SeenDeliveries(None, "twitch"), Metrics(),
                              clock=lambda: parse_time("2021-02-19T23:47:01Z"))
        line = signed[0]
        routes = Routes()
        routes.add("POST", PATH, other.handle)
        with serving(routes) as port:
            assert call(port, "POST", PATH, line["raw"].encode(), line["headers"]).status == 403
    finally:
        rig.close()


def rows_expected(keys: set[tuple[str, datetime]]) -> Counter[str]:
    """Rows per external id: the dedup probe looks DEDUP_WINDOW either side of created_at."""
    out: Counter[str] = Counter()
    for external_id in {k for k, _ in keys}:
        times = sorted(t for k, t in keys if k == external_id)
        out[external_id] = 1 + sum(1 for a, b in zip(times, times[1:], strict=False) if b - a > DEDUP_WINDOW)
    return out


# -- the same frames through the running source, over the stand-in socket --------------------


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1) as f:
        yield f


BROADCASTER = "12826"  # the rig account's twitch_user_id
SUBSCRIBED = {sub.type for sub in SUBSCRIPTIONS}


def _ours(payload: dict[str, Any]) -> bool:
    """Point the subscription's condition at the rig's account (True when it changed)."""
    condition = (payload.get("subscription") or {}).get("condition")
    changed = False
    if isinstance(condition, dict):
        for key in ("broadcaster_user_id", "to_broadcaster_user_id"):
            if key in condition and condition[key] != BROADCASTER:
                condition[key] = BROADCASTER
                changed = True
    return changed


def on_the_wire(n: int, line: dict[str, Any]) -> str | None:
    """What Twitch would send for this corpus line (None: a session_reconnect, sent separately)."""
    frame = json.loads(json.dumps(line["frame"]))
    if "metadata" not in frame:  # a payload: give it the envelope Twitch sends it in
        sub_type = subscription_type_of(frame)
        _ours(frame)
        return json.dumps({"metadata": {"message_id": f"corpus-{n}-{uuid.uuid4()}",
                                        "message_type": "notification", "message_timestamp": now_text(),
                                        "subscription_type": sub_type,
                                        "subscription_version": frame["subscription"]["version"]},
                           "payload": frame})
    if frame["metadata"]["message_type"] == "session_reconnect":
        return None
    if isinstance(frame.get("payload"), dict) and _ours(frame["payload"]):
        return json.dumps(frame)
    return full_frame(line)


def reconnect_frames() -> list[tuple[int, str]]:
    """The corpus's session_reconnect frames (their reconnect_url is the real Twitch's)."""
    out = []
    for n, line in enumerate(lines(WS_FILE)):
        frame = line["frame"]
        if frame.get("metadata", {}).get("message_type") == "session_reconnect":
            out.append((n, full_frame(line)))
    return out


def test_every_frame_through_the_live_source_is_stored_or_skipped_and_nothing_crashes(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str, fake: TwitchStandin) -> None:
    rig: TwitchRig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    try:
        src = rig.source()
        src.start()
        session = fake.wait_session(1)
        assert fake.wait_for(lambda: len(session.subscriptions) == 11, 10)
        expected_chat: set[str] = set()
        expected_events: set[str] = set()
        event_keys: set[tuple[str, datetime]] = set()  # rows: one per external id and time
        seen_ids: set[str] = set()
        unsubscribed = 0
        for n, line in enumerate(lines(WS_FILE)):
            text = on_the_wire(n, line)
            if text is None:
                continue
            assert fake.send_raw(session, text)
            it = interpret(42, text)
            if it.kind not in ("chat", "event") or it.envelope.message_id in seen_ids:
                continue
            seen_ids.add(it.envelope.message_id)
            if (it.envelope.subscription_type or subscription_type_of(it.envelope.payload)) \
                    not in SUBSCRIBED:
                unsubscribed += 1
                continue
            for item in it.items:
                if item.chat is not None:
                    expected_chat.add(item.chat.message_id)
                elif item.event is not None and item.event.external_id:
                    expected_events.add(item.event.external_id)
                    event_keys.add((item.event.external_id, item.event.created_at))
        probe = fake.notify("channel.cheer", {"user_id": "1", "bits": 1, "broadcaster_user_id": "12826"})
        expected_events.add(probe)
        assert wait_until(lambda: expected_chat <= set(rig.chat_ids()) and
                          expected_events <= set(rig.event_ids()), 15), (
            expected_chat - set(rig.chat_ids()), expected_events - set(rig.event_ids()))
        assert set(rig.chat_ids()) == expected_chat and set(rig.event_ids()) == expected_events
        # The corpus repeats some ids by hand (one fixture event as a payload and as a full frame,
        # years apart); the dedup window keys on time too, so those are one row per time.
        assert rig.event_ids() == rows_expected(event_keys) + Counter([probe])
        assert rig.value("source_revocations_total", platform="twitch", status="authorization_revoked") == 1
        assert len(fake.sessions) == 1 and session.open  # nothing so far took the session down

        # The corpus's session_reconnect frames, each a real hand-off to the stand-in.
        # Their reconnect_url is pointed at the stand-in; the rest of the frame is the corpus's.
        for n, (_, text) in enumerate(reconnect_frames(), start=2):
            obj = json.loads(text)
            obj["payload"]["session"]["reconnect_url"] = fake.reconnect_url(session)
            assert fake.send_raw(session, json.dumps(obj))
            new = fake.wait_session(n)
            assert new.reconnect_of is session
            assert fake.wait_for(lambda old=session: not old.open, 10)  # type: ignore[misc]
            assert session.close_code is None  # closed by the source after the new welcome
            session = new
        last = fake.notify("channel.chat.message", {**frame_event_of_chat(), "message_id": "after-corpus"})
        assert last and wait_until(lambda: rig.chat_ids()["after-corpus"] == 1, 10)
        assert rig.value("source_reconnect_handoffs_total", platform="twitch", result="ok") == 2
        assert rig.value("worker_errors_total", worker=src.name) == 0
        bad = {r: rig.value("source_bad_frames_total", platform="twitch", reason=r)
               for r in ("json", "shape", "nul", "utf8", "time", "too_large", "binary")}
        assert sum(bad.values()) == 0, bad
        assert rig.value("source_bad_frames_total", platform="twitch", reason="unsubscribed") == unsubscribed
        assert rig.value("source_bad_frames_total", platform="twitch", reason="foreign_channel") == 0
        assert rig.value("source_disconnects_total", platform="twitch") == 0
    finally:
        rig.close()
