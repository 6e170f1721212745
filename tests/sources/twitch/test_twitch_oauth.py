"""The account's Twitch token against the stand-in OAuth and Helix endpoints over real HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumio_ingestd.config import Secret
from lumio_ingestd.devkit.standins.twitch import TwitchStandin
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.sources.twitch.helix import HelixClient, HelixError, Subscription
from lumio_ingestd.sources.twitch.oauth import TokenRejected, TokenStore
from support import dbname_of
from support.harness.servers import PostgresServer
from support.twitch import make_rig, write_token_file


@pytest.fixture
def fake() -> Iterator[TwitchStandin]:
    with TwitchStandin(min_keepalive=1) as f:
        yield f


def store(fake: TwitchStandin, path: Path, **kwargs: object) -> TokenStore:
    return TokenStore(path, fake.oauth_url, fake.client_id, Secret(fake.client_secret), Metrics(),
                      **kwargs)  # type: ignore[arg-type]


def on_disk(path: Path) -> dict[str, str]:
    return dict(json.loads(path.read_text()))


def test_validation_refreshes_an_expired_token_and_the_new_pair_is_on_disk_first(
        tmp_path: Path, fake: TwitchStandin) -> None:
    path = write_token_file(tmp_path / "token.json", fake.access_token, fake.refresh_token)
    fake.expire_access_token()
    tokens = store(fake, path)
    tokens.validate()
    assert (fake.validations, fake.refreshes) == (2, 1)  # 401, refresh, then the new one validates
    assert tokens.access_token == fake.access_token
    assert on_disk(path) == {"access_token": fake.access_token, "refresh_token": fake.refresh_token,
                             "note": "kept"}
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["token.json"]  # no temporary file left
    assert tokens.user_id == "12826"


def test_concurrent_401s_share_one_refresh(tmp_path: Path, fake: TwitchStandin) -> None:
    path = write_token_file(tmp_path / "token.json", fake.access_token, fake.refresh_token)
    tokens = store(fake, path)
    old = tokens.access_token
    fake.expire_access_token()
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(tokens.refresh(old))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert fake.refreshes == 1
    assert got == [fake.access_token] * 8


def test_a_refused_refresh_needs_reauthorization_and_leaves_the_file_alone(
        tmp_path: Path, fake: TwitchStandin) -> None:
    path = write_token_file(tmp_path / "token.json", "revoked-access", "revoked-refresh")
    before = path.read_bytes()
    tokens = store(fake, path)
    with pytest.raises(TokenRejected, match="authorized again"):
        tokens.validate()
    assert path.read_bytes() == before
    # The operator puts a fresh pair there: picked up at the next connect.
    write_token_file(path, fake.access_token, fake.refresh_token)
    assert tokens.reload_if_changed()
    tokens.validate()


def test_validation_runs_at_start_and_then_hourly(tmp_path: Path, fake: TwitchStandin) -> None:
    now = [1000.0]
    path = write_token_file(tmp_path / "token.json", fake.access_token, fake.refresh_token)
    tokens = store(fake, path, clock=lambda: now[0])
    assert tokens.validate_if_due()
    now[0] += 3599
    assert not tokens.validate_if_due()
    now[0] += 2
    assert tokens.validate_if_due()
    assert fake.validations == 2


def test_helix_401_refreshes_once_and_retries(tmp_path: Path, fake: TwitchStandin) -> None:
    path = write_token_file(tmp_path / "token.json", fake.access_token, fake.refresh_token)
    tokens = store(fake, path)
    helix = HelixClient(fake.helix_url, fake.client_id, tokens)
    fake.expire_access_token()
    with pytest.raises(HelixError) as caught:  # the token works now; the session does not exist
        helix.create_subscription(Subscription("channel.cheer", "1"), {"broadcaster_user_id": "1"},
                                  "no-such-session", timeout=5)
    assert caught.value.status == 400 and "does not exist" in caught.value.message
    assert fake.refreshes == 1 and on_disk(path)["access_token"] == fake.access_token
    assert [status for status, _ in fake.helix_requests] == [401, 400]


def test_the_source_refreshes_before_subscribing_and_after_a_helix_401(
        tmp_path: Path, pg_server: PostgresServer, pg_dsn: str, redis_url: str, fake: TwitchStandin) -> None:
    rig = make_rig(tmp_path, pg_server.url(dbname_of(pg_dsn)), redis_url, fake)
    try:
        fake.expire_access_token()  # the file's access token no longer validates
        src = rig.source()
        src.start()
        s1 = fake.wait_session(1)
        assert fake.wait_for(lambda: len(s1.subscriptions) == 11, 10)
        token_file = rig.cfg.accounts[0].twitch_token_file
        assert token_file is not None
        assert on_disk(token_file)["refresh_token"] == fake.refresh_token
        # Mid-session the token expires; the next session's subscribe calls get 401 first.
        fake.expire_access_token()
        fake.close_session(s1, 4006)
        s2 = fake.wait_session(2)
        assert fake.wait_for(lambda: len(s2.subscriptions) == 11, 10)
        assert fake.refreshes == 2
        assert on_disk(token_file)["access_token"] == fake.access_token
        assert rig.value("source_token_refreshes_total", platform="twitch", result="ok") == 2
    finally:
        rig.close()
