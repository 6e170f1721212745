"""The StreamElements source against the stand-in Astro gateway over real sockets, real Redis + PostgreSQL.

Covers the Astro protocol (docs/platforms.rst) as the daemon must follow it: subscribes right after
the welcome (token, token type, room, a nonce each, the canonical room from the
response), pings answered (and the stand-in closing a client that does not),
the graceful reconnect with its token (no resubscribe) and its fallback,
unplanned drops (backoff, resubscribe), 502 and 429 with Retry-After on the
upgrade, the per-topic errors (err_unauthorized without a reconnect loop,
retryable errors with backoff, rate limits), the token file re-read when it
changes, malformed frames refused without taking good data along, and
exactly-once storage across all of it. The durability and PII tests are in
test_streamelements_durability.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import websocket

from lumio_ingestd.devkit.standins.streamelements import AstroStandin, activity_doc, tip_activity_doc, tip_doc
from lumio_ingestd.sources.streamelements.protocol import ACTIVITIES, TIPS
from support import dbname_of
from support.harness.servers import PostgresServer, wait_until
from support.streamelements import ROOM, TOKEN, SeRig, make_rig, write_token

CANONICAL = "canonical-room-0001"


@pytest.fixture
def astro() -> Iterator[AstroStandin]:
    with AstroStandin(token=TOKEN, canonical_rooms={ROOM: CANONICAL}) as a:
        yield a


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        astro: AstroStandin) -> Iterator[SeRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, astro)
    try:
        yield r
    finally:
        r.close()


def both(astro: AstroStandin, conn: int | None = None) -> bool:
    return astro.subscribed(TIPS, ACTIVITIES, conn=conn)


def tips(n: int, start: int = 0, prefix: str = "tip") -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(start, start + n)]


def send_tips(astro: AstroStandin, ids: list[str]) -> None:
    for tid in ids:
        astro.publish(TIPS, ROOM, tip_doc(tid, ROOM))


def stored_once(rig: SeRig, ids: list[str], ev_type: str = "tip") -> bool:
    got = rig.stored()
    return all(got[(ev_type, i)] >= 1 for i in ids)


def assert_exactly(rig: SeRig, expected: dict[tuple[str, str], int]) -> None:
    got = rig.stored()
    assert dict(got) == expected, {k: v for k, v in got.items() if expected.get(k) != v}


# -- subscribing ------------------------------------------------------------------------------


@pytest.mark.parametrize("token_type", ["oauth2", None], ids=["json-oauth2", "bare-jwt"])
def test_subscribes_right_after_welcome_with_token_type_and_room_and_stores(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        token_type: str | None) -> None:
    with AstroStandin(token=TOKEN, token_type=token_type or "jwt",
                      canonical_rooms={ROOM: CANONICAL}) as astro:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, astro, token_type=token_type)
        try:
            src = rig.source()
            src.start()
            assert astro.wait_for(lambda: both(astro), 10)
            conn = astro.connections[0]
            assert conn.welcomed_at is not None
            requests = [r for _, r in conn.subscribes]
            assert sorted(r["data"]["topic"] for r in requests) == [ACTIVITIES, TIPS]
            for at, req in conn.subscribes:
                assert at - conn.welcomed_at < 5.0
                assert req["type"] == "subscribe"
                assert req["data"]["room"] == ROOM
                assert req["data"]["token"] == TOKEN
                assert req["data"]["token_type"] == (token_type or "jwt")
            nonces = [r["nonce"] for r in requests]
            assert all(nonces) and len(set(nonces)) == len(nonces)
            # The response's room is canonical: messages for it are this account's.
            assert wait_until(lambda: all(t.room == CANONICAL for t in src.topics.values()), 5)

            astro.publish(TIPS, ROOM, tip_doc("tipA", ROOM, created_at="2026-01-05T19:07:09.302Z"))
            astro.publish(ACTIVITIES, ROOM, activity_doc("actF", ROOM, "follow",
                                                         created_at="2026-01-05T19:10:01.608Z"))
            astro.publish(ACTIVITIES, ROOM, activity_doc("actS", ROOM, "subscriber"))
            assert wait_until(lambda: len(rig.stored()) == 3, 10)
            assert_exactly(rig, {("tip", "tipA"): 1, ("activity.follow", "actF"): 1,
                                 ("activity.subscriber", "actS"): 1})
            rows = rig.rows("SELECT external_id, created_at, user_id, payload FROM events "
                            "ORDER BY external_id")
            by_id = {r[0]: r for r in rows}
            assert by_id["tipA"][1].isoformat() == "2026-01-05T19:07:09.302000+00:00"
            assert by_id["actF"][1].isoformat() == "2026-01-05T19:10:01.608000+00:00"
            assert by_id["actF"][2] == "424242"
            tip = by_id["tipA"][3]
            assert (tip["amount"], tip["currency"], tip["username"], tip["status"], tip["provider"]) == (
                5.0, "EUR", "kind_donor", "success", "paypal")
            assert tip["message"] == "keep it up" and tip["topic"] == TIPS
            assert len(astro.connections) == 1
        finally:
            rig.close()


def test_pings_are_answered_and_the_standin_closes_a_client_that_does_not_pong(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with AstroStandin(token=TOKEN, ping_interval_secs=0.2, pong_timeout_secs=1.0) as astro:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, astro)
        try:
            rig.source().start()
            assert astro.wait_for(lambda: both(astro), 10)
            ours = astro.connections[0]
            # A client that never reads never pongs: the stand-in closes it.
            silent = websocket.create_connection(astro.url, timeout=5)
            try:
                assert astro.wait_for(lambda: len(astro.connections) == 2, 5)
                theirs = astro.connections[1]
                assert astro.wait_for(lambda: not theirs.open, 5)
                assert theirs.no_pong and theirs.close_code == 4000
            finally:
                silent.close()
            assert astro.wait_for(lambda: ours.pongs >= 8, 10), ours.pongs
            assert ours.open and not ours.no_pong
            assert len([c for c in astro.connections if c.reconnect_token is None]) == 2
        finally:
            rig.close()


def test_silence_without_even_a_ping_is_a_dead_connection(rig: SeRig, astro: AstroStandin) -> None:
    # The stand-in pings every 30 s here; the source gives up after 1 s of nothing.
    rig.source(silence_secs=1.0).start()
    assert astro.wait_for(lambda: len(astro.connections) >= 2 and both(astro, conn=1), 10)
    assert rig.value("source_closes_total", platform="streamelements", code="silence") >= 1


# -- reconnects -------------------------------------------------------------------------------


def test_graceful_reconnect_uses_the_token_does_not_resubscribe_and_loses_nothing(
        rig: SeRig, astro: AstroStandin) -> None:
    src = rig.source()
    src.start()
    assert astro.wait_for(lambda: both(astro), 10)
    first = tips(5)
    send_tips(astro, first)
    assert wait_until(lambda: stored_once(rig, first), 10)
    token = astro.send_reconnect()
    # Published after the reconnect request: held for the token, sent on the new socket.
    later = tips(5, 5)
    send_tips(astro, later)
    assert astro.wait_for(lambda: len(astro.connections) == 2 and astro.connections[1].welcomed_at
                          is not None, 10)
    new = astro.connections[1]
    assert new.reconnect_token == token and f"reconnect_token={token}" in new.query
    assert wait_until(lambda: stored_once(rig, first + later), 10)
    assert wait_until(lambda: not astro.connections[0].open, 5)  # the old socket was closed
    last = tips(5, 10)
    send_tips(astro, last)
    assert wait_until(lambda: stored_once(rig, last), 10)
    assert new.subscribes == []  # restored server-side: nothing sent again
    assert src.handoffs == 1
    assert rig.value("source_reconnect_handoffs_total", platform="streamelements", result="ok") == 1
    assert_exactly(rig, {("tip", i): 1 for i in first + later + last})


def test_a_refused_reconnect_token_falls_back_to_a_fresh_socket_and_subscribes(
        rig: SeRig, astro: AstroStandin) -> None:
    rig.source().start()
    assert astro.wait_for(lambda: both(astro), 10)
    first = tips(3)
    send_tips(astro, first)
    assert wait_until(lambda: stored_once(rig, first), 10)
    astro.send_reconnect(honour=False)
    assert astro.wait_for(lambda: len(astro.connections) >= 3 and both(astro, conn=2), 10)
    refused, fresh = astro.connections[1], astro.connections[2]
    assert refused.reconnect_token is not None and refused.close_code == 4000
    assert fresh.reconnect_token is None and len(fresh.subscribes) == 2
    later = tips(3, 3)
    send_tips(astro, later)
    assert wait_until(lambda: stored_once(rig, later), 10)
    assert rig.value("source_reconnect_handoffs_total", platform="streamelements", result="refused") == 1
    assert rig.value("source_reconnect_handoffs_total", platform="streamelements", result="fresh") == 1
    assert_exactly(rig, {("tip", i): 1 for i in first + later})


def test_an_unplanned_drop_reconnects_with_backoff_resubscribes_and_duplicates_are_stored_once(
        rig: SeRig, astro: AstroStandin) -> None:
    src = rig.source()
    src.start()
    assert astro.wait_for(lambda: both(astro), 10)
    first = tips(4)
    send_tips(astro, first)
    assert wait_until(lambda: stored_once(rig, first), 10)
    astro.drop(abrupt=True)
    assert astro.wait_for(lambda: len(astro.connections) == 2 and both(astro, conn=1), 10)
    assert len(astro.connections[1].subscribes) == 2  # a new socket: subscribed again
    astro.drop(code=1011)
    assert astro.wait_for(lambda: len(astro.connections) == 3 and both(astro, conn=2), 10)
    later = tips(4, 4)
    send_tips(astro, later)
    # Redeliveries: the same frame again, and the same tip in a new frame.
    frame = astro.publish(TIPS, ROOM, tip_doc(later[0], ROOM))
    astro.publish(TIPS, ROOM, tip_doc(later[0], ROOM), frame_id=frame["id"])
    astro.publish(TIPS, ROOM, tip_doc(first[0], ROOM))
    assert wait_until(lambda: stored_once(rig, later), 10)
    assert wait_until(lambda: rig.value("source_duplicates_total", platform="streamelements") >= 3, 5)
    assert rig.value("source_disconnects_total", platform="streamelements") == 2
    assert_exactly(rig, {("tip", i): 1 for i in first + later})


def test_a_tip_seen_on_both_topics_is_one_tip_row_and_one_alert(rig: SeRig, astro: AstroStandin) -> None:
    rig.source().start()
    assert astro.wait_for(lambda: both(astro), 10)
    # Tip first, then its activity; activity first, then the tip; an activity tip naming no tip.
    astro.publish(TIPS, ROOM, tip_doc("tipX", ROOM))
    astro.publish(ACTIVITIES, ROOM, tip_activity_doc("actX", "tipX", ROOM))
    astro.publish(ACTIVITIES, ROOM, tip_activity_doc("actY", "tipY", ROOM))
    astro.publish(TIPS, ROOM, tip_doc("tipY", ROOM))
    astro.publish(ACTIVITIES, ROOM, tip_activity_doc("actZ", None, ROOM))
    astro.publish(ACTIVITIES, ROOM, activity_doc("actC", ROOM, "cheer"))
    assert wait_until(lambda: ("activity.cheer", "actC") in rig.stored(), 10)
    assert_exactly(rig, {("tip", "tipX"): 1, ("tip", "tipY"): 1, ("activity.tip", "actZ"): 1,
                         ("activity.cheer", "actC"): 1})
    assert wait_until(lambda: rig.value("events_alerts_published_total", sink="redis") == 4, 5)
    time.sleep(0.3)  # nothing more comes: a second alert for a tip would show here
    assert rig.value("events_alerts_published_total", sink="redis") == 4
    by_id = {p["tip_id"]: p for p in rig.payloads() if "tip_id" in p}
    assert by_id["tipX"]["topic"] == TIPS and by_id["tipY"]["topic"] == ACTIVITIES
    assert by_id["tipY"]["amount"] == 5.0 and by_id["tipY"]["activity_id"] == "actY"


def test_upgrade_refused_with_502_and_429_retry_after_is_honoured(rig: SeRig, astro: AstroStandin) -> None:
    astro.refuse_upgrades(502)
    astro.refuse_upgrades(429, retry_after=1.0)
    rig.source().start()
    assert astro.wait_for(lambda: both(astro), 10)
    statuses = [s for _, s in astro.upgrades]
    assert statuses[:3] == [502, 429, 101]
    waited = astro.upgrades[2][0] - astro.upgrades[1][0]
    assert waited >= 0.95, waited  # Retry-After: 1, while the backoff here is at most 0.3 s
    assert rig.value("streamelements_upgrade_refused_total", status="502") == 1
    assert rig.value("streamelements_upgrade_refused_total", status="429") == 1


# -- errors per topic ---------------------------------------------------------------------------


def test_err_unauthorized_is_logged_once_retried_slowly_and_the_other_topic_keeps_flowing(
        rig: SeRig, astro: AstroStandin, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lumio_ingestd.sources.streamelements")
    astro.fail_subscribe(TIPS, "err_unauthorized", times=None)
    src = rig.source(config_retry_secs=0.8)
    src.start()
    assert astro.wait_for(lambda: astro.subscribed(ACTIVITIES), 10)
    astro.publish(ACTIVITIES, ROOM, activity_doc("act1", ROOM, "follow"))
    assert wait_until(lambda: ("activity.follow", "act1") in rig.stored(), 10)
    assert wait_until(lambda: rig.value("streamelements_subscribe_errors_total",
                                        error="err_unauthorized") >= 3, 10)
    tip_requests = [r for _, r in astro.connections[0].subscribes if r["data"]["topic"] == TIPS]
    assert len(tip_requests) <= 4  # slow retries (0.8 s apart), not a loop
    assert len(astro.connections) == 1  # no reconnect because of it
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and TIPS in r.getMessage()]
    assert len(errors) == 1 and "account 42" in errors[0].getMessage()
    assert TOKEN not in caplog.text
    astro.allow_subscribe(TIPS)
    assert astro.wait_for(lambda: both(astro), 5)
    send_tips(astro, ["tipOK"])
    assert wait_until(lambda: stored_once(rig, ["tipOK"]), 10)
    assert_exactly(rig, {("activity.follow", "act1"): 1, ("tip", "tipOK"): 1})


def test_a_wrong_token_is_retried_at_once_when_the_token_file_changes(
        rig: SeRig, astro: AstroStandin, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    write_token(rig.token_file, "wrong-token-value")
    rig.source().start()  # config_retry_secs stays at its 300 s default
    assert wait_until(lambda: rig.value("streamelements_subscribe_errors_total",
                                        error="err_unauthorized") == 2, 10)
    write_token(rig.token_file, TOKEN, "jwt")
    assert astro.wait_for(lambda: both(astro), 5)
    assert len(astro.connections) == 1
    assert "wrong-token-value" not in caplog.text and TOKEN not in caplog.text


def test_retryable_errors_back_off_and_a_rate_limit_holds_subscribes_back(
        rig: SeRig, astro: AstroStandin) -> None:
    astro.fail_subscribe(TIPS, "err_deadline_exceeded", times=2)
    astro.fail_subscribe(ACTIVITIES, "rate_limit_exceeded", times=1)
    rig.source(rate_limit_secs=0.6).start()
    assert astro.wait_for(lambda: both(astro), 10)
    reqs = astro.connections[0].subscribes
    tip_times = [t for t, r in reqs if r["data"]["topic"] == TIPS]
    act_times = [t for t, r in reqs if r["data"]["topic"] == ACTIVITIES]
    assert len(tip_times) == 3 and len(act_times) == 2
    assert act_times[1] - act_times[0] >= 0.55  # held back for the rate limit
    assert len(astro.connections) == 1
    assert rig.value("streamelements_subscribe_errors_total", error="err_deadline_exceeded") == 2
    assert rig.value("streamelements_subscribe_errors_total", error="rate_limit_exceeded") == 1


def test_malformed_frames_are_refused_counted_and_take_no_good_data_along(
        rig: SeRig, astro: AstroStandin) -> None:
    src = rig.source()
    src.start()
    assert astro.wait_for(lambda: both(astro), 10)
    bad = [
        "not json",
        "[1, 2]",
        json.dumps({"data": {}}),
        json.dumps({"type": "message", "topic": TIPS, "room": CANONICAL, "data": "text"}),
        json.dumps({"type": "message", "topic": TIPS, "room": CANONICAL, "data": {"status": "success"}}),
        json.dumps({"type": "message", "topic": TIPS, "room": "someone-else",
                    "data": tip_doc("tipOther", "someone-else")}),
        json.dumps({"type": "message", "topic": TIPS, "room": CANONICAL,
                    "data": tip_doc("tipBadTime", ROOM, created_at="yesterday")}),
        json.dumps({"type": "message", "topic": ACTIVITIES, "room": CANONICAL,
                    "data": {**activity_doc("actBad", ROOM, "follow"), "type": ["follow"]}}),
        json.dumps({"type": "message", "topic": "channel.chat.message", "room": CANONICAL, "data": {}}),
        json.dumps({"type": "surprise", "data": {}}),
    ]
    for text in bad:
        astro.send_raw(text)
    send_tips(astro, ["tipGood"])
    assert wait_until(lambda: stored_once(rig, ["tipGood"]), 10)
    refused = sum(rig.value("source_bad_frames_total", platform="streamelements", reason=r)
                  for r in ("json", "shape", "room", "time", "unsupported"))
    assert refused == len(bad)
    assert src.alive and len(astro.connections) == 1
    assert_exactly(rig, {("tip", "tipGood"): 1})


def test_a_failed_or_moderated_tip_is_stored_as_its_own_typed_row(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> None:
    with AstroStandin(token=TOKEN) as astro:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, astro,
                       topics="channel.tips,channel.tips.moderation")
        try:
            rig.source().start()
            assert astro.wait_for(lambda: astro.subscribed(TIPS, "channel.tips.moderation"), 10)
            astro.publish(TIPS, ROOM, tip_doc("tipF", ROOM, status="failed"))
            astro.publish(TIPS, ROOM, tip_doc("tipF", ROOM, status="success"))
            astro.publish("channel.tips.moderation", ROOM, tip_doc("tipF", ROOM, approved="pending"))
            astro.publish("channel.tips.moderation", ROOM, tip_doc("tipF", ROOM, approved="allowed"))
            assert wait_until(lambda: len(rig.stored()) == 4, 10)
            types = sorted(t for t, _ in rig.stored())
            assert types == ["tip", "tip.failed", "tip.moderation", "tip.moderation"]
            assert rig.stored()[("tip", "tipF")] == 1
        finally:
            rig.close()
