"""7TV dispatches sent again: a repeat changes nothing; one that disagrees with the state is healed.

Against the stand-in 7TV (EventAPI + REST on loopback), real Redis and PostgreSQL. A frame is
sent again byte for byte (the stand-in keeps every dispatch frame it sent), as 7TV may repeat one:

1. An addition sent again after the emote was renamed: no rename back, and the next heal
   stores nothing either.
2. A rename sent again after the emote was renamed back: no row; the account is healed, and
   the heal stores what the socket missed, once.
3. A removal sent again, right away and after the emote came back (with its added time, and
   with Go's zero time as the real frames carry it): no row.
4. An addition sent again after the removal: the emote is not added back.
5. One rename is one row, with the same id, whether the dispatch, the REST heal or both saw it.
6. An addition of an emote the state holds from an earlier addition (its removal and a rename
   missed): nothing from the dispatch; a heal stores what 7TV says, once.

Every test ends with an exactly-once check: external ids unique, the stored state the set as
7TV has it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.devkit.standins.seventv import ACTOR, SevenTvStandin
from lumio_ingestd.sources.seventv import SevenTvSource
from support.harness.servers import wait_until
from support.seventv import SevenTvRig, make_rig

USER, TWITCH, SET_A = "01HUSER0000000000000000001", "1001", "01HSETA0000000000000000001"
E1, E2, E3 = "01HEMOTE000000000000000001", "01HEMOTE000000000000000002", "01HEMOTE000000000000000003"
#: A pulled item's `timestamp` in the frames 7TV sends: Go's zero time.
GO_ZERO_TIME = -62135596800000


@pytest.fixture
def standin() -> Iterator[SevenTvStandin]:
    with SevenTvStandin(heartbeat_interval_ms=300) as s:
        s.add_set(SET_A, {E1: "peepoHappy", E2: "KEKW"})
        s.add_user(USER, twitch_id=TWITCH, set_id=SET_A)
        yield s


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str, standin: SevenTvStandin) -> Iterator[SevenTvRig]:
    r = make_rig(tmp_path, pg_url, redis_url, standin, {7: {"twitch_user_id": TWITCH}})
    yield r
    r.close()


def start(rig: SevenTvRig) -> SevenTvSource:
    """A source following account 7, its baseline stored and no heal due."""
    src = rig.source()
    s = rig.standin
    assert s.wait_for(lambda: s.subscribed("emote_set.update", SET_A), 10)
    assert wait_until(lambda: rig.state(7) is not None and rig.healed(7), 10)
    return src


def count(rig: SevenTvRig, n: int) -> None:
    assert wait_until(lambda: len(rig.changes(7)) == n, 5), rig.changes(7)


def heals(rig: SevenTvRig) -> float:
    return rig.value("seventv_heals_total", result="changed") + \
        rig.value("seventv_heals_total", result="unchanged")


def send_again(rig: SevenTvRig, frame: str) -> None:
    """Send `frame` on the open connection; return once the source has handled it."""
    s, handled = rig.standin, rig.total("seventv_dispatches_total")
    assert s.send_raw(s.open_connections()[0], frame)
    assert wait_until(lambda: rig.total("seventv_dispatches_total") > handled, 5)


def heal_by_reconnect(rig: SevenTvRig) -> None:
    """The connection ends (4000: reconnect at once); the new one's heal has run for account 7.
    The dispatches read before are done by then: the heal waits for the account's reader."""
    s = rig.standin
    conns, healed_before = len(s.connections), heals(rig)
    s.close_connection(s.open_connections()[0], 4000, "test")
    assert wait_until(lambda: len(s.connections) > conns and heals(rig) > healed_before
                      and rig.healed(7), 10)


def stale_healed(rig: SevenTvRig, changed_before: float) -> None:
    """One dispatch disagreed with the state, and the heal it asked for stored what 7TV says,
    without a reconnect."""
    assert wait_until(lambda: rig.value("seventv_dispatches_total", result="stale") == 1
                      and rig.value("seventv_heals_total", result="changed") > changed_before
                      and rig.healed(7), 5), rig.changes(7)
    assert len(rig.standin.connections) == 1


def vias(rig: SevenTvRig) -> list[str]:
    return [r[0] for r in rig.rows("SELECT payload->>'via' FROM events WHERE platform = 'seventv' "
                                   "ORDER BY ingested_at, id")]


def rename_ids(rig: SevenTvRig) -> list[str]:
    return [r[0] for r in rig.rows("SELECT external_id FROM events WHERE type = 'emote.renamed' "
                                   "ORDER BY ingested_at, id")]


def set_frame(t: int, **items: list[dict[str, Any]]) -> str:
    body: dict[str, Any] = {"id": SET_A, "kind": 3, "actor": ACTOR, **items}
    return json.dumps({"op": 0, "t": t, "d": {"type": "emote_set.update", "body": body}})


def assert_exactly_once(rig: SevenTvRig) -> None:
    ids = rig.external_ids()
    assert all(n == 1 for n in ids.values()), ids
    st = rig.state(7)
    assert st is not None
    assert {k: v[0] for k, v in st[1].items()} == {k: v["name"] for k, v in rig.standin.sets[SET_A].items()}


def test_an_addition_sent_again_after_a_rename_renames_nothing(rig: SevenTvRig) -> None:
    s = rig.standin
    start(rig)
    s.add_emote(SET_A, E3, "Clap")
    push = s.dispatch_frames[-1]
    s.rename_emote(SET_A, E3, "ClapClap")
    count(rig, 2)
    send_again(rig, push)
    heal_by_reconnect(rig)
    assert rig.changes(7) == [("emote.added", E3, None, "Clap"), ("emote.renamed", E3, "Clap", "ClapClap")]
    assert rig.value("seventv_dispatches_total", result="stale") == 0  # a repeat: nothing to heal
    assert_exactly_once(rig)


def test_a_rename_sent_again_after_renaming_back_adds_no_row_and_the_heal_stores_the_truth(
        rig: SevenTvRig) -> None:
    s = rig.standin
    start(rig)
    s.rename_emote(SET_A, E1, "peepoSad")
    first = s.dispatch_frames[-1]
    s.rename_emote(SET_A, E1, "peepoHappy")
    count(rig, 2)
    s.add_emote(SET_A, E3, "Clap", dispatch=False)  # a change the socket does not see
    changed = rig.value("seventv_heals_total", result="changed")
    # peepoHappy -> peepoSad again: the name fits, the time does not (sent before the rename back).
    send_again(rig, first)
    stale_healed(rig, changed)
    assert rig.changes(7) == [("emote.renamed", E1, "peepoHappy", "peepoSad"),
                              ("emote.renamed", E1, "peepoSad", "peepoHappy"),
                              ("emote.added", E3, None, "Clap")]
    assert vias(rig) == ["eventapi", "eventapi", "rest"]
    assert_exactly_once(rig)


@pytest.mark.parametrize("pulled_time", ["added_time", "go_zero_time"])
def test_a_removal_sent_again_removes_nothing(rig: SevenTvRig, pulled_time: str) -> None:
    s = rig.standin
    start(rig)
    s.add_emote(SET_A, E3, "Clap")
    s.remove_emote(SET_A, E3)
    pull = s.dispatch_frames[-1]
    count(rig, 2)
    if pulled_time == "go_zero_time":
        frame = json.loads(pull)
        frame["d"]["body"]["pulled"][0]["old_value"]["timestamp"] = GO_ZERO_TIME
        pull = json.dumps(frame)
    send_again(rig, pull)  # the emote is gone already
    s.add_emote(SET_A, E3, "Clap")  # back, added anew
    count(rig, 3)
    send_again(rig, pull)  # the removal of the emote's earlier addition
    heal_by_reconnect(rig)
    assert rig.changes(7) == [("emote.added", E3, None, "Clap"), ("emote.removed", E3, None, "Clap"),
                              ("emote.added", E3, None, "Clap")]
    # With its added time the removal is known to be the earlier one's; with none, only that it
    # was sent before the emote came back: the account is healed, and the heal finds nothing.
    assert rig.value("seventv_dispatches_total", result="stale") == (pulled_time == "go_zero_time")
    assert_exactly_once(rig)


def test_an_addition_sent_again_after_the_removal_adds_nothing(rig: SevenTvRig) -> None:
    s = rig.standin
    start(rig)
    s.add_emote(SET_A, E3, "Clap")
    push = s.dispatch_frames[-1]
    s.remove_emote(SET_A, E3)
    count(rig, 2)
    send_again(rig, push)
    heal_by_reconnect(rig)
    assert rig.changes(7) == [("emote.added", E3, None, "Clap"), ("emote.removed", E3, None, "Clap")]
    assert rig.value("seventv_dispatches_total", result="stale") == 0
    assert_exactly_once(rig)


@pytest.mark.parametrize("seen_by", ["dispatch", "rest", "both"])
def test_one_rename_is_one_row_whoever_sees_it(rig: SevenTvRig, seen_by: str) -> None:
    s = rig.standin
    src = start(rig)
    s.add_emote(SET_A, E3, "Clap")
    push = s.dispatch_frames[-1]
    count(rig, 1)
    before = rig.state(7)
    assert before is not None
    s.rename_emote(SET_A, E3, "ClapClap", dispatch=seen_by != "rest")
    if seen_by == "rest":
        heal_by_reconnect(rig)
    count(rig, 2)
    if seen_by == "both":
        # The state's save after the dispatch's row never happened (the process died in between):
        # the heal of the next run finds the rename again and computes the same row.
        rig.stop(src)
        rig.rows("UPDATE seventv_emote_sets SET emotes = %s::jsonb, version = %s WHERE account_id = 7",
                 (json.dumps(before[1]), before[2]))
        start(rig)
        assert rig.value("seventv_changes_total", change="renamed", via="rest", outcome="duplicate") == 1
    send_again(rig, push)  # the addition again, under its first name
    heal_by_reconnect(rig)
    s.rename_emote(SET_A, E3, "Clap")  # renamed back for real: a row of its own
    count(rig, 3)
    heal_by_reconnect(rig)
    assert rig.changes(7) == [("emote.added", E3, None, "Clap"), ("emote.renamed", E3, "Clap", "ClapClap"),
                              ("emote.renamed", E3, "ClapClap", "Clap")]
    first, second = rename_ids(rig)
    assert ":r0:" in first and ":r1:" in second, (first, second)
    assert_exactly_once(rig)


def test_an_addition_that_disagrees_is_healed_and_stored_once(rig: SevenTvRig) -> None:
    s = rig.standin
    start(rig)
    # 7TV: E1 removed and added again, then renamed; the socket sees none of it...
    s.remove_emote(SET_A, E1, dispatch=False)
    item = s.add_emote(SET_A, E1, "peepoSad", dispatch=False)
    s.rename_emote(SET_A, E1, "peepoGlad", dispatch=False)
    changed = rig.value("seventv_heals_total", result="changed")
    # ...but the addition, late: an emote the state has, added at another time, under another name.
    send_again(rig, set_frame(item["timestamp"], pushed=[
        {"key": "emotes", "index": 1, "type": "object", "value": item}]))
    stale_healed(rig, changed)
    assert rig.changes(7) == [("emote.removed", E1, None, "peepoHappy"),
                              ("emote.added", E1, None, "peepoGlad")]
    assert vias(rig) == ["rest", "rest"]
    assert_exactly_once(rig)
