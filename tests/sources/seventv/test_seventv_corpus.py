"""Conformance: every 7TV frame of the shared corpus, through the decoder and through the live source.

The corpus (written outside this project) is read at test time from
`../shared/corpus` next to the repository; it is never copied in. Where it is
missing, the project's own frames take its place (`support.corpus`). Every
frame must decode into a
server frame the source handles, or be refused explicitly (`BadFrame` with a
reason: client opcodes, retired v1 frames); none may raise anything else or
end the source's connection.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.sources.seventv import Followed
from lumio_ingestd.sources.seventv.protocol import (
    BadFrame,
    Dispatch,
    Hello,
    decode,
    set_update,
    user_update,
)
from support.corpus import CORPUS, SEVENTV
from support.harness.servers import wait_until
from support.seventv import SevenTvRig, make_rig

#: Who made the emote-set change, and how many frames of each outcome there are.
ACTOR = "nerixyz" if CORPUS.recorded else SEVENTV["actor"]
#: When the captured set's emote was added: before the capture's dispatch (its `t`: 2022-10-29).
ADDED_BEFORE = 1667000000000
OUTCOMES = (Counter({"Hello": 1, "Dispatch": 2, "refused:client_op": 2, "refused:legacy_v1": 7})
            if CORPUS.recorded else
            Counter({"Hello": 1, "Dispatch": 2, "refused:client_op": 2, "refused:legacy_v1": 3}))


def lines() -> list[dict[str, Any]]:
    return CORPUS.lines("seventv.jsonl")


def text(line: dict[str, Any]) -> str:
    """The source's own bytes where they are JSON, else the cleaned parse (JSONC)."""
    try:
        json.loads(line["raw"])
    except (ValueError, KeyError):
        return json.dumps(line["frame"])
    return str(line["raw"])


def test_every_frame_decodes_or_is_refused_with_a_reason() -> None:
    outcomes: Counter[str] = Counter()
    for n, line in enumerate(lines()):
        try:
            frame = decode(text(line))
        except BadFrame as bad:
            outcomes[f"refused:{bad.reason}"] += 1
            if line.get("direction") == "client->server" and "op" in line["frame"]:
                assert bad.reason == "client_op", (n, line["kind"])
            else:
                assert bad.reason == "legacy_v1", (n, line["kind"], bad)
            continue
        outcomes[type(frame).__name__] += 1
        assert line.get("direction") == "server->client", (n, line["kind"])
        if isinstance(frame, Hello):
            assert frame.heartbeat_interval_ms == line["frame"]["d"]["heartbeat_interval"]
            # This Hello names no limit (a test capture): None, one socket for all.
            assert frame.subscription_limit == line["frame"]["d"].get("subscription_limit")
        elif isinstance(frame, Dispatch):
            assert frame.t == line["frame"]["t"]
            if frame.type == "emote_set.update":
                upd = set_update(frame)
                assert upd.set_id == line["frame"]["d"]["body"]["id"]
                assert [e for e, _ in upd.pushed] == [i["value"]["id"] for i in frame.body["pushed"]]
                # A pulled item's Go zero time is "unknown", not year 1.
                assert list(upd.pulled) == [(i["old_value"]["id"], i["old_value"]["name"], None)
                                            for i in frame.body["pulled"]]
                assert list(upd.renamed) == [
                    (i["value"]["id"], i["value"]["name"], i["old_value"]["name"], i["value"]["timestamp"])
                    for i in frame.body["updated"]]
                assert upd.actor is not None and upd.actor.username == ACTOR
                assert all(entry.ts is None or entry.ts > 0 for _, entry in upd.pushed)
            else:
                assert frame.type == "user.update"
                uu = user_update(frame)
                nested = frame.body["updated"][0]["value"][0]
                assert [(s.old, s.new) for s in uu.switches] == [
                    (nested["old_value"]["id"], nested["value"]["id"])]
        else:
            pytest.fail(f"line {n} ({line['kind']}): unexpected {frame!r}")
    assert outcomes == OUTCOMES


@pytest.fixture
def corpus_ids() -> dict[str, str]:
    """The ids the corpus's dispatches name: its emote set, user, emote and the set switched to."""
    found: dict[str, str] = {}
    for line in lines():
        frame = line["frame"]
        if frame.get("op") == 0 and frame["d"]["type"] == "emote_set.update":
            found["set"] = frame["d"]["body"]["id"]
            found["emote"] = frame["d"]["body"]["pulled"][0]["old_value"]["id"]
            found["emote_name"] = frame["d"]["body"]["pulled"][0]["old_value"]["name"]
            found["final_name"] = frame["d"]["body"]["updated"][0]["value"]["name"]
        elif frame.get("op") == 0 and frame["d"]["type"] == "user.update":
            found["user"] = frame["d"]["body"]["id"]
            nested = frame["d"]["body"]["updated"][0]["value"][0]
            found["old_set"], found["new_set"] = nested["old_value"]["id"], nested["value"]["id"]
    return found


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[SevenTvRig]:
    with SevenTvStandin(heartbeat_interval_ms=500) as s:
        r = make_rig(tmp_path, pg_url, redis_url, s, {})
        yield r
        r.close()


def test_every_frame_through_the_live_source(rig: SevenTvRig, corpus_ids: dict[str, str]) -> None:
    """Each corpus frame is sent on the source's connection as 7TV would send it. The connection
    survives all of them, the refused ones are counted by reason, and the two dispatches act:
    the emote-set change becomes rows and the user.update moves the subscription."""
    s = rig.standin
    ids = corpus_ids
    assert ids["old_set"] == ids["set"]  # the capture switches away from the set it changed
    s.add_set(ids["set"], {ids["emote"]: ids["emote_name"]})
    with s._lock:  # added before the capture took it out (the stand-in's clock says today)
        s.sets[ids["set"]][ids["emote"]]["timestamp"] = ADDED_BEFORE
    s.add_set(ids["new_set"], {"01HEMOTE000000000000000077": "Okayge"})
    s.add_user(ids["user"], set_id=ids["set"])
    src = rig.source([Followed(5, user_id=ids["user"])])
    assert s.wait_for(lambda: s.subscribed("emote_set.update", ids["set"]), 5)
    assert wait_until(lambda: rig.state(5) is not None, 5)
    conn = s.open_connections()[0]
    for line in lines():
        # The user.update goes last: it moves the subscription away from the set.
        if line["kind"].startswith("op0 DISPATCH user.update"):
            continue
        assert s.send_raw(conn, text(line))
    assert wait_until(lambda: len(rig.changes(5)) >= 1, 5)
    with s._lock:  # 7TV's own state after that change (what a heal would find)
        s.sets[ids["set"]][ids["emote"]]["timestamp"] = 1667059799105
    user_line = next(li for li in lines() if li["kind"].startswith("op0 DISPATCH user.update"))
    assert s.send_raw(conn, text(user_line))
    assert s.wait_for(lambda: s.subscribed("emote_set.update", ids["new_set"])
                      and not s.subscribed("emote_set.update", ids["set"]), 5)
    assert wait_until(lambda: (st := rig.state(5)) is not None and st[0] == ids["new_set"], 5)
    assert len(s.connections) == 1 and conn.open, "a corpus frame ended the connection"
    assert src.sockets[0].connected
    assert rig.value("source_bad_frames_total", platform="seventv", reason="client_op") == \
        OUTCOMES["refused:client_op"]
    assert rig.value("source_bad_frames_total", platform="seventv", reason="legacy_v1") == \
        OUTCOMES["refused:legacy_v1"]
    assert rig.value("worker_errors_total", worker="source-seventv") == 0
    changes = rig.changes(5)
    # The capture pulls "Chatterino", pushes it back as "Chatterinoge" (a new added time) and renames
    # it to "Chatterino": out and in again; then the switch: it leaves, Okayge comes.
    assert changes == [("emote.removed", ids["emote"], None, ids["emote_name"]),
                       ("emote.added", ids["emote"], None, ids["final_name"]),
                       ("emote.added", "01HEMOTE000000000000000077", None, "Okayge"),
                       ("emote.removed", ids["emote"], None, ids["final_name"])]
    ext = rig.external_ids()
    assert all(n == 1 for n in ext.values())
