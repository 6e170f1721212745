"""Kick: another chatroom's chat and events are never stored under the account.

Against the stand-in Kick over a real Pusher socket, into real Redis and PostgreSQL: a
`ChatMessageEvent` and a `SubscriptionEvent` that arrive on a channel the account's source never
subscribed to (`chatrooms.999001.v2`), on the account's own channel but naming another chatroom
in `data.chatroom_id`, or naming no channel at all, are refused: counted as
`source_bad_frames{reason="foreign_channel"}`, said in the log (once a minute), and the
account's own chat and events around them are stored exactly once, on the same connection.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.kick import KickStandin, pusher_chat
from support import dbname_of
from support.harness.servers import PostgresServer, wait_until
from support.kick import CHAT_CHANNEL, CHATROOM, EVENT_CHANNEL, KickRig, make_rig

OTHER_ROOM = 999001
OTHER_CHANNEL = f"chatrooms.{OTHER_ROOM}.v2"


@pytest.fixture
def fake() -> Iterator[KickStandin]:
    with KickStandin() as f:
        yield f


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        fake: KickStandin) -> Iterator[KickRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    try:
        yield r
    finally:
        r.close()


def app_frame(channel: str | None, event: str, data: dict[str, object]) -> str:
    frame: dict[str, object] = {"event": "App\\Events\\" + event, "data": json.dumps(data)}
    if channel is not None:
        frame["channel"] = channel
    return json.dumps(frame)


def test_another_chatrooms_chat_and_events_are_refused_counted_and_said(
        rig: KickRig, fake: KickStandin, caplog: pytest.LogCaptureFixture) -> None:
    src = rig.source()
    src.start()
    pc = fake.wait_subscribed(CHAT_CHANNEL)
    assert fake.wait_for(lambda: EVENT_CHANNEL in pc.channels, 5)
    mine_before = str(uuid.uuid4())
    assert fake.publish(CHAT_CHANNEL, "ChatMessageEvent", pusher_chat(CHATROOM, mine_before, "mine")) == 1

    foreign = [
        # Another chatroom's channel: its chat and its sub.
        app_frame(OTHER_CHANNEL, "ChatMessageEvent", pusher_chat(OTHER_ROOM, str(uuid.uuid4()), "theirs")),
        app_frame(OTHER_CHANNEL, "SubscriptionEvent", {"chatroom_id": OTHER_ROOM, "username": "their_fan",
                                                       "months": 3}),
        # The account's channel, but the data names another chatroom.
        app_frame(CHAT_CHANNEL, "ChatMessageEvent", pusher_chat(OTHER_ROOM, str(uuid.uuid4()), "mixed up")),
        app_frame(CHAT_CHANNEL, "SubscriptionEvent", {"chatroom_id": OTHER_ROOM, "username": "their_fan",
                                                      "months": 4}),
        # No channel at all.
        app_frame(None, "ChatMessageEvent", pusher_chat(CHATROOM, str(uuid.uuid4()), "nowhere")),
    ]
    with caplog.at_level(logging.WARNING, logger="lumio_ingestd.sources.kick.source"):
        for text in foreign:
            assert fake.send_raw(pc, text)
        mine_after = str(uuid.uuid4())
        assert fake.publish(CHAT_CHANNEL, "ChatMessageEvent", pusher_chat(CHATROOM, mine_after, "mine")) == 1
        fake.publish(CHAT_CHANNEL, "SubscriptionEvent", {"chatroom_id": CHATROOM, "username": "my_fan",
                                                         "months": 2})
        assert wait_until(lambda: rig.chat_ids() == {mine_before: 1, mine_after: 1}, 10), rig.chat_ids()
        assert wait_until(lambda: sum(rig.event_types().values()) == 1, 10)
    assert rig.value("source_bad_frames_total", platform="kick", reason="foreign_channel") == len(foreign)
    assert rig.event_types() == {"channel.subscription.renewal": 1}
    assert rig.rows("SELECT payload->>'username' FROM events") == [("my_fan",)]
    assert rig.rows("SELECT count(*) FROM chat_messages WHERE text <> 'mine'") == [(0,)]
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1 and OTHER_CHANNEL in said[0] and src.name in said[0], said  # once a minute
    assert src.alive and src.connected and len(fake.connections) == 1
