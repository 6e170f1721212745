"""Kick webhook subscriptions through the stand-in's API over real HTTP: created once, kept, pruned.

The app token comes from the client-credentials grant at `{oauth_url}/oauth/token`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lumio_ingestd.config import Secret
from lumio_ingestd.devkit.standins.kick import KickStandin
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources import Built, kick
from lumio_ingestd.sources.apptoken import AppToken
from lumio_ingestd.sources.httpclient import request
from lumio_ingestd.sources.kick.subscriptions import EVENTS, KickSubscriptions
from support import make_config, only, source_deps
from support.harness.servers import wait_until


@pytest.fixture
def fake() -> Iterator[KickStandin]:
    with KickStandin() as f:
        yield f


def manager(fake: KickStandin, broadcasters: set[str], *, interval_secs: float = 3600.0,
            retry_min_secs: float = 30.0, retry_max_secs: float = 1800.0) -> KickSubscriptions:
    token = AppToken(fake.oauth_url + "/oauth/token", fake.client_id, Secret(fake.client_secret))
    return KickSubscriptions(fake.api_url, token, broadcasters, Metrics(), interval_secs=interval_secs,
                             retry_min_secs=retry_min_secs, retry_max_secs=retry_max_secs)


def pairs(fake: KickStandin) -> Counter[tuple[str, str]]:
    return Counter((str(s["broadcaster_user_id"]), s["event"]) for s in fake.subscriptions.values())


def test_created_once_not_duplicated_across_restarts_and_removed_for_a_removed_account(
        fake: KickStandin) -> None:
    first = manager(fake, {"100", "200"})
    assert first.sync() == (2 * len(EVENTS), 0)
    assert pairs(fake) == Counter({(b, e): 1 for b in ("100", "200") for e in EVENTS})
    assert all(s["method"] == "webhook" and s["version"] == 1 for s in fake.subscriptions.values())
    # A restart (a new process: a new token, the same subscriptions at Kick): nothing created.
    again = manager(fake, {"100", "200"})
    assert again.sync() == (0, 0)
    assert len(fake.subscriptions) == 2 * len(EVENTS)
    # Account 200 removed from the configuration: its subscriptions go, 100's stay.
    pruned = manager(fake, {"100"})
    assert pruned.sync() == (0, len(EVENTS))
    assert pairs(fake) == Counter({("100", e): 1 for e in EVENTS})
    # One deleted at Kick (auto-unsubscribed after failures) comes back; a repeat is removed.
    some_id = next(iter(fake.subscriptions))
    del fake.subscriptions[some_id]
    assert pruned.sync() == (1, 0)
    dup: dict[str, Any] = {**next(iter(fake.subscriptions.values())), "id": "01DUPLICATE0000000000000000"}
    fake.subscriptions[dup["id"]] = dup
    assert pruned.sync() == (0, 1)
    assert pairs(fake) == Counter({("100", e): 1 for e in EVENTS})
    assert fake.tokens_issued == 3  # one app token per manager, reused across its calls


def test_refused_calls_are_logged_with_kicks_message_retried_and_a_401_renews_the_token(
        fake: KickStandin, caplog: pytest.LogCaptureFixture) -> None:
    worker = manager(fake, {"100"}, retry_min_secs=0.2, retry_max_secs=0.4, interval_secs=3600)
    fake.api_status["POST"] = 500
    with caplog.at_level(logging.WARNING, logger="lumio_ingestd.sources.kick.subscriptions"):
        worker.start()
        try:
            assert wait_until(lambda: ("POST", "/public/v1/events/subscriptions", 500) in fake.api_requests
                              and len([r for r in fake.api_requests if r[2] == 500]) >= 2, 5)
            assert any("forced 500" in r.getMessage() for r in caplog.records)
            assert worker.alive and worker.passes == 0
            fake.revoke_tokens()  # the next call answers 401: a new token, then success
            del fake.api_status["POST"]
            assert wait_until(lambda: worker.passes == 1, 5)
        finally:
            worker.request_stop()
            assert worker.join(5)
    assert len(fake.subscriptions) == len(EVENTS)
    assert fake.tokens_issued == 2


def test_build_kick_runs_the_manager_only_when_asked_and_on_shard_0(
        tmp_path: Path, fake: KickStandin) -> None:
    (tmp_path / "secret").write_text(fake.client_secret)
    base: dict[str, dict[str, object]] = {
        "kick": {"api_url": fake.api_url, "oauth_url": fake.oauth_url, "client_id": fake.client_id,
                 "client_secret_file": tmp_path / "secret", "pusher_url": fake.pusher_url},
        "account.1": {"kick_broadcaster_user_id": "100", "kick_chatroom_id": "7"},
        "account.2": {"kick_broadcaster_user_id": "200"}}

    def parts(**sections: dict[str, object]) -> Built:
        merged = {k: dict(v) for k, v in base.items()}
        for k, v in sections.items():
            merged.setdefault(k, {}).update(v)
        d = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        cfg = make_config(d, sections=merged)
        return kick.build(cfg, source_deps(persist_chat=lambda m: "buffered"))

    off = parts()
    assert off.leader_timers == [] and len(off.sources) == 1 and [r[:2] for r in off.routes] == [
        ("POST", "/webhooks/kick")]
    on = parts(kick={"manage_webhooks": "true"})
    manager = only(on.leader_timers)
    assert isinstance(manager, KickSubscriptions) and manager.broadcasters == {"100", "200"}
    shard1 = parts(kick={"manage_webhooks": "true"}, daemon={"shard": "1/2"})
    assert shard1.leader_timers == [] and len(shard1.sources) == 1
    shard0 = parts(kick={"manage_webhooks": "true"}, daemon={"shard": "0/2"})
    assert only(shard0.leader_timers) is not None and shard0.sources == []


def test_the_stand_ins_livestreams_endpoint_follows_set_live_and_set_offline(fake: KickStandin) -> None:
    """What the stream-status poller reads through the stand-in (the app token is required)."""
    token = AppToken(fake.oauth_url + "/oauth/token", fake.client_id, Secret(fake.client_secret))

    def live(broadcaster: str) -> tuple[int, Any]:
        result = request("GET", f"{fake.api_url}/livestreams?broadcaster_user_id={broadcaster}",
                         headers={"Authorization": f"Bearer {token.get()}"}, timeout=5)
        return result.status, result.json()

    started = datetime(2026, 1, 5, 20, 0, 7, tzinfo=UTC)
    fake.set_live("100", viewers=42, title="hello", category="Just Chatting", started_at=started)
    status, body = live("100")
    assert status == 200
    [stream] = body["data"]
    assert (stream["broadcaster_user_id"], stream["viewer_count"], stream["stream_title"],
            stream["category"]["name"], stream["started_at"]) == (100, 42, "hello", "Just Chatting",
                                                                 "2026-01-05T20:00:07Z")
    assert live("200") == (200, {"data": [], "message": "OK"})
    fake.set_offline("100")
    assert live("100")[1]["data"] == []
    no_token = request("GET", f"{fake.api_url}/livestreams?broadcaster_user_id=100", headers={}, timeout=5)
    assert no_token.status == 401
