"""The 7TV protocol and mapping (pure): frames, dispatch bodies, diff, external ids, REST bodies."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from lumio_ingestd.sources.seventv.protocol import (
    MAX_REMOVED,
    Ack,
    BadFrame,
    BadResponse,
    Change,
    Context,
    Dispatch,
    EndOfStream,
    Entry,
    ErrorFrame,
    Heartbeat,
    Hello,
    Reconnect,
    SetState,
    carry_known,
    decode,
    diff,
    emote_set,
    external_id,
    judge_update,
    removed_after,
    resume,
    set_update,
    subscribe,
    to_event,
    twitch_user,
    unsubscribe,
    user_active_set,
    user_update,
)

SET = "01HSET00000000000000000001"
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def frame(op: int, d: Any = None, **extra: Any) -> str:
    return json.dumps({"op": op, "t": 1767000000000, "d": d, **extra})


def test_server_frames_decode() -> None:
    hello = decode(frame(1, {"heartbeat_interval": 45000, "session_id": "abc", "subscription_limit": 500}))
    assert hello == Hello(45000, "abc", 500)
    unlimited = decode(frame(1, {"heartbeat_interval": 45000, "session_id": "abc", "subscription_limit": -1}))
    assert isinstance(unlimited, Hello) and unlimited.subscription_limit is None
    assert decode(frame(2, {"count": 3})) == Heartbeat(3)
    assert decode(frame(4, {})) == Reconnect("")
    ack = decode(frame(5, {"command": "RESUME", "data": {"success": False}}))
    assert ack == Ack("RESUME", {"success": False})
    assert decode(frame(6, {"message": "nope"})) == ErrorFrame("nope")
    assert decode(frame(7, {"code": 4012, "message": "bye"})) == EndOfStream(4012, "bye")
    d = decode(frame(0, {"type": "emote_set.update", "body": {"id": SET}}))
    assert d == Dispatch("emote_set.update", 1767000000000, {"id": SET})


@pytest.mark.parametrize("data, reason", [
    (b"{nope", "not_json"),
    (b"\xff\xfe", "not_json"),
    (b"[1, 2]", "not_object"),
    (b'{"op": "1"}', "bad_op"),
    (b'{"op": 1, "d": []}', "bad_payload"),
    (b'{"op": 99}', "unknown_op"),
    (b'{"op": 35, "d": {}}', "client_op"),
    (b'{"action": "ping"}', "legacy_v1"),
    (b'{"x": 1}', "no_op"),
    (b'{"op": 1, "d": {"heartbeat_interval": 0, "session_id": "a"}}', "bad_hello"),
    (b'{"op": 1, "d": {"heartbeat_interval": 1000}}', "bad_hello"),
    (b'{"op": 1, "d": {"heartbeat_interval": 1000, "session_id": "a", "subscription_limit": "x"}}',
     "bad_hello"),
    (b'{"op": 0, "d": {"body": {}}}', "bad_dispatch"),
    (b'{"op": 0, "d": {"type": "x", "body": []}}', "bad_dispatch"),
    (b"x" * (1024 * 1024 + 1), "too_large"),
])
def test_bad_frames_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(BadFrame) as info:
        decode(data)
    assert info.value.reason == reason


def test_binary_frames_are_refused() -> None:
    with pytest.raises(BadFrame) as info:
        decode(b"{}", binary=True)
    assert info.value.reason == "binary"


def test_client_frames() -> None:
    assert json.loads(subscribe("emote_set.update", SET)) == {
        "op": 35, "d": {"type": "emote_set.update", "condition": {"object_id": SET}}}
    assert json.loads(unsubscribe("user.update", "U1"))["op"] == 36
    assert json.loads(resume("s1")) == {"op": 34, "d": {"session_id": "s1"}}


def dispatch(body: dict[str, Any], kind: str = "emote_set.update") -> Dispatch:
    d = decode(frame(0, {"type": kind, "body": body}))
    assert isinstance(d, Dispatch)
    return d


def test_set_update_reads_pushed_pulled_updated_and_skips_bad_items() -> None:
    upd = set_update(dispatch({"id": SET, "actor": {"id": "A1", "username": "ann"}, "pushed": [
        {"key": "emotes",
         "value": {"id": "E1", "name": "Clap", "timestamp": 1767000000000, "actor_id": "A1"}},
        {"key": "emotes", "value": {"id": "E2"}},  # no name: skipped, said so
        {"key": "other", "value": {"id": "E9", "name": "x"}},  # not an emote: ignored
    ], "pulled": [{"key": "emotes", "old_value": {"id": "E3", "name": "Old", "timestamp": -62135596800000}}],
        "updated": [{"key": "emotes", "old_value": {"id": "E4", "name": "a"},
                     "value": {"id": "E4", "name": "b"}}]}))
    assert upd.pushed == (("E1", Entry("Clap", 1767000000000, "A1")),)
    assert upd.pulled == (("E3", "Old", None),)  # Go's zero time: unknown
    assert upd.renamed == (("E4", "b", "a", None),)
    assert upd.actor is not None and upd.actor.username == "ann"
    assert len(upd.skipped) == 1
    with pytest.raises(BadFrame):
        set_update(dispatch({"id": "../x"}))
    with pytest.raises(BadFrame):
        set_update(dispatch({"id": SET, "pushed": {"key": "emotes"}}))


def test_user_update_reads_set_switches_both_shapes() -> None:
    uu = user_update(dispatch({"id": "U1", "updated": [{"key": "connections", "nested": True, "value": [
        {"key": "emote_set", "old_value": {"id": "S1"}, "value": {"id": "S2"}},
        {"key": "emote_set_id", "old_value": "S2", "value": "S3"},
        {"key": "display_name", "old_value": "a", "value": "b"}]}]}, "user.update"))
    assert [(s.old, s.new) for s in uu.switches] == [("S1", "S2"), ("S2", "S3")]
    assert user_update(dispatch({"id": "U1", "updated": [{"key": "username"}]}, "user.update")).switches == ()


def test_diff_one_change_per_emote() -> None:
    old = {"E1": Entry("a", 1), "E2": Entry("b", 2), "E3": Entry("c", 3), "E4": Entry("d", 4)}
    new = {"E1": Entry("a", 1), "E2": Entry("B", 2), "E4": Entry("d", 9), "E5": Entry("e", 5)}
    assert diff(old, new) == [
        Change("renamed", "E2", "B", old_name="b", ts=2),
        Change("removed", "E3", "c", ts=3),
        Change("removed", "E4", "d", ts=4), Change("added", "E4", "d", ts=9),  # out and in again
        Change("added", "E5", "e", ts=5),
    ]
    # A switch to another set: added times differ by nature; only names count.
    assert [c.kind for c in diff(old, new, compare_ts=False)] == ["renamed", "removed", "added"]
    assert diff(old, old) == []


def test_a_duplicate_push_changes_nothing() -> None:
    emotes = {"E1": Entry("Clap", 5, "A1")}
    upd = set_update(dispatch({"id": SET, "pushed": [
        {"key": "emotes", "value": {"id": "E1", "name": "Clap"}}]}))
    judged = judge_update(SetState(SET, emotes, 1), upd, None)
    assert diff(emotes, judged.emotes) == [] and judged.repeats and not judged.disagreements


#: A set with E1 "A" (added at 100, renamed once, last dispatch at 150) and E9 removed (added at 50).
JUDGED_STATE = SetState(SET, {"E1": Entry("A", 100, "U1", 1, 150)}, 3, removed={"E9": 50})


def item(emote_id: str, name: str, ts: int | None) -> dict[str, Any]:
    return {"id": emote_id, "name": name, **({"timestamp": ts} if ts is not None else {})}


def pushed(emote_id: str, name: str, ts: int | None) -> dict[str, Any]:
    return {"pushed": [{"key": "emotes", "value": item(emote_id, name, ts)}]}


def pulled(emote_id: str, name: str, ts: int | None) -> dict[str, Any]:
    """None: Go's zero time, as 7TV sends it."""
    old = item(emote_id, name, ts if ts is not None else -62135596800000)
    return {"pulled": [{"key": "emotes", "old_value": old}]}


def updated(emote_id: str, old: str | None, new: str, ts: int | None) -> dict[str, Any]:
    value = item(emote_id, new, ts)
    return {"updated": [{"key": "emotes", "value": value,
                         **({"old_value": dict(value, name=old)} if old is not None else {})}]}


@pytest.mark.parametrize("body, t, verdict", [
    # Additions: of the emote as the set has it, of an earlier addition, of a removed one.
    (pushed("E1", "Z", 100), 300, "repeat"),  # its first name: renamed since
    (pushed("E1", "A", 90), 300, "repeat"),
    (pushed("E1", "A", 110), 300, "disagree"),  # added again: the removal in between missed
    (pushed("E1", "A", None), 300, "repeat"),
    (pushed("E1", "B", None), 300, "disagree"),
    (pushed("E9", "Old", 50), 300, "repeat"),  # removed since
    (pushed("E9", "Old", 40), 300, "repeat"),
    (pushed("E9", "Old", 60), 300, "apply"),  # added anew
    (pushed("E9", "Old", None), 300, "disagree"),
    (pushed("E5", "New", 300), 300, "apply"),
    # Removals.
    (pulled("E1", "A", None), 300, "apply"),
    (pulled("E1", "A", 100), 300, "apply"),
    (pulled("E1", "A", 90), 300, "repeat"),  # of an earlier addition
    (pulled("E1", "A", 110), 300, "disagree"),
    (pulled("E1", "B", None), 300, "disagree"),
    (pulled("E1", "A", None), 150, "disagree"),  # sent no later than its last rename
    (pulled("E9", "Old", None), 300, "repeat"),
    (pulled("E7", "Gone", None), 300, "disagree"),
    # Renames.
    (updated("E1", "A", "B", 100), 300, "apply"),
    (updated("E1", "X", "A", 100), 300, "repeat"),  # its name now
    (updated("E1", "X", "B", 100), 300, "disagree"),  # from another name
    (updated("E1", None, "B", 100), 300, "disagree"),  # from an unknown name
    (updated("E1", "A", "B", 100), 150, "disagree"),  # sent before its last rename
    (updated("E1", "A", "B", 100), 120, "disagree"),
    (updated("E1", "A", "B", None), None, "apply"),  # no times to go by
    (updated("E1", "A", "B", 90), 300, "repeat"),  # of an earlier addition
    (updated("E1", "A", "B", 110), 300, "disagree"),
    (updated("E9", "Old", "New", 50), 300, "repeat"),  # removed since
    (updated("E7", "Old", "New", 70), 300, "disagree"),
])
def test_judge_update_repeats_applies_or_disagrees(body: dict[str, Any], t: int | None, verdict: str) -> None:
    upd = set_update(dispatch({"id": SET, **body}))
    judged = judge_update(JUDGED_STATE, upd, t)
    changes = diff(JUDGED_STATE.emotes, judged.emotes)
    assert (verdict == "apply") == bool(changes)
    assert (verdict == "repeat") == bool(judged.repeats)
    assert (verdict == "disagree") == bool(judged.disagreements)
    if verdict != "apply":
        assert judged.emotes == JUDGED_STATE.emotes and judged.removed == JUDGED_STATE.removed


def test_judge_update_keeps_counts_times_and_removals() -> None:
    state = JUDGED_STATE
    renamed = judge_update(state, set_update(dispatch({"id": SET, **updated("E1", "A", "B", 100)})), 300)
    assert renamed.emotes["E1"] == Entry("B", 100, "U1", 2, 300)
    removed = judge_update(state, set_update(dispatch({"id": SET, **pulled("E1", "A", None)})), 300)
    assert removed.emotes == {} and list(removed.removed.items()) == [("E9", 50), ("E1", 100)]
    back = judge_update(state, set_update(dispatch({"id": SET, **pushed("E9", "Old", 60)})), 300)
    assert back.emotes["E9"] == Entry("Old", 60, None, 0, 300) and back.removed == {}
    # One body that takes an emote out, puts it back and renames it (7TV's own capture): removed
    # and added, no rename counted (a REST snapshot of the set would not count one either).
    body = {**pulled("E1", "A", None), **pushed("E1", "Tmp", 300), **updated("E1", "Tmp", "C", 300)}
    judged = judge_update(state, set_update(dispatch({"id": SET, **body})), 300)
    assert judged.emotes["E1"] == Entry("C", 300, None, 0, 300)
    assert [c.kind for c in diff(state.emotes, judged.emotes)] == ["removed", "added"]
    # One item that disagrees: nothing of the body, not even its good items.
    body = {**pushed("E5", "New", 300), **updated("E1", "X", "B", 100)}
    judged = judge_update(state, set_update(dispatch({"id": SET, **body})), 300)
    assert judged.emotes == state.emotes and len(judged.disagreements) == 1


def test_removals_are_bounded_oldest_first() -> None:
    emotes = {f"E{i}": Entry(f"n{i}", i + 1) for i in range(MAX_REMOVED + 3)}
    state = SetState(SET, emotes, 1)
    rest = removed_after(state, {})
    assert len(rest) == MAX_REMOVED and next(iter(rest)) == "E3"
    # An emote back in the set is no longer a removal.
    assert "E5" not in removed_after(SetState(SET, {}, 2, removed=rest), {"E5": Entry("n5", 99)})


def test_a_push_sent_again_after_a_rename_is_one_rename_by_dispatch_and_by_rest() -> None:
    """The sequence that once renamed back: E1 "A" pushed, renamed A -> B, the push again."""
    start = SetState(SET, {}, 1)
    push = set_update(dispatch({"id": SET, **pushed("E1", "A", 100)}))
    added = judge_update(start, push, 100)
    after_add = SetState(SET, added.emotes, 2)
    rename = set_update(dispatch({"id": SET, **updated("E1", "A", "B", 100)}))
    by_dispatch = judge_update(after_add, rename, 200)
    by_rest = carry_known(after_add.emotes, {"E1": Entry("B", 100)})
    assert [external_id(SET, c, 2) for c in diff(after_add.emotes, by_dispatch.emotes)] == \
        [external_id(SET, c, 2) for c in diff(after_add.emotes, by_rest)]
    assert by_dispatch.emotes["E1"].renames == by_rest["E1"].renames == 1
    after_rename = SetState(SET, by_dispatch.emotes, 3)
    again = judge_update(after_rename, push, 100)
    assert diff(after_rename.emotes, again.emotes) == [] and again.repeats


def test_dispatch_and_rest_diff_of_one_change_give_one_external_id() -> None:
    stored = {"E1": Entry("Clap", 5), "E2": Entry("KEKW", 6)}
    upd = set_update(dispatch({"id": SET, "pushed": [
        {"key": "emotes", "value": {"id": "E3", "name": "Wave", "timestamp": 7}}], "updated": [
        {"key": "emotes", "old_value": {"id": "E1", "name": "Clap"},
         "value": {"id": "E1", "name": "Clap2"}}]}))
    by_dispatch = diff(stored, judge_update(SetState(SET, stored, 4), upd, 8).emotes)
    rest_snapshot = {"E1": Entry("Clap2", 5), "E2": Entry("KEKW", 6), "E3": Entry("Wave", 7)}
    by_rest = diff(stored, rest_snapshot)
    assert [external_id(SET, c, 4) for c in by_dispatch] == [external_id(SET, c, 4) for c in by_rest]
    # Another set, other names, another rename of the emote before it: another id (a separate
    # change). A rename's id does not depend on the state version it applies to (the same rename
    # seen again after other changes is the same row); an addition's does.
    first = by_rest[0]
    assert first.kind == "renamed"
    assert external_id(SET, first, 4) == external_id(SET, first, 5)
    assert len({external_id(SET, first, 4), external_id("01HOTHER", first, 4),
                external_id(SET, Change("renamed", "E1", "Clap3", old_name="Clap", ts=5), 4),
                external_id(SET, Change("renamed", "E1", "Clap2", old_name="Clap", ts=5, renames=1), 4),
                external_id(SET, Change("renamed", "E1", "Clap2", old_name="Clap", ts=9), 4)}) == 5
    added = by_rest[1]
    assert added.kind == "added" and external_id(SET, added, 4) != external_id(SET, added, 5)
    assert len(external_id("S" * 64, Change("renamed", "E" * 64, "n", "o"), 10**12)) <= 256


def test_to_event_payload() -> None:
    ctx = Context(SET, 3, AT, "eventapi", previous_set_id="01HPREV")
    ev = to_event(7, Change("renamed", "E1", "new", old_name="old", ts=1767000000000, actor_id="A9"), ctx)
    assert (ev.platform, ev.type, ev.account_id, ev.created_at, ev.user_id) == (
        "seventv", "emote.renamed", 7, AT, "A9")
    assert ev.payload["old_name"] == "old" and ev.payload["name"] == "new"
    assert ev.payload["emote_set_id"] == SET and ev.payload["previous_emote_set_id"] == "01HPREV"
    assert ev.payload["emote_added_at"] == "2025-12-29T09:20:00Z"
    assert ev.external_id == external_id(SET, Change("renamed", "E1", "new", old_name="old",
                                                      ts=1767000000000), 3)
    removed = to_event(7, Change("removed", "E1", "x", actor_id="A9"), Context(SET, 3, AT, "rest"))
    assert removed.payload["actor"] is None and "old_name" not in removed.payload


def test_rest_bodies() -> None:
    assert emote_set({"id": SET, "emotes": None}) == (SET, {})
    assert emote_set({"id": SET, "emotes": [{"id": "E1", "name": "a", "timestamp": 3, "actor_id": "A"}]}) == (
        SET, {"E1": Entry("a", 3, "A")})
    bads: list[object] = [[], {"emotes": []}, {"id": SET, "emotes": {}},
                          {"id": SET, "emotes": [{"id": "E1"}]}]
    for bad in bads:
        with pytest.raises(BadResponse):
            emote_set(bad)
    assert twitch_user({"id": "1", "emote_set_id": "S1", "user": {"id": "U1"}}) == ("U1", "S1")
    assert twitch_user({"id": "1", "emote_set": {"id": "S2"}, "user": {"id": "U1"}}) == ("U1", "S2")
    assert twitch_user({"id": "1", "user": {"id": "U1"}}) == ("U1", None)
    with pytest.raises(BadResponse):
        twitch_user({"id": "1"})
    assert user_active_set({"connections": [{"platform": "YOUTUBE", "emote_set_id": "Y"},
                                            {"platform": "TWITCH", "emote_set_id": "T"}]}) == "T"
    assert user_active_set({"connections": [{"platform": "KICK", "emote_set_id": "K"}]}) == "K"
    assert user_active_set({"connections": None}) is None
