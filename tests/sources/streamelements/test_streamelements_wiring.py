"""How the composition root gets its StreamElements sources: one per shard account with both keys."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.runtime.build import build
from lumio_ingestd.sources import streamelements
from lumio_ingestd.sources.streamelements import StreamElementsSource
from support import make_config, source_deps


def _accounts(tmp_path: Path) -> dict[str, dict[str, object]]:
    token = tmp_path / "se-token"
    token.write_text("eyJhbGciOiJIUzI1NiJ9.e30.sig\n")
    token.chmod(0o600)
    return {
        "account.1": {"streamelements_channel_id": "5f0000000000000000000001",
                      "streamelements_token_file": token},
        "account.2": {"streamelements_channel_id": "5f0000000000000000000002",
                      "streamelements_token_file": token},
        "account.3": {"twitch_user_id": "42"},
        "account.4": {"streamelements_channel_id": "5f0000000000000000000004",
                      "streamelements_token_file": token},
    }


def _persist(ev: object) -> object:
    raise AssertionError("nothing is persisted while building")


def _sources(cfg: Config) -> list[StreamElementsSource]:
    built = streamelements.build(cfg, source_deps(persist_event=_persist))
    return cast(list[StreamElementsSource], built.sources)


def test_one_source_per_account_of_the_shard_with_a_channel_and_a_token(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, sections=_accounts(tmp_path))
    sources = _sources(cfg)
    assert [s.name for s in sources] == ["source-streamelements-1", "source-streamelements-2",
                                         "source-streamelements-4"]
    assert sources[0].room == "5f0000000000000000000001" and not sources[0].keep_pii
    assert sorted(sources[0].topics) == ["channel.activities", "channel.tips"]
    sharded = make_config(tmp_path, sections={"daemon": {"shard": "0/2"}, **_accounts(tmp_path)})
    sources = _sources(sharded)
    assert [s.name for s in sources] == ["source-streamelements-2", "source-streamelements-4"]


def test_the_daemon_runs_them_beside_the_other_sources(tmp_path: Path, redis_url: str) -> None:
    # A process runs accounts only once it holds its instance claim: a real Redis.
    cfg = make_config(tmp_path, redis_url=redis_url, sections=_accounts(tmp_path))
    parts = build(cfg, Metrics())
    try:
        mine = [s for s in parts.sources if isinstance(s, StreamElementsSource)]
        assert len(mine) == 3 and all(s.role == "source-streamelements" for s in mine)
    finally:
        for _, close in reversed(parts.closers):
            close()
