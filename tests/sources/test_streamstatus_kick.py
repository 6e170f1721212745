"""The stream-status poller against the stand-in Kick (`/public/v1/livestreams`, OAuth) over real HTTP.

With real Redis and PostgreSQL: a Kick stream opened and closed by polling
with one row each (its id derived from the start, as the Kick socket and
webhook derive theirs); the webhook's `livestream.status.updated` and the
poll give one row each in either order; a revoked app token is renewed once;
a hanging Twitch API holds the Kick poll up by one timeout at most, and an
erroring Kick API does not cost Twitch its round.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.config import Secret
from lumio_ingestd.devkit.standins.kick import KickStandin
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.apptoken import AppToken
from lumio_ingestd.sources.httpclient import join
from lumio_ingestd.sources.kick.livestreams import KickLivestreams, kick_stream_key
from lumio_ingestd.sources.kick.mapping import map_webhook, stream_key
from support import dbname_of
from support.harness.servers import PostgresServer
from support.streamstatus import StatusRig, helix_client, make_status_rig

ACCOUNT = 42
KICK_USER = "1001"


@pytest.fixture
def kick() -> Iterator[KickStandin]:
    with KickStandin() as k:
        yield k


@pytest.fixture
def rig(tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str) -> Iterator[StatusRig]:
    r = make_status_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url)
    try:
        yield r
    finally:
        r.close()


def kick_client(k: KickStandin, metrics: Metrics, *, timeout_secs: float = 2.0) -> KickLivestreams:
    token = AppToken(join(k.oauth_url, "oauth/token"), k.client_id, Secret(k.client_secret),
                     timeout_secs=timeout_secs)
    return KickLivestreams(k.api_url, k.client_id, token, metrics, timeout_secs=timeout_secs)


def livestreams_requests(k: KickStandin) -> list[int]:
    return [status for method, path, status in k.api_requests if path.endswith("/livestreams")]


def test_the_poll_derives_the_stream_id_as_the_kick_mapping_does() -> None:
    started = datetime(2026, 1, 5, 18, 0, 7, 250_000, tzinfo=UTC)
    assert kick_stream_key(ACCOUNT, started) == stream_key(ACCOUNT, started)


def test_a_kick_stream_seen_only_by_polling_is_opened_and_closed_one_row_each(
        rig: StatusRig, kick: KickStandin) -> None:
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    kick.set_live(KICK_USER, viewers=50, title="hello", category="Just Chatting", started_at=started)
    poller = rig.poller([(kick_client(kick, rig.metrics), {KICK_USER: ACCOUNT})])
    poller.poll_round()
    key = stream_key(ACCOUNT, started)
    assert rig.events_of("stream.online") == [(ACCOUNT, key, started)]
    assert rig.sessions_of(ACCOUNT) == [(key, started, None)]
    kick.set_live(KICK_USER, viewers=70, title="hello", category="Just Chatting", started_at=started)
    poller.poll_round()
    kick.set_offline(KICK_USER)
    poller.poll_round()
    assert rig.sessions_of(ACCOUNT)[0][2] is None  # one offline answer closes nothing
    poller.poll_round()
    assert rig.sessions_of(ACCOUNT)[0][2] is not None
    assert [e for _, e, _ in rig.events_of("stream.offline")] == [f"offline:{key}"]
    assert livestreams_requests(kick) == [200, 200, 200, 200]
    rig.stats.flush_all()
    assert list(rig.stats_per_stream().items()) == [
        ((ACCOUNT, "kick"), (60.0, 70, 2, "hello", "Just Chatting"))]


def _webhook_status(rig: StatusRig, body: dict[str, Any]) -> None:
    """What the Kick webhook receiver does with a `livestream.status.updated` delivery."""
    items = map_webhook(ACCOUNT, "livestream.status.updated", body, f"msg-{time.monotonic_ns()}",
                        datetime.now(UTC))
    assert items is not None
    for item in items:
        assert item.event is not None
        rig.sink.persist(item.event, item.stream)


def _status_body(live: bool, started: datetime, ended: datetime | None = None) -> dict[str, Any]:
    broadcaster = {"is_anonymous": False, "user_id": int(KICK_USER), "username": "streamer",
                   "is_verified": False, "profile_picture": "", "channel_slug": "streamer",
                   "identity": None}
    return {"broadcaster": broadcaster, "is_live": live, "title": "hello",
            "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ended_at": ended.strftime("%Y-%m-%dT%H:%M:%SZ") if ended else None}


def _one_row_each(rig: StatusRig, key: str) -> None:
    ids = [r[0] for r in rig.rows("SELECT external_id FROM events ORDER BY created_at")]
    assert ids == [key, f"offline:{key}"], ids
    assert [(s[0], s[2] is not None) for s in rig.sessions_of(ACCOUNT)] == [(key, True)]


@pytest.mark.parametrize("webhook_first", [True, False])
def test_the_kick_webhook_and_the_poll_give_one_row_each_in_either_order(
        rig: StatusRig, kick: KickStandin, webhook_first: bool) -> None:
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    key = stream_key(ACCOUNT, started)
    poller = rig.poller([(kick_client(kick, rig.metrics), {KICK_USER: ACCOUNT})])
    kick.set_live(KICK_USER, viewers=5, title="hello", category="c", started_at=started)
    if webhook_first:
        _webhook_status(rig, _status_body(True, started))
        poller.poll_round()
        _webhook_status(rig, _status_body(False, started, datetime.now(UTC)))
        kick.set_offline(KICK_USER)
        poller.poll_round()
        poller.poll_round()
    else:
        poller.poll_round()
        _webhook_status(rig, _status_body(True, started))
        kick.set_offline(KICK_USER)
        poller.poll_round()
        poller.poll_round()
        _webhook_status(rig, _status_body(False, started, datetime.now(UTC)))
    _one_row_each(rig, key)
    opened = rig.value("events_stream_sessions_by_poll_total", change="opened")
    closed = rig.value("events_stream_sessions_by_poll_total", change="closed")
    assert (opened, closed) == ((0, 0) if webhook_first else (1, 1))


def test_a_revoked_kick_app_token_is_renewed_once(rig: StatusRig, kick: KickStandin) -> None:
    kick.set_live(KICK_USER, viewers=1, title="t", category="c")
    poller = rig.poller([(kick_client(kick, rig.metrics), {KICK_USER: ACCOUNT})])
    poller.poll_round()
    kick.revoke_tokens()
    poller.poll_round()
    assert livestreams_requests(kick) == [200, 401, 200]
    assert kick.tokens_issued == 2


def test_a_hanging_twitch_api_holds_kick_up_by_one_timeout_and_kick_errors_cost_twitch_nothing(
        rig: StatusRig, kick: KickStandin) -> None:
    timeout = 1.0
    kick.set_live(KICK_USER, viewers=9, title="t", category="c")
    with TwitchStandin() as twitch:
        twitch.streams_hang = True
        poller = rig.poller([(helix_client(twitch, rig.metrics, timeout_secs=timeout), {"111": 1}),
                             (kick_client(kick, rig.metrics, timeout_secs=timeout),
                              {KICK_USER: ACCOUNT})])
        started = time.monotonic()
        poller.poll_round()
        took = time.monotonic() - started
        assert took < timeout + 1.0, took
        assert [a for a, _, _ in rig.events_of("stream.online")] == [ACCOUNT]

        twitch.streams_hang = False
        twitch.set_live("111", viewers=3)
        kick.api_status["GET"] = 500
        poller.poll_round()
        assert sorted(a for a, _, _ in rig.events_of("stream.online")) == [1, ACCOUNT]
        assert rig.value("source_status_poll_errors_total", platform="kick", reason="status") == 1
