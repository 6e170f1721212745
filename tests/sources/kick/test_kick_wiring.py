"""The Kick parts in the daemon's composition root: sources per account of the shard, the webhook
route on every replica, and a bad webhook key refused as a configuration error (exit 78)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lumio_ingestd import exitcodes
from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.build import Parts, StartupError, build
from lumio_ingestd.sources.kick import KickSource
from support import make_config


def _config(tmp_path: Path, redis_url: str = "redis://127.0.0.1:1/0", **kick: object) -> Config:
    return make_config(tmp_path, redis_url=redis_url, sections={
        "daemon": {"shard": "1/2"},
        "kick": dict(kick),
        "account.1": {"kick_broadcaster_user_id": "100", "kick_chatroom_id": "11"},
        "account.2": {"kick_broadcaster_user_id": "200", "kick_chatroom_id": "22"},
        "account.3": {"kick_broadcaster_user_id": "300", "kick_chatroom_id": "33", "kick_channel_id": "34"},
    })


def _close(parts: Parts) -> None:
    for _, close in reversed(parts.closers):
        close()


def test_build_runs_a_kick_source_per_account_of_the_shard_and_always_routes_webhooks(
        tmp_path: Path, redis_url: str) -> None:
    # A process runs accounts only once it holds its instance claim: a real Redis.
    parts = build(_config(tmp_path, redis_url), Metrics())
    try:
        kick = [s for s in parts.sources if isinstance(s, KickSource)]
        assert sorted(s.name for s in kick) == ["source-kick-1", "source-kick-3"]
        assert next(s for s in kick if s.account_id == 3).channels == ["chatrooms.33.v2", "channel.34"]
        route, _, _ = parts.routes.match("POST", "/webhooks/kick")
        assert route is not None
        assert not any(w.name == "kick-webhook-subscriptions" for w in parts.timers)
    finally:
        _close(parts)


def test_a_webhook_key_that_is_not_an_rsa_public_key_is_a_configuration_error(tmp_path: Path) -> None:
    bad = tmp_path / "key.pem"
    bad.write_text("-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n")
    with pytest.raises(StartupError) as caught:
        build(_config(tmp_path, webhook_public_key_file=bad), Metrics())
    assert caught.value.code == exitcodes.CONFIG
    assert "[kick] webhook_public_key_file" in str(caught.value) and str(bad) in str(caught.value)
