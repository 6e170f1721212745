"""7TV against the stand-in (EventAPI + REST on loopback), real Redis and PostgreSQL: the REST
answers' size caps, heals off the socket's reader, and the identity of a rename.

1. A full set (1,000 emotes in the real v3 shape: about 1.6 MB per answer) is fetched, stored
   as the baseline and followed; an answer above its endpoint's cap is refused, counted, named
   in the log, and the socket's other account is not held up by it.
2. A REST answer trickled a byte at a time for one account delays neither the dispatches of
   the socket's other account nor its heartbeats: heals run on their own thread, and every
   call ends at its whole-request deadline.
3. A rename dispatch sent again after later changes to the set (the emote renamed further,
   other emotes changed) is not a second `emote.renamed` row; three real renames back and
   forth are three rows.

Every test ends with an exactly-once check.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.sources.seventv import api
from support.harness.servers import wait_until
from support.seventv import SevenTvRig, make_rig

USER_A, TWITCH_A, SET_A = "01HUSER0000000000000000001", "1001", "01HSETA0000000000000000001"
USER_B, TWITCH_B, SET_B = "01HUSER0000000000000000002", "1002", "01HSETB0000000000000000002"
E1, E2, E3 = "01HEMOTE000000000000000001", "01HEMOTE000000000000000002", "01HEMOTE000000000000000003"


def emote_id(i: int) -> str:
    return f"01HFULL{i:019d}"


@pytest.fixture
def standin() -> Iterator[SevenTvStandin]:
    with SevenTvStandin(heartbeat_interval_ms=300) as s:
        s.add_set(SET_A, {E1: "peepoHappy", E2: "KEKW"})
        s.add_user(USER_A, twitch_id=TWITCH_A, set_id=SET_A)
        yield s


def two_accounts(tmp_path: Path, pg_url: str, redis_url: str, standin: SevenTvStandin) -> SevenTvRig:
    return make_rig(tmp_path, pg_url, redis_url, standin,
                    {7: {"twitch_user_id": TWITCH_A}, 8: {"twitch_user_id": TWITCH_B}})


def stored_names(rig: SevenTvRig, account: int) -> dict[str, str] | None:
    st = rig.state(account)
    return None if st is None else {k: v[0] for k, v in st[1].items()}


def changed(rig: SevenTvRig, n: int) -> bool:
    return len(rig.changes(7)) == n


def assert_exactly_once(rig: SevenTvRig, *accounts: int) -> None:
    ids = rig.external_ids()
    assert all(n == 1 for n in ids.values()), ids
    for account in accounts:
        st = rig.state(account)
        assert st is not None
        assert stored_names(rig, account) == {k: v["name"] for k, v in rig.standin.sets[st[0]].items()}


def test_a_full_set_is_fetched_stored_and_followed(tmp_path: Path, pg_url: str, redis_url: str,
                                                   standin: SevenTvStandin) -> None:
    standin.add_set(SET_B, {emote_id(i): f"emote{i}" for i in range(1000)})
    standin.add_user(USER_B, twitch_id=TWITCH_B, set_id=SET_B)
    body = standin._rest(f"/v3/users/twitch/{TWITCH_B}")[1]
    size = len(json.dumps(body).encode())
    assert 1_500_000 < size < 2_000_000, size  # the real answer's size: above the old 1 MiB cap
    rig = two_accounts(tmp_path, pg_url, redis_url, standin)
    try:
        rig.source()
        assert standin.wait_for(lambda: standin.subscribed("emote_set.update", SET_B), 15)
        assert wait_until(lambda: (names := stored_names(rig, 8)) is not None and len(names) == 1000, 15)
        standin.rename_emote(SET_B, emote_id(500), "renamedOne")
        standin.add_emote(SET_B, E3, "Clap")
        assert wait_until(lambda: len(rig.changes(8)) == 2, 10), rig.changes(8)
        assert rig.changes(8) == [("emote.renamed", emote_id(500), "emote500", "renamedOne"),
                                  ("emote.added", E3, None, "Clap")]
        assert rig.value("seventv_api_errors_total", endpoint="users_twitch", reason="too_large") == 0
        assert_exactly_once(rig, 7, 8)
    finally:
        rig.close()


def test_an_answer_above_its_cap_is_refused_counted_and_named(
        tmp_path: Path, pg_url: str, redis_url: str, standin: SevenTvStandin,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    standin.add_set(SET_B, {emote_id(i): f"emote{i}" for i in range(200)})  # about 330 KB
    standin.add_user(USER_B, twitch_id=TWITCH_B, set_id=SET_B)
    monkeypatch.setitem(api.MAX_BYTES, "users_twitch", 100_000)
    rig = two_accounts(tmp_path, pg_url, redis_url, standin)
    try:
        with caplog.at_level(logging.WARNING, logger="lumio_ingestd.sources.seventv.follow"):
            rig.source()
            assert wait_until(lambda: rig.value("seventv_api_errors_total", endpoint="users_twitch",
                                                reason="too_large") >= 2, 10)
        said = [r.getMessage() for r in caplog.records if "account 8" in r.getMessage()]
        assert any(f"users/twitch/{TWITCH_B}" in m and "more than the 100000" in m for m in said), said
        # The other account on the socket is followed as usual.
        assert standin.wait_for(lambda: standin.subscribed("emote_set.update", SET_A), 10)
        assert wait_until(lambda: stored_names(rig, 7) is not None, 10)
        standin.add_emote(SET_A, E3, "Clap")
        assert wait_until(lambda: rig.changes(7) == [("emote.added", E3, None, "Clap")], 10)
        assert rig.state(8) is None and rig.changes(8) == []
        assert_exactly_once(rig, 7)
    finally:
        rig.close()


def test_a_trickled_answer_holds_up_no_other_account(tmp_path: Path, pg_url: str, redis_url: str,
                                                   standin: SevenTvStandin) -> None:
    standin.add_set(SET_B, {E3: "Clap"})
    standin.add_user(USER_B, twitch_id=TWITCH_B, set_id=SET_B)
    standin.trickle_paths.add(f"/v3/users/twitch/{TWITCH_B}")
    standin.trickle_byte_secs = 0.2
    rig = two_accounts(tmp_path, pg_url, redis_url, standin)
    try:
        src = rig.source()
        assert standin.wait_for(lambda: standin.subscribed("emote_set.update", SET_A), 10)
        assert wait_until(lambda: stored_names(rig, 7) is not None, 10)
        # Account 8's answer now trickles; each change of account 7 is stored within a second.
        for i, name in enumerate(("a1", "a2", "a3", "a4")):
            started = time.monotonic()
            standin.rename_emote(SET_A, E1, name)
            assert wait_until(functools.partial(changed, rig, i + 1), 5)
            took = time.monotonic() - started
            assert took < 1.0, (name, took)
            time.sleep(0.8)
        assert rig.state(8) is None  # never healed: every try ends at its deadline
        assert rig.value("seventv_api_errors_total", endpoint="users_twitch", reason="deadline") >= 1
        assert src.sockets[0].connected and len(standin.connections) == 1  # heartbeats read in time
        assert_exactly_once(rig, 7)
    finally:
        rig.close()


def test_a_rename_sent_again_after_later_changes_is_not_stored_twice(
        tmp_path: Path, pg_url: str, redis_url: str, standin: SevenTvStandin) -> None:
    rig = make_rig(tmp_path, pg_url, redis_url, standin, {7: {"twitch_user_id": TWITCH_A}})
    try:
        rig.source()
        assert standin.wait_for(lambda: standin.subscribed("emote_set.update", SET_A), 10)
        assert wait_until(lambda: stored_names(rig, 7) is not None, 10)
        conn = standin.open_connections()[0]
        sent: list[str] = []
        real_send = standin._send

        def keep(c: object, data: str | bytes, *, text: bool = True) -> bool:
            if isinstance(data, str) and '"op": 0' in data:
                sent.append(data)
            return real_send(c, data, text=text)  # type: ignore[arg-type]

        standin._send = keep  # type: ignore[method-assign]
        standin.rename_emote(SET_A, E2, "KEKWait")
        assert wait_until(lambda: len(rig.changes(7)) == 1, 5)
        first = sent[-1]
        standin.add_emote(SET_A, E3, "Clap")  # another emote changes
        standin.rename_emote(SET_A, E2, "KEKWhat")  # and this one is renamed further
        assert wait_until(lambda: len(rig.changes(7)) == 3, 5)
        standin.send_raw(conn, first)  # the first rename again, after both
        assert wait_until(lambda: rig.value("seventv_dispatches_total", result="stale") == 1, 5)
        time.sleep(0.5)  # the heal it asks for finds the set as stored
        assert rig.changes(7) == [("emote.renamed", E2, "KEKW", "KEKWait"), ("emote.added", E3, None, "Clap"),
                                  ("emote.renamed", E2, "KEKWait", "KEKWhat")]
        # Renamed back and forth for real: every step is a row of its own.
        for name in ("KEKWait", "KEKWhat", "KEKWait"):
            standin.rename_emote(SET_A, E2, name)
        assert wait_until(lambda: len(rig.changes(7)) == 6, 5), rig.changes(7)
        standin.send_raw(conn, first)  # the first rename again: KEKW is not the name now
        time.sleep(0.5)
        assert len(rig.changes(7)) == 6
        assert_exactly_once(rig, 7)
    finally:
        rig.close()
