"""The stream-status poller against the stand-in Twitch (Helix /streams, OAuth) over real HTTP.

With real Redis and PostgreSQL: 250 accounts in 3 Helix requests; the
client-credentials app token, renewed after a 401; the rate-limit headers
honoured; sessions opened and closed by polling with one `stream.online` and
one `stream.offline` row each, also when the socket reports the same stream
(in either order); one offline blip closes nothing; a hanging API delays the
other platform by one timeout at most, and a stop cuts it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.events.streamstats import StreamStats
from lumio_ingestd.model import PersistResult, PlatformEvent
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.sources.streamstatus import StreamStatusPoller
from support import dbname_of
from support import twitch_frames as tf
from support.harness.servers import PostgresServer, wait_until
from support.streamstatus import StatusRig, helix_client, make_status_rig
from support.twitch import TwitchRig
from support.twitch import make_rig as make_twitch_rig


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1) as f:
        yield f


@pytest.fixture
def pg_url(pg_server: PostgresServer, pg_dsn: str) -> str:
    return pg_server.url(dbname_of(pg_dsn))


@pytest.fixture
def rig(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[StatusRig]:
    r = make_status_rig(tmp_path, pg_url, redis_url)
    try:
        yield r
    finally:
        r.close()


def test_250_accounts_are_polled_in_3_helix_requests_with_one_app_token(
        rig: StatusRig, fake: TwitchStandin) -> None:
    accounts = {f"7{n:04d}": n for n in range(1, 251)}
    live = ["70001", "70100", "70101", "70200", "70250"]  # both ends of every chunk
    for i, user in enumerate(live):
        fake.set_live(user, viewers=10 * (i + 1), title=f"title {user}", category="Chess")
    poller = rig.poller([(helix_client(fake, rig.metrics), accounts)])
    poller.poll_round()

    assert [len(r["user_ids"]) for r in fake.streams_requests] == [100, 100, 50]
    assert [r["status"] for r in fake.streams_requests] == [200, 200, 200]
    assert sorted(u for r in fake.streams_requests for u in r["user_ids"]) == sorted(accounts)
    assert fake.app_token_grants == 1  # one client-credentials grant for all three
    assert {r["token"] for r in fake.streams_requests} == {fake.app_tokens[0]}
    online = rig.events_of("stream.online")
    assert sorted(a for a, _, _ in online) == sorted(accounts[u] for u in live)
    assert {e for _, e, _ in online} == {fake.live[u]["id"] for u in live}  # the stream ids
    assert rig.value("events_stream_sessions_by_poll_total", change="opened") == 5
    assert rig.value("source_status_polls_total", platform="twitch") == 3
    rig.stats.flush_all()
    stats = rig.stats_rows()
    assert [(a, p, n, m, t, c) for a, p, _, _, m, n, t, c in stats] == [
        (accounts[u], "twitch", 1, 10 * (i + 1), f"title {u}", "Chess") for i, u in enumerate(live)]


def test_a_stream_seen_only_by_polling_is_opened_and_closed_and_one_blip_closes_nothing(
        rig: StatusRig, fake: TwitchStandin) -> None:
    poller = rig.poller([(helix_client(fake, rig.metrics), {"12826": 42})])
    stream = fake.set_live("12826", viewers=5, started_at="2026-01-05T18:00:00Z")
    poller.poll_round()
    assert rig.sessions_of(42) == [(stream, datetime(2026, 1, 5, 18, tzinfo=UTC), None)]
    seen_live = datetime.now(UTC)
    poller.poll_round()

    fake.set_offline("12826")  # one blip
    poller.poll_round()
    assert rig.sessions_of(42)[0][2] is None
    fake.set_live("12826", viewers=6, stream_id=stream, started_at="2026-01-05T18:00:00Z")
    poller.poll_round()
    last_live = datetime.now(UTC)
    fake.set_offline("12826")
    poller.poll_round()
    assert rig.sessions_of(42)[0][2] is None  # one offline answer: still open
    poller.poll_round()  # the second in a row closes it, at the last time it was seen live

    (ended,) = [s[2] for s in rig.sessions_of(42)]
    assert ended is not None and seen_live < ended <= last_live
    assert [e for _, e, _ in rig.events_of("stream.online")] == [stream]
    assert [(e, at) for _, e, at in rig.events_of("stream.offline")] == [(f"offline:{stream}", ended)]
    assert rig.value("events_stream_sessions_by_poll_total", change="opened") == 1
    assert rig.value("events_stream_sessions_by_poll_total", change="closed") == 1
    for _ in range(3):
        poller.poll_round()  # offline goes on: nothing more
    assert len(rig.events_of("stream.offline")) == 1


def test_an_open_session_the_socket_never_closed_is_closed_by_polling(
        rig: StatusRig, fake: TwitchStandin) -> None:
    # A session left open (its stream.offline never came) before this process started.
    with rig.pool.transaction() as cur:
        cur.execute("INSERT INTO stream_sessions (account_id, platform, external_id, started_at) "
                    "VALUES (42, 'twitch', 'old-stream', now() - interval '3 days')")
    poller = rig.poller([(helix_client(fake, rig.metrics), {"12826": 42})], start_grace_secs=300)
    poller.poll_round()
    poller.poll_round()
    (_, _, ended), = rig.sessions_of(42)
    assert ended is not None
    assert [e for _, e, _ in rig.events_of("stream.offline")] == ["offline:old-stream"]


def test_a_session_younger_than_the_grace_is_left_to_the_socket(
        rig: StatusRig, fake: TwitchStandin) -> None:
    # Helix may list a stream a minute after the socket's stream.online opened it.
    with rig.pool.transaction() as cur:
        cur.execute("INSERT INTO stream_sessions (account_id, platform, external_id, started_at) "
                    "VALUES (42, 'twitch', 'new-stream', now() - interval '10 seconds')")
    poller = rig.poller([(helix_client(fake, rig.metrics), {"12826": 42})], start_grace_secs=300)
    for _ in range(3):
        poller.poll_round()
    assert rig.sessions_of(42)[0][2] is None
    assert rig.events_of("stream.offline") == []


def test_a_401_renews_the_app_token_once_and_the_round_goes_on(
        rig: StatusRig, fake: TwitchStandin) -> None:
    fake.set_live("12826", viewers=3)
    poller = rig.poller([(helix_client(fake, rig.metrics), {"12826": 42})])
    poller.poll_round()
    fake.expire_app_tokens()  # revoked: Helix answers 401 to it
    poller.poll_round()
    assert [r["status"] for r in fake.streams_requests] == [200, 401, 200]
    assert fake.app_token_grants == 2
    assert rig.value("source_status_poll_errors_total", platform="twitch", reason="status") == 0
    rig.stats.flush_all()
    assert [s[2] for s in rig.stats_per_stream().values()] == [2]


def test_the_rate_limit_headers_are_honoured_before_twitch_has_to_refuse(
        rig: StatusRig, fake: TwitchStandin) -> None:
    fake.ratelimit_points = 2  # two requests a minute: the third would be refused
    accounts = {f"7{n:04d}": n for n in range(1, 251)}
    poller = rig.poller([(helix_client(fake, rig.metrics), accounts)])
    poller.poll_round()
    assert [r["status"] for r in fake.streams_requests] == [200, 200]  # never a 429
    assert rig.value("source_status_poll_errors_total", platform="twitch",
                     reason="rate_limited") == 1
    poller.poll_round()  # still empty: nothing is sent before the reset
    assert len(fake.streams_requests) == 2


def test_a_malformed_item_is_refused_alone_and_its_account_is_not_taken_for_offline(
        rig: StatusRig, fake: TwitchStandin) -> None:
    fake.set_live("12826", viewers=3)
    fake.set_live("999", viewers=8)
    poller = rig.poller([(helix_client(fake, rig.metrics), {"12826": 42, "999": 43})])
    poller.poll_round()
    assert len(rig.events_of("stream.online")) == 2
    fake.set_offline("999")  # Helix lists it still, but in a shape nobody can read
    fake.streams_extra = [{"user_id": "999", "id": "s", "viewer_count": "many"}, "not an object"]
    for _ in range(3):
        poller.poll_round()
    assert rig.value("source_status_poll_errors_total", platform="twitch",
                     reason="bad_response") == 6
    assert rig.events_of("stream.offline") == []  # unsure is not offline
    assert [s[2] for s in rig.sessions_of(43)] == [None]
    rig.stats.flush_all()
    samples = {a: s[2] for (a, _), s in rig.stats_per_stream().items()}
    assert samples == {42: 4, 43: 1}  # the good item counted


def test_a_hanging_api_delays_the_other_by_its_timeout_at_most_and_a_stop_cuts_it(
        rig: StatusRig) -> None:
    with TwitchStandin() as hanging, TwitchStandin() as healthy:
        hanging.streams_hang = True
        healthy.set_live("555", viewers=9)
        timeout = 1.0
        poller = rig.poller([(helix_client(hanging, rig.metrics, timeout_secs=timeout), {"111": 1}),
                             (helix_client(healthy, rig.metrics, timeout_secs=timeout), {"555": 2})])
        started = time.monotonic()
        poller.poll_round()
        took = time.monotonic() - started
        assert len(hanging.streams_requests) == 1 and len(healthy.streams_requests) == 1
        assert took < timeout + 1.0, took  # one timeout, not one per account or per retry
        assert [a for a, _, _ in rig.events_of("stream.online")] == [2]
        assert rig.value("source_status_poll_errors_total", platform="twitch",
                         reason="unavailable") == 1

        # A stop while the request hangs: the thread ends at once, not at the timeout.
        slow = rig.poller([(helix_client(hanging, rig.metrics, timeout_secs=30.0), {"111": 1})],
                          interval_secs=0.05)
        slow.start()
        assert hanging.wait_for(lambda: len(hanging.streams_requests) == 2, 5)
        stopping = time.monotonic()
        slow.request_stop()
        assert slow.join(5)
        assert time.monotonic() - stopping < 1.0


# --------------------------------------------------------------------------- with the socket


@pytest.fixture
def trig(tmp_path: Path, pg_url: str, redis_url: str, fake: TwitchStandin) -> Iterator[TwitchRig]:
    r = make_twitch_rig(tmp_path, pg_url, redis_url, fake)
    try:
        yield r
    finally:
        r.close()


def _socket_poller(trig: TwitchRig, fake: TwitchStandin, *, own_sessions: bool) -> StreamStatusPoller:
    """A poller beside the socket source, sharing its database (and its sessions, unless told)."""
    from lumio_ingestd.stores.sessions import StreamSessions

    sessions = StreamSessions(trig.pool, trig.metrics) if own_sessions else trig.sessions
    stats = StreamStats(trig.pool, trig.events.deadletters, None, trig.metrics)
    poller = StreamStatusPoller([(helix_client(fake, trig.metrics), {fake.user_id: 42})],
                                sink=EventSink(trig.events.persist_event, alerts=None,
                                               sessions=sessions),
                                stats=stats, metrics=trig.metrics, interval_secs=3600,
                                sessions=sessions, start_grace_secs=0)
    return poller


def _one_row_each(trig: TwitchRig, stream: str) -> None:
    types = trig.rows("SELECT type, external_id FROM events WHERE type LIKE 'stream.%%' "
                      "ORDER BY created_at")
    assert types == [("stream.online", stream), ("stream.offline", f"offline:{stream}")], types
    assert trig.rows("SELECT count(*) FROM stream_sessions") == [(1,)]
    assert trig.rows("SELECT count(*) FROM stream_sessions WHERE ended_at IS NULL") == [(0,)]


def test_socket_first_then_poll_gives_one_row_each(trig: TwitchRig, fake: TwitchStandin) -> None:
    src = trig.source()
    src.start()
    fake.wait_session(1)
    assert fake.wait_for(lambda: "stream.offline" in fake.sessions[0].subscriptions, 10)
    poller = _socket_poller(trig, fake, own_sessions=False)
    started = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fake.notify("stream.online", tf.online_event("s-100", started))
    assert wait_until(lambda: trig.event_ids()["s-100"] == 1, 10)
    fake.set_live(fake.user_id, viewers=4, stream_id="s-100", started_at=started)
    poller.poll_round()  # the socket stored it: a duplicate, not a second row
    fake.notify("stream.offline", tf.offline_event())
    assert wait_until(lambda: trig.event_ids()["offline:s-100"] == 1, 10), trig.event_ids()
    fake.set_offline(fake.user_id)
    poller.poll_round()
    poller.poll_round()
    _one_row_each(trig, "s-100")
    assert trig.value("events_stream_sessions_by_poll_total", change="opened") == 0
    assert trig.value("events_stream_sessions_by_poll_total", change="closed") == 0


def test_poll_first_then_socket_gives_one_row_each(trig: TwitchRig, fake: TwitchStandin) -> None:
    src = trig.source()
    src.start()
    fake.wait_session(1)
    assert fake.wait_for(lambda: "stream.offline" in fake.sessions[0].subscriptions, 10)
    # The poller keeps sessions of its own (a restart, another replica): the socket's
    # offline finds its stream in stream_sessions, not in this process's memory.
    poller = _socket_poller(trig, fake, own_sessions=True)
    started = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fake.set_live(fake.user_id, viewers=4, stream_id="s-200", started_at=started)
    poller.poll_round()
    fake.notify("stream.online", tf.online_event("s-200", started))
    fake.set_offline(fake.user_id)
    poller.poll_round()
    poller.poll_round()
    assert trig.event_ids()["offline:s-200"] == 1
    fake.notify("stream.offline", tf.offline_event())  # late: the poller closed it already
    # The socket handles frames in order: once a later one is stored, the offline was handled.
    marker = fake.notify("channel.cheer", tf.cheer_event("1234"))
    assert wait_until(lambda: trig.event_ids()[marker] == 1, 10), trig.event_ids()
    _one_row_each(trig, "s-200")
    assert trig.value("events_stream_sessions_by_poll_total", change="opened") == 1
    assert trig.value("events_stream_sessions_by_poll_total", change="closed") == 1


def test_the_poll_thread_runs_on_its_own_schedule(rig: StatusRig, fake: TwitchStandin) -> None:
    fake.set_live("12826", viewers=1)
    poller = rig.poller([(helix_client(fake, rig.metrics), {"12826": 42})], interval_secs=0.1)
    poller.start()
    assert fake.wait_for(lambda: len(fake.streams_requests) >= 4, 5)
    poller.request_stop()
    assert poller.join(5)
    assert threading.current_thread().name != poller.name
    # final() wrote the current minute's window: every answered sample is in it.
    answered = sum(1 for r in fake.streams_requests if r["status"] == 200)
    # (the last answer may have been cut by the stop before the poller read it)
    assert answered - 1 <= sum(r[5] for r in rig.stats_rows()) <= answered


# --------------------------------------------------------------------------- no servers


def _never(ev: PlatformEvent) -> PersistResult:
    raise AssertionError("nothing is persisted here")


class _NoStats:
    def add(self, account_id: int, platform: str, viewers: int, *, title: str | None = None,
            category: str | None = None, at: datetime | None = None) -> None:
        raise AssertionError("no samples here")

    def flush_due(self, now: datetime | None = None) -> int:
        return 0

    def flush_all(self, budget_secs: float | None = None) -> int:
        return 0

    def cut_calls_of(self, thread_ident: int | None) -> None:
        pass


def test_the_poller_covers_the_accounts_of_this_shard_on_configured_platforms(tmp_path: Path) -> None:
    from lumio_ingestd.sources import streamstatus
    from support import make_config, only, source_deps

    secret = tmp_path / "secret"
    secret.write_text("s3cret-value\n")
    sections: dict[str, dict[str, object]] = {
        "daemon": {"shard": "1/2"},
        "twitch": {"client_id": "tw", "client_secret_file": secret},
        "kick": {"client_id": "kc", "client_secret_file": secret},
        **{f"account.{n}": {"twitch_user_id": f"10{n}", "kick_broadcaster_user_id": f"20{n}"}
           for n in range(1, 7)},
    }
    cfg = make_config(tmp_path, sections=sections)
    stats = _NoStats()  # the poller is only built here, never run
    poller = only(streamstatus.build(cfg, source_deps(persist_event=_never, stats=stats)).timers)
    assert poller is not None and poller.platforms == ["twitch", "kick"]
    assert [sorted(p.accounts.values()) for p in poller._platforms] == [[1, 3, 5], [1, 3, 5]]

    only_twitch = make_config(tmp_path, sections={**sections, "streamstatus": {"platforms": "twitch"}})
    poller = only(streamstatus.build(only_twitch, source_deps(persist_event=_never, stats=stats)).timers)
    assert poller is not None and poller.platforms == ["twitch"]
    unconfigured = make_config(tmp_path, sections={"account.1": {"twitch_user_id": "101"}})
    deps = source_deps(persist_event=_never, stats=stats)
    assert only(streamstatus.build(unconfigured, deps).timers) is None


def test_kick_livestreams_answers_are_read_as_documented() -> None:
    from lumio_ingestd.config import Secret
    from lumio_ingestd.metrics import Metrics
    from lumio_ingestd.sources.apptoken import AppToken
    from lumio_ingestd.sources.kick.livestreams import KickLivestreams, kick_stream_key

    client = KickLivestreams("http://127.0.0.1:9/public/v1", "kc",
                             AppToken("http://127.0.0.1:9/oauth/token", "kc", Secret("x")),
                             Metrics(), timeout_secs=1)
    assert client.url(["1", "2"]) == ("http://127.0.0.1:9/public/v1/livestreams?"
                                      "broadcaster_user_id=1&broadcaster_user_id=2&limit=100")
    item = {"broadcaster_user_id": 123, "channel_id": 9, "slug": "streamer",
            "stream_title": "hello", "viewer_count": 42, "started_at": "2026-01-05T18:00:00Z",
            "category": {"id": 15, "name": "Just Chatting", "thumbnail": ""}, "language": "en",
            "has_mature_content": False, "thumbnail": ""}
    answer = client.parse({"data": [item, {"broadcaster_user_id": 7, "viewer_count": None}],
                           "message": "OK"}, ["123", "7"])
    live = answer.live["123"]
    assert (live.viewers, live.title, live.category, live.login) == (42, "hello", "Just Chatting",
                                                                    "streamer")
    assert live.started_at == datetime(2026, 1, 5, 18, tzinfo=UTC)
    assert client.session_key(42, live) == kick_stream_key(42, live.started_at)
    assert client.session_key(42, live).startswith("live:")
    assert answer.unsure == {"7"} and len(answer.refused) == 1
