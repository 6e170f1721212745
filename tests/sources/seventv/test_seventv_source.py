"""The 7TV source end to end: the stand-in 7TV (EventAPI + REST on loopback), real Redis and PostgreSQL.

Every test ends with an exactly-once check: the 7TV rows are the changes
made, each once (external ids unique), and the stored state is the set as
7TV has it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.sources.seventv import Followed
from lumio_ingestd.sources.seventv.protocol import SetState
from support.harness.servers import PostgresServer, wait_until
from support.seventv import SevenTvRig, make_rig

USER = "01HUSER0000000000000000001"
TWITCH = "1001"
SET_A = "01HSETA0000000000000000001"
SET_B = "01HSETB0000000000000000001"
SWITCH_DIFF = [("emote.added", "01HEMOTE000000000000000003", None, "Clap"),
               ("emote.removed", "01HEMOTE000000000000000001", None, "peepoHappy")]
E1, E2, E3, E4 = "01HEMOTE000000000000000001", "01HEMOTE000000000000000002", \
    "01HEMOTE000000000000000003", "01HEMOTE000000000000000004"


@pytest.fixture
def standin() -> Iterator[SevenTvStandin]:
    with SevenTvStandin(heartbeat_interval_ms=300) as s:
        s.add_set(SET_A, {E1: "peepoHappy", E2: "KEKW"})
        s.add_set(SET_B, {E2: "KEKW", E3: "Clap"})
        s.add_user(USER, twitch_id=TWITCH, set_id=SET_A)
        yield s


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str, standin: SevenTvStandin) -> Iterator[SevenTvRig]:
    r = make_rig(tmp_path, pg_url, redis_url, standin, {7: {"twitch_user_id": TWITCH}})
    yield r
    r.close()


def ready(rig: SevenTvRig, set_id: str = SET_A, account: int = 7, n_conn: int = 1) -> None:
    """The set is subscribed on `n_conn` connections so far, its state stored, and the account's
    heals done (a change from now on arrives as a dispatch)."""
    s = rig.standin
    assert s.wait_for(lambda: s.subscribed("emote_set.update", set_id) and s.subscribed("user.update", USER)
                      and len(s.connections) >= n_conn), [c.subs for c in s.connections]
    assert wait_until(lambda: (st := rig.state(account)) is not None and st[0] == set_id, 10)
    assert wait_until(lambda: rig.healed(account), 10)


def settle(rig: SevenTvRig, n: int) -> None:
    assert wait_until(lambda: len(rig.changes()) >= n, 10), rig.changes()
    time.sleep(0.2)  # nothing more may arrive: the exactly-once check reads the final table


def assert_exactly_once(rig: SevenTvRig, account: int = 7) -> None:
    ids = rig.external_ids()
    assert all(n == 1 for n in ids.values()), ids
    st = rig.state(account)
    assert st is not None
    set_id, emotes, _ = st
    assert {k: v[0] for k, v in emotes.items()} == {k: v["name"] for k, v in rig.standin.sets[set_id].items()}


def test_set_found_through_rest_subscribed_each_dispatch_one_row_duplicate_none(rig: SevenTvRig) -> None:
    s = rig.standin
    rig.source()
    ready(rig)
    assert any(p.startswith("/v3/users/twitch/") for p in s.rest_requests)
    assert rig.changes() == []  # the first sight is the baseline, not 2 "added"
    assert rig.value("seventv_heals_total", result="baseline") == 1

    s.add_emote(SET_A, E3, "Clap")
    s.rename_emote(SET_A, E2, "KEKWait")
    s.remove_emote(SET_A, E1)
    settle(rig, 3)
    assert rig.changes() == [("emote.added", E3, None, "Clap"), ("emote.renamed", E2, "KEKW", "KEKWait"),
                             ("emote.removed", E1, None, "peepoHappy")]
    row = rig.rows("SELECT payload, user_id, created_at FROM events WHERE type = 'emote.added'")[0]
    assert row[0]["emote_set_id"] == SET_A and row[0]["actor"]["username"] == "standin"
    assert row[0]["via"] == "eventapi" and row[1] == row[0]["actor"]["id"]

    # The same dispatch again (7TV may repeat one): no new row.
    conn = s.open_connections()[0]
    body = {"id": SET_A, "kind": 3, "actor": None, "pushed": [
        {"key": "emotes", "index": 2, "type": "object", "value": s.sets[SET_A][E3]}]}
    frame = json.dumps({"op": 0, "t": int(time.time() * 1000),
                        "d": {"type": "emote_set.update", "body": body}})
    s.send_raw(conn, frame)
    s.send_raw(conn, frame)
    assert wait_until(lambda: rig.value("seventv_dispatches_total", result="unchanged") >= 2, 5)
    assert len(rig.changes()) == 3
    assert_exactly_once(rig)


def test_heartbeats_stop_reconnect_within_three_intervals_and_resubscribe(rig: SevenTvRig) -> None:
    s = rig.standin
    src = rig.source()
    ready(rig)
    first = s.open_connections()[0]
    s.stop_heartbeats(first)
    stopped = time.monotonic()
    assert s.wait_for(lambda: len(s.connections) >= 2 and s.subscribed("emote_set.update", SET_A)
                      and s.subscribed("user.update", USER), 5)
    took = time.monotonic() - stopped
    assert took < 3 * 0.3 + 1.5, took  # three intervals plus margin (read poll, backoff, handshake)
    assert took >= 3 * 0.3 * 0.9, took  # and not before three were missed
    assert rig.value("source_closes_total", platform="seventv", code="heartbeat") >= 1
    # The resubscribed connection carries dispatches.
    s.add_emote(SET_A, E3, "Clap")
    settle(rig, 1)
    assert src.sockets[0].connected
    assert_exactly_once(rig)


@pytest.mark.parametrize("how", ["op4", "4012", "end_of_stream_4012"])
def test_reconnect_request_and_lifetime_close_reconnect_and_resubscribe(rig: SevenTvRig, how: str) -> None:
    s = rig.standin
    src = rig.source()
    ready(rig)
    first = s.open_connections()[0]
    if how == "op4":
        s.send_reconnect(first)
    elif how == "4012":
        s.close_connection(first, 4012, "connection lifetime")
    else:
        s.end_of_stream(first, 4012, "connection lifetime")
    assert s.wait_for(lambda: len(s.connections) >= 2 and s.subscribed("emote_set.update", SET_A), 5)
    second = s.connections[1]
    # Resume was asked for the old session, answered with failure, and did not matter.
    assert any(m.get("op") == 34 and m["d"]["session_id"] == first.session_id for m in second.inbound)
    sock = src.sockets[0]
    assert wait_until(lambda: sock.resume_acks and sock.resume_acks[-1]["success"] is False, 5)
    s.rename_emote(SET_A, E1, "peepoSad")
    settle(rig, 1)
    assert rig.changes() == [("emote.renamed", E1, "peepoHappy", "peepoSad")]
    assert_exactly_once(rig)


def test_changes_while_the_socket_is_down_stored_once_after_reconnect(rig: SevenTvRig) -> None:
    """4007 (maintenance) keeps the socket down for the configured wait; what changed meanwhile
    (only the REST API shows it) is stored once after the reconnect, and nothing before it again."""
    s = rig.standin
    rig.source(maintenance_wait_secs=1.5)
    ready(rig)
    s.add_emote(SET_A, E3, "Clap")  # live, before the gap
    settle(rig, 1)
    first = s.open_connections()[0]
    # Taken before the close: the source may see it (and start its wait) before
    # close_connection returns.
    closed = time.monotonic()
    s.close_connection(first, 4007, "maintenance")
    assert s.wait_for(lambda: not s.open_connections(), 2)
    s.add_emote(SET_A, E4, "Wave")  # nobody is subscribed: REST only
    s.rename_emote(SET_A, E2, "KEKWait")
    s.remove_emote(SET_A, E1)
    s.remove_emote(SET_A, E3)
    assert s.wait_for(lambda: len(s.connections) >= 2, 5)
    assert time.monotonic() - closed >= 1.5  # 4007 waited as configured
    settle(rig, 5)
    assert sorted(rig.changes()[1:]) == sorted([
        ("emote.added", E4, None, "Wave"), ("emote.renamed", E2, "KEKW", "KEKWait"),
        ("emote.removed", E1, None, "peepoHappy"), ("emote.removed", E3, None, "Clap")])
    rest = rig.rows("SELECT count(*) FROM events WHERE payload->>'via' = 'rest'")[0][0]
    assert rest == 4
    assert_exactly_once(rig)


def test_a_change_seen_by_dispatch_and_by_rest_is_one_row(rig: SevenTvRig) -> None:
    """A crash between the events and the state save: the next heal computes the same events
    (same external ids), so the dispatch's rows are not stored again. (The state is saved after
    every change set, so a crash can leave only the last one unsaved: here a dispatch with two.)"""
    s = rig.standin
    src = rig.source()
    ready(rig)
    s.add_emote(SET_A, E3, "Clap")
    settle(rig, 1)
    assert wait_until(lambda: (st := rig.state(7)) is not None and st[2] == 2, 5)
    before = rig.state(7)
    assert before is not None
    # One dispatch, two changes: E1 renamed and E2 removed.
    with s._lock:
        old1, old2 = dict(s.sets[SET_A][E1]), s.sets[SET_A].pop(E2)
        s.sets[SET_A][E1]["name"] = "peepoSad"
    keys = ("id", "name", "flags", "timestamp", "actor_id")
    s.dispatch("emote_set.update", SET_A, {"id": SET_A, "kind": 3, "pulled": [
        {"key": "emotes", "index": 1, "old_value": {k: old2[k] for k in keys}, "value": None}], "updated": [
        {"key": "emotes", "index": 0, "old_value": {k: old1[k] for k in keys},
         "value": {k: s.sets[SET_A][E1][k] for k in keys}}]})
    settle(rig, 3)
    rig.stop(src)
    # Put the state back as if its save had never happened (the process died before it).
    rig.rows("UPDATE seventv_emote_sets SET emotes = %s::jsonb, version = %s WHERE account_id = 7",
             (json.dumps(before[1]), before[2]))
    src2 = rig.source()
    # The heal stores its changes one after the other: wait for both.
    assert wait_until(lambda: rig.value("seventv_changes_total", change="renamed", via="rest",
                                        outcome="duplicate") == 1
                      and rig.value("seventv_changes_total", change="removed", via="rest",
                                    outcome="duplicate") == 1, 10)
    assert len(rig.changes()) == 3
    assert wait_until(lambda: (st := rig.state(7)) is not None and st[2] == before[2] + 1, 5)
    # And it goes on: a later change is one new row.
    s.remove_emote(SET_A, E3)
    settle(rig, 4)
    assert src2.sockets[0].connected
    assert_exactly_once(rig)


def subscribe_sent(s: SevenTvStandin) -> bool:
    """The newest connection has sent an op 35 Subscribe."""
    return bool(s.connections) and any(m.get("op") == 35 for m in s.connections[-1].inbound)


def healed_via(rig: SevenTvRig) -> list[str]:
    return [r[0] for r in rig.rows("SELECT payload->>'via' FROM events WHERE platform = 'seventv'")]


def test_a_reconnected_account_is_healed_only_once_the_server_has_acked_its_subscriptions(
        rig: SevenTvRig) -> None:
    """A change made after the heal's fetch but before the server has read the subscribe is
    dispatched to nobody: so the heal waits for the Acks, not the sends, and sees it."""
    s = rig.standin
    src = rig.source()
    ready(rig)
    rig.stop(src)
    s.subscribes_open.clear()  # the server is slow to read subscribes
    fetched = len(s.rest_requests)
    src2 = rig.source()
    assert s.wait_for(lambda: len(s.connections) == 2 and subscribe_sent(s))
    healer = src2.sockets[0].heal_thread
    turns = healer.turns
    assert wait_until(lambda: healer.turns >= turns + 3, 5)
    # No fetch of the set while its subscription is not in place.
    assert not any(p.startswith("/v3/emote-sets/") for p in s.rest_requests[fetched:]), s.rest_requests
    s.add_emote(SET_A, E3, "Clap")  # nobody is subscribed yet: no dispatch
    s.subscribes_open.set()
    settle(rig, 1)
    assert rig.changes() == [("emote.added", E3, None, "Clap")] and healed_via(rig) == ["rest"]
    assert_exactly_once(rig)


def test_a_set_found_by_the_api_is_fetched_only_once_its_subscription_is_acked(
        rig: SevenTvRig) -> None:
    """A new account's set is known only from the API's answer: it is subscribed before it is
    fetched, so a change made before the server acks that subscription is in the baseline."""
    s = rig.standin
    s.subscribes_open.clear()
    rig.source()
    assert s.wait_for(lambda: subscribe_sent(s))
    assert wait_until(lambda: any(p.startswith("/v3/users/twitch/") for p in s.rest_requests), 5)
    healer = rig.sources[-1].sockets[0].heal_thread
    turns = healer.turns
    assert wait_until(lambda: healer.turns >= turns + 3, 5)
    assert not any(p.startswith("/v3/emote-sets/") for p in s.rest_requests), s.rest_requests
    assert rig.state(7) is None
    s.add_emote(SET_A, E3, "Clap")  # the server has not read the subscribe: no dispatch
    s.subscribes_open.set()
    ready(rig)
    assert E3 in rig.standin.sets[SET_A] and rig.changes() == []  # in the baseline
    s.rename_emote(SET_A, E3, "Clapping")
    settle(rig, 1)
    assert rig.changes() == [("emote.renamed", E3, "Clap", "Clapping")] and healed_via(rig) == ["eventapi"]
    assert_exactly_once(rig)


def test_a_subscription_dropped_before_its_ack_does_not_count_as_held(rig: SevenTvRig) -> None:
    """Two switches while the server is slow to read subscribes: the first new set is
    unsubscribed before its Ack comes, and that late Ack must not make it count as held."""
    s = rig.standin
    src = rig.source()
    ready(rig)
    sock = src.sockets[0]
    s.subscribes_open.clear()
    s.switch_set(USER, SET_B)
    assert wait_until(lambda: ("emote_set.update", SET_B) in sock.server_subs, 5)
    s.switch_set(USER, SET_A)
    assert wait_until(lambda: ("emote_set.update", SET_B) not in sock.server_subs, 5)
    s.subscribes_open.set()
    ready(rig)
    assert wait_until(lambda: sock.server_subs == sock.acked_subs, 5)  # every Ack read
    conn = s.open_connections()[0]
    assert sock.acked_subs == conn.subs == {("emote_set.update", SET_A), ("user.update", USER)}
    assert_exactly_once(rig)


def test_the_subscription_stays_on_a_set_while_its_first_state_waits_to_be_saved(rig: SevenTvRig) -> None:
    """The heal has fetched the set and its save waits for the database: the socket goes on
    syncing its subscriptions meanwhile and must not drop the set (its changes would be lost)."""
    s = rig.standin
    blocker = psycopg2.connect(rig.pg_url)
    try:
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLE seventv_emote_sets IN SHARE MODE")  # reads go on, writes wait
        src = rig.source()
        assert wait_until(lambda: any(p.startswith("/v3/emote-sets/") for p in s.rest_requests), 10)
        reader = src.sockets[0]
        turns = reader.turns
        assert wait_until(lambda: reader.turns >= turns + 5, 5)  # each turn syncs the subscriptions
        assert rig.state(7) is None  # still waiting
    finally:
        blocker.close()
    ready(rig)
    assert not [m for c in s.connections for m in c.inbound if m.get("op") == 36]
    s.add_emote(SET_A, E3, "Clap")
    settle(rig, 1)
    assert rig.changes() == [("emote.added", E3, None, "Clap")] and healed_via(rig) == ["eventapi"]
    assert_exactly_once(rig)


def test_active_set_switch_moves_the_subscription_and_stores_the_difference(rig: SevenTvRig) -> None:
    s = rig.standin
    rig.source()
    ready(rig)
    s.switch_set(USER, SET_B)
    assert s.wait_for(lambda: s.subscribed("emote_set.update", SET_B)
                      and not s.subscribed("emote_set.update", SET_A), 5)
    settle(rig, 2)
    # A has peepoHappy + KEKW, B has KEKW + Clap: one removed, one added, KEKW stays.
    assert sorted(rig.changes()) == SWITCH_DIFF
    payloads = [r[0] for r in rig.rows("SELECT payload FROM events WHERE platform = 'seventv'")]
    assert all(p["emote_set_id"] == SET_B and p["previous_emote_set_id"] == SET_A for p in payloads)
    # Changes in the new set are followed; changes in the old one are not ours any more.
    s.add_emote(SET_B, E4, "Wave")
    s.add_emote(SET_A, "01HEMOTE000000000000000009", "Other")
    settle(rig, 3)
    assert rig.changes()[-1] == ("emote.added", E4, None, "Wave")
    assert len(rig.changes()) == 3
    assert_exactly_once(rig)


def test_switch_while_the_socket_is_down_is_found_through_rest(rig: SevenTvRig) -> None:
    s = rig.standin
    rig.source()
    ready(rig)
    s.close_connection(s.open_connections()[0], 4000, "server error")
    assert s.wait_for(lambda: not s.open_connections() or len(s.connections) >= 2, 2)
    s.switch_set(USER, SET_B, dispatch=False)
    assert s.wait_for(lambda: s.subscribed("emote_set.update", SET_B)
                      and not s.subscribed("emote_set.update", SET_A), 5)
    settle(rig, 2)
    assert sorted(rig.changes()) == SWITCH_DIFF
    assert_exactly_once(rig)


def test_client_bug_close_codes_are_loud_and_back_off_long(rig: SevenTvRig,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    s = rig.standin
    rig.source(client_bug_wait_secs=1.0)
    ready(rig)
    with caplog.at_level(logging.ERROR):
        closed = time.monotonic()  # before the close: the source may see it first
        s.close_connection(s.open_connections()[0], 4009, "already subscribed")
        assert s.wait_for(lambda: len(s.connections) >= 2, 5)
    assert time.monotonic() - closed >= 1.0
    assert any("4009" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert rig.value("source_closes_total", platform="seventv", code="4009") == 1


def test_database_down_events_parked_state_saved_later_exactly_once(
        tmp_path: Path, private_pg: PostgresServer, redis_url: str, standin: SevenTvStandin) -> None:
    """The database stops: a dispatch's events are parked in Redis, the state save fails and is
    kept pending (dispatches meanwhile wait for the heal). When the database is back, the state is
    saved, the heal stores what the waiting dispatches said, the parked events are replayed: each
    change is one row."""
    from lumio_ingestd.events.retry import EventRetryWorker

    private_pg.create_database("seventv")
    rig = make_rig(tmp_path, private_pg.url("seventv"), redis_url, standin, {7: {"twitch_user_id": TWITCH}})
    try:
        s = standin
        rig.source()
        ready(rig)
        private_pg.stop()
        s.add_emote(SET_A, E3, "Clap")  # parked; the save fails
        assert wait_until(lambda: rig.value("seventv_state_saves_total", result="failed") >= 1, 10)
        s.rename_emote(SET_A, E1, "peepoSad")  # dropped: the state is not saved yet
        assert wait_until(lambda: rig.value("seventv_dispatches_total", result="not_ready") >= 1, 5)
        assert rig.value("events_persist_failures_total", outcome="parked") == 1
        private_pg.start()
        retry = EventRetryWorker(rig.redis, rig.pool, rig.metrics, rig.cfg)
        retry.start()
        try:
            assert wait_until(lambda: len(rig.changes()) == 2, 20), rig.changes()
        finally:
            retry.request_stop()
            retry.join(5)
        time.sleep(0.3)
        assert sorted(rig.changes()) == [("emote.added", E3, None, "Clap"),
                                         ("emote.renamed", E1, "peepoHappy", "peepoSad")]
        assert_exactly_once(rig)
    finally:
        rig.close()


@pytest.mark.parametrize("n, limit", [(1000, 500), (200, None)])
def test_thousand_accounts_on_as_few_sockets_as_the_limit_allows(
        tmp_path: Path, pg_url: str, redis_url: str, n: int, limit: int | None) -> None:
    with SevenTvStandin(heartbeat_interval_ms=5000, subscription_limit=limit) as s:
        accounts = []
        for i in range(n):
            user, set_id = f"01HU{i:022d}", f"01HS{i:022d}"
            s.add_set(set_id, {f"01HE{i:022d}": f"emote{i}"})
            s.add_user(user, set_id=set_id)
            accounts.append(Followed(1000 + i, user_id=user))
        rig = make_rig(tmp_path, pg_url, redis_url, s, {})
        try:
            started = time.monotonic()
            src = rig.source(accounts)
            want = math.ceil(n * 2 / limit) if limit is not None else 1  # -1: no limit, one socket
            assert s.wait_for(lambda: sum(len(c.subs) for c in s.open_connections()) == 2 * n, 60), \
                [len(c.subs) for c in s.open_connections()]
            took = time.monotonic() - started
            assert len(s.open_connections()) == want == len(src.sockets)
            assert all(c.max_subs <= (limit or 2 * n) and c.refused == 0 for c in s.connections)
            assert wait_until(lambda: rig.rows("SELECT count(*) FROM seventv_emote_sets")[0][0] == n, 60)
            print(f"\n7TV: {n} accounts, limit {limit}: {len(src.sockets)} sockets, all subscribed "
                  f"in {took:.1f}s, all baselines stored in {time.monotonic() - started:.1f}s")
            # A change to one account's set reaches it on its socket.
            s.add_emote("01HS" + f"{n - 3:022d}", E4, "Wave")
            assert wait_until(lambda: rig.changes(1000 + n - 3) == [("emote.added", E4, None, "Wave")], 10)
            assert rig.value("seventv_sockets") == want
        finally:
            rig.close()


def test_configured_set_is_pinned_and_needs_one_subscription(rig: SevenTvRig) -> None:
    s = rig.standin
    src = rig.source([Followed(8, user_id=USER, pinned_set=SET_B)])
    assert s.wait_for(lambda: s.subscribed("emote_set.update", SET_B), 5)
    assert wait_until(lambda: rig.state(8) is not None, 5)
    assert not s.subscribed("user.update", USER)
    s.switch_set(USER, SET_A, dispatch=False)
    s.add_emote(SET_B, E4, "Wave")
    assert wait_until(lambda: rig.changes(8) == [("emote.added", E4, None, "Wave")], 5)
    assert src.sockets[0].server_subs == {("emote_set.update", SET_B)}


def test_store_compare_and_set_refuses_a_stale_writer(rig: SevenTvRig) -> None:
    st = SetState(SET_A, {}, 1, USER)
    assert rig.store.save(9, st, None)
    assert not rig.store.save(9, st, None)  # a second first writer
    assert rig.store.save(9, SetState(SET_A, {}, 2, USER), 1)
    assert not rig.store.save(9, SetState(SET_A, {}, 2, USER), 1)  # computed from a stale version
    loaded = rig.store.load(9)
    assert loaded is not None and loaded.version == 2


def test_malformed_frames_are_refused_and_cost_nothing(rig: SevenTvRig) -> None:
    s = rig.standin
    src = rig.source()
    ready(rig)
    conn = s.open_connections()[0]
    for data, text in ((b"\x00\x01binary", False), (b"\xff\xfe not utf-8", True), ("not json", True),
                       ("[1, 2]", True), ('{"op": 99, "d": {}}', True),
                       ('{"op": 0, "d": {"type": "emote_set.update", "body": {"id": "../x"}}}', True),
                       (json.dumps({"op": 0, "d": {"type": "emote_set.update",
                                                   "body": {"id": SET_A, "pushed": "x"}}}), True),
                       ('{"op": 0, "d": {"type": "cosmetic.create", "body": {"id": "C1"}}}', True)):
        assert s.send_raw(conn, data, text=text)
    s.add_emote(SET_A, E3, "Clap")
    settle(rig, 1)
    assert rig.changes() == [("emote.added", E3, None, "Clap")]
    assert len(s.connections) == 1 and conn.open and src.sockets[0].connected
    bad = {r: rig.value("source_bad_frames_total", platform="seventv", reason=r)
           for r in ("binary", "not_json", "not_object", "unknown_op", "bad_dispatch", "unsupported")}
    assert bad == {"binary": 1, "not_json": 2, "not_object": 1, "unknown_op": 1, "bad_dispatch": 2,
                   "unsupported": 1}
    assert rig.value("worker_errors_total", worker="source-seventv") == 0


def test_rest_errors_delay_the_heal_and_lose_nothing(rig: SevenTvRig) -> None:
    s = rig.standin
    rig.source()
    ready(rig)
    s.rest_status = 500
    s.close_connection(s.open_connections()[0], 4006, "restart")
    assert s.wait_for(lambda: not s.open_connections(), 2)
    s.add_emote(SET_A, E3, "Clap")
    s.remove_emote(SET_A, E2)
    assert s.wait_for(lambda: len(s.connections) >= 2 and s.subscribed("emote_set.update", SET_A), 5)
    assert wait_until(lambda: rig.value("seventv_heals_total", result="failed") >= 2, 5)
    assert rig.changes() == []
    s.rest_status = None
    settle(rig, 2)
    assert sorted(rig.changes()) == [("emote.added", E3, None, "Clap"), ("emote.removed", E2, None, "KEKW")]
    assert_exactly_once(rig)


def test_a_smaller_limit_on_reconnect_moves_accounts_to_another_socket(rig: SevenTvRig) -> None:
    s = rig.standin
    s.subscription_limit = 4
    s.add_user("01HUSER0000000000000000002", twitch_id="1002", set_id=SET_B)
    src = rig.source([Followed(7, twitch_user_id=TWITCH), Followed(8, twitch_user_id="1002")])
    assert s.wait_for(lambda: s.subscribed("emote_set.update", SET_A)
                      and s.subscribed("emote_set.update", SET_B), 5)
    assert wait_until(lambda: rig.healed(7) and rig.healed(8), 10)  # both baselines stored
    assert len(src.sockets) == 1
    s.subscription_limit = 2
    s.close_connection(s.open_connections()[0], 4012, "lifetime")
    assert s.wait_for(lambda: len(s.open_connections()) == 2 and s.subscribed("emote_set.update", SET_A)
                      and s.subscribed("emote_set.update", SET_B), 5)
    assert len(src.sockets) == 2 and all(c.max_subs <= 2 for c in s.connections[1:])
    assert wait_until(lambda: rig.healed(7) and rig.healed(8), 10)
    s.add_emote(SET_A, E3, "Clap")
    s.add_emote(SET_B, E4, "Wave")
    settle(rig, 2)
    assert rig.changes(7) == [("emote.added", E3, None, "Clap")]
    assert rig.changes(8) == [("emote.added", E4, None, "Wave")]
    assert all(n == 1 for n in rig.external_ids().values())


def test_a_streamer_without_7tv_is_said_once_and_asked_rarely(rig: SevenTvRig,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    s = rig.standin
    with caplog.at_level(logging.INFO, logger="lumio_ingestd.sources.seventv"):
        src = rig.source([Followed(7, twitch_user_id=TWITCH), Followed(9, twitch_user_id="99999")],
                         missing_retry_secs=60.0)
        ready(rig)
        assert wait_until(lambda: rig.value("seventv_heals_total", result="failed") == 1, 5)
        s.close_connection(s.open_connections()[0], 4012, "lifetime")  # a reconnect heals everyone again
        assert s.wait_for(lambda: len(s.connections) >= 2 and s.subscribed("emote_set.update", SET_A), 5)
        assert wait_until(lambda: rig.value("seventv_heals_total", result="failed") == 2, 5)
    said = [r for r in caplog.records if "99999" in r.getMessage() and r.levelno >= logging.INFO]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert src.sockets[0].connected and rig.state(9) is None


def test_stop_cuts_a_slow_rest_call(rig: SevenTvRig) -> None:
    s = rig.standin
    s.rest_delay_secs = 20.0
    src = rig.source()
    assert s.wait_for(lambda: len(s.connections) >= 1, 5)
    assert wait_until(lambda: src.sockets and src.sockets[0].api.requests >= 1, 5)
    started = time.monotonic()
    rig.stop(src)
    assert time.monotonic() - started < 2.0


def test_the_status_snapshot_shows_every_socket(rig: SevenTvRig) -> None:
    from lumio_ingestd.runtime.localstate import build_snapshot

    src = rig.source()
    ready(rig)
    doc = build_snapshot(instance="t", phase="ingesting", started_at=time.time(), workers=[src])
    assert [(s["name"], s["platform"], s["state"]) for s in doc["sources"]] == [
        ("source-seventv-1", "seventv", "connected")]
    assert doc["workers"] == [{"name": "source-seventv", "alive": True, "healthy": True}]
