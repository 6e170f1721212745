"""Conformance: every StreamElements frame of the shared corpus, through the parser and the live source.

The corpus (written outside this project) is read at test time from
`../shared/corpus` next to the repository; it is never copied in. Where it is
missing, the project's own frames take its place (`support.corpus`). Every
server frame must parse, and
every `message` must become an event or be refused explicitly (a topic not
stored, a document without `_id`); nothing may raise anything else. The
"DATA ONLY" lines (inner `data` of a topic's message) are wrapped in a
message of their topic. Through the live source every server frame but
`reconnect` (which would drive a real hand-off with a token the stand-in never
issued) is sent over the socket with its room set to the account's; the
source stays up, stores exactly the frames that map to events, and counts
every other one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.devkit.standins.streamelements import AstroStandin, tip_doc
from lumio_ingestd.sources.base import BadFrame
from lumio_ingestd.sources.streamelements.protocol import Frame, map_message, parse_frame, parse_token
from support import dbname_of
from support.corpus import CORPUS, SE_TIP
from support.harness.servers import PostgresServer, wait_until
from support.streamelements import ROOM, TOKEN, SeRig, make_rig

#: What the corpus's stored-topic messages must become: (type, external_id), and the tip's time.
if CORPUS.recorded:
    EXPECTED_EVENTS = {
        ("activity.follow", "65ce2539b1585c5f909a91e1"),
        ("tip", "67b5f39d07ecd4c594e60f73"),
        ("tip.moderation", "67b5f39d07ecd4c594e60f73:moderation:pending:2025-02-19T15:07:17.099Z"),
        ("tip.moderation", "67b5f39d07ecd4c594e60f73:moderation:allowed:2025-02-19T15:07:25.924Z"),
    }
    TIP_CREATED = "2025-02-19T15:07:09.302000+00:00"
else:
    EXPECTED_EVENTS = {
        ("activity.follow", "own00000000000000follow1"),
        ("tip", SE_TIP["id"]),
        ("tip.moderation", f"{SE_TIP['id']}:moderation:pending:{SE_TIP['pending_at']}"),
        ("tip.moderation", f"{SE_TIP['id']}:moderation:allowed:{SE_TIP['allowed_at']}"),
    }
    TIP_CREATED = SE_TIP["created_at"].replace("Z", "000+00:00")


def lines() -> list[dict[str, Any]]:
    return CORPUS.lines("streamelements.jsonl")


def server_frames() -> list[tuple[str, dict[str, Any]]]:
    """(kind, frame) of every server->client line; DATA ONLY lines wrapped in their topic's message."""
    out = []
    for line in lines():
        if line.get("direction") != "server->client":
            continue
        frame = line["frame"]
        if line["kind"].startswith("astro DATA ONLY"):
            match = re.search(r"'([a-z0-9_.]+)' message", line["kind"])
            assert match, line["kind"]
            frame = {"id": "01DATAONLY", "ts": "2025-01-15T14:30:00Z", "type": "message",
                     "topic": match.group(1), "room": "corpus-room", "data": frame}
        out.append((line["kind"], frame))
    return out


def outcome(frame: Frame) -> str:
    if frame.type != "message":
        return frame.type
    try:
        mapped = map_message(42, frame, keep_pii=False)
    except BadFrame as exc:
        return f"refused:{exc.reason}"
    return f"event:{mapped.event.type}"


def test_every_corpus_frame_parses_and_every_message_maps_or_is_refused_explicitly() -> None:
    seen: dict[str, int] = {}
    events = set()
    for line in lines():
        if line.get("direction") == "client->server":  # the requests parse as frames too
            frame = parse_frame(json.dumps(line["frame"]).encode())
            assert frame.type in ("subscribe", "unsubscribe")
            if frame.type == "subscribe":
                assert parse_token(json.dumps(frame.data), "corpus").token_type == "jwt"
    for kind, raw in server_frames():
        frame = parse_frame(json.dumps(raw).encode())
        result = outcome(frame)
        seen[result] = seen.get(result, 0) + 1
        assert result.startswith(("event:", "refused:unsupported", "refused:shape", "welcome", "response",
                                  "reconnect")), (kind, result)
        if result.startswith("event:"):
            mapped = map_message(42, frame, keep_pii=False)
            ev = mapped.event
            events.add((ev.type, ev.external_id))
            text = json.dumps(ev.payload)
            assert "@" not in text and '"geo"' not in text and '"email"' not in text, kind
            if ev.type.startswith("tip"):
                assert mapped.pii_removed == 2
                assert ev.payload["amount"] == 4.2 and ev.payload["currency"] == "USD"
                assert ev.created_at.isoformat() == TIP_CREATED
    assert events == EXPECTED_EVENTS
    # The generic activity example has no `_id`: refused, not guessed.
    assert seen["refused:shape"] == 1
    assert seen["welcome"] == 1 and seen["reconnect"] == 1 and seen["response"] == 2
    assert sum(seen.values()) == len(server_frames())


@pytest.fixture
def astro() -> Iterator[AstroStandin]:
    with AstroStandin(token=TOKEN) as a:
        yield a


def test_every_corpus_frame_through_the_live_source(tmp_path: Path, pg_server: PostgresServer,
                                                    pg_dsn: str, redis_url: str, astro: AstroStandin) -> None:
    frames = [f for _, f in server_frames() if f.get("type") != "reconnect"]
    rig: SeRig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, astro,
                          topics="channel.tips,channel.activities,channel.tips.moderation")
    try:
        src = rig.source()
        src.start()
        assert astro.wait_for(lambda: astro.subscribed("channel.tips", "channel.activities",
                                                       "channel.tips.moderation"), 10)
        for frame in frames:
            frame = dict(frame)
            if "room" in frame:
                frame["room"] = ROOM
            astro.send_raw(json.dumps(frame))
        astro.publish("channel.tips", ROOM, tip_doc("sentinel", ROOM))
        assert wait_until(lambda: ("tip", "sentinel") in rig.stored(), 10)
        assert src.alive and len(astro.connections) == 1
        assert dict(rig.stored()) == {**{e: 1 for e in EXPECTED_EVENTS}, ("tip", "sentinel"): 1}
        refused = sum(rig.value("source_bad_frames_total", platform="streamelements", reason=r)
                      for r in ("shape", "unsupported", "room", "time", "json"))
        duplicates = rig.value("source_duplicates_total", platform="streamelements")
        controls = sum(1 for f in frames if f.get("type") in ("welcome", "response"))
        # Every frame is an event, a control frame, refused (counted) or a repeated frame id.
        assert refused + duplicates + controls + len(EXPECTED_EVENTS) == len(frames)
    finally:
        rig.close()
