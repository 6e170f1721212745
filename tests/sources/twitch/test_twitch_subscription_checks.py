"""Platform input is checked against the subscription.

A notification on an account's EventSub socket whose subscription names
another channel, or whose type the source never subscribed to, is refused,
counted (`source_bad_frames{reason="foreign_channel"|"unsubscribed"}`) and
logged at most once a minute; the webhook receiver acknowledges a type it
never subscribes to without storing it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.devkit.standins.twitch_events import now_text
from lumio_ingestd.sources.twitch.webhook import PATH, TwitchWebhook, signature
from lumio_ingestd.stores.seen import SeenDeliveries
from lumio_ingestd.web.server import Routes
from support import dbname_of
from support import twitch_frames as tf
from support.harness.servers import PostgresServer, wait_until
from support.http_client import call, serving
from support.twitch import WEBHOOK_SECRET, TwitchRig, make_rig


def _foreign(frame: str, channel: str) -> str:
    obj = json.loads(frame)
    obj["payload"]["subscription"]["condition"] = {"broadcaster_user_id": channel, "user_id": channel}
    return json.dumps(obj)


def test_foreign_channel_and_unsubscribed_notifications_are_refused_counted_and_logged_once(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    with TwitchStandin(min_keepalive=1) as fake:
        rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
        try:
            src = rig.source()
            src.start()
            s1 = fake.wait_session(1)
            assert fake.wait_for(lambda: len(s1.subscriptions) == 11 and s1.open, 10)
            with caplog.at_level(logging.WARNING, logger="lumio_ingestd.sources.twitch.source"):
                for i in range(3):
                    chat = tf.frame("channel.chat.message", tf.chat_event(f"foreign-{i}"),
                                    message_id=f"f-{i}", timestamp=now_text())
                    assert fake.send_raw(s1, _foreign(chat, "99999"))
                ban = tf.frame("channel.ban", {"user_id": "5", "broadcaster_user_id": "12826"},
                               message_id="ban-1", timestamp=now_text())
                assert fake.send_raw(s1, ban)
                fake.notify("channel.chat.message", tf.chat_event("ours"))
                assert wait_until(lambda: rig.chat_ids() == {"ours": 1}, 10)
            assert rig.value("source_bad_frames_total", platform="twitch", reason="foreign_channel") == 3
            assert rig.value("source_bad_frames_total", platform="twitch", reason="unsubscribed") == 1
            assert rig.rows("SELECT count(*) FROM events") == [(0,)]
            refused = [r for r in caplog.records if "refused notification" in r.getMessage()]
            assert len(refused) == 1 and "99999" in refused[0].getMessage()  # once a minute
            assert len(fake.sessions) == 1 and s1.open
            assert rig.value("worker_errors_total", worker=src.name) == 0
        finally:
            rig.close()


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[TwitchRig]:
    r = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, None)
    try:
        yield r
    finally:
        r.close()


def test_a_webhook_of_a_type_never_subscribed_is_acknowledged_and_not_stored(rig: TwitchRig) -> None:
    hook = TwitchWebhook(rig.cfg.twitch.webhook_secret, {"12826": 42}, rig.sink, rig.chat.buffer_or_persist,
                         SeenDeliveries(rig.redis, "twitch"), rig.metrics)
    routes = Routes()
    routes.add("POST", PATH, hook.handle)
    body = json.dumps({"subscription": tf.subscription("channel.ban", "1", {"method": "webhook"}),
                       "event": {"user_id": "5", "broadcaster_user_id": "12826"}}).encode()
    stamp = now_text()
    headers = {"Twitch-Eventsub-Message-Id": "ban-hook", "Twitch-Eventsub-Message-Type": "notification",
               "Twitch-Eventsub-Message-Timestamp": stamp,
               "Twitch-Eventsub-Message-Signature": signature(WEBHOOK_SECRET, "ban-hook", stamp, body)}
    with serving(routes, rig.metrics) as port:
        reply = call(port, "POST", PATH, body, headers)
    assert reply.status == 200 and reply.json() == {"ignored": "type not subscribed"}
    assert rig.rows("SELECT count(*) FROM events") == [(0,)]
    assert rig.value("source_bad_frames_total", platform="twitch", reason="unsubscribed") == 1
    assert rig.value("http_webhook_requests_total", platform="twitch", result="unsubscribed") == 1
