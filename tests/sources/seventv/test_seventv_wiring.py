"""How the composition root gets its 7TV source: when, and for which accounts."""

from __future__ import annotations

from pathlib import Path

from lumio_ingestd.model import PersistResult, PlatformEvent
from lumio_ingestd.sources import seventv
from lumio_ingestd.sources.seventv import followed_accounts
from lumio_ingestd.sources.seventv.protocol import SetState
from support import make_config, only, source_deps

ACCOUNTS = {
    "account.1": {"twitch_user_id": "101"},
    "account.2": {"seventv_user_id": "01HUSER0000000000000000002"},
    "account.3": {"bluesky_did": "did:plc:cccccccccccccccccccccccc"},  # nothing to follow on 7TV
    "account.4": {"seventv_emote_set_id": "01HSET00000000000000000004",
                  "seventv_user_id": "01HUSER0000000000000000004"},
}


class NoStore:
    def load(self, account_id: int) -> SetState | None:
        return None

    def save(self, account_id: int, state: SetState, expected_version: int | None) -> bool:
        return True


def persist(ev: PlatformEvent) -> PersistResult:
    return PersistResult("stored", ev)


def test_no_source_unless_enabled_and_an_account_to_follow(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, sections=dict(ACCOUNTS))
    assert only(seventv.build(cfg, source_deps(set_states=NoStore(), persist_event=persist)).sources) is None
    cfg = make_config(tmp_path, sections={"seventv": {"enabled": "true"},
                                          "account.3": {"bluesky_did": "did:plc:cccccccccccccccccccccccc"}})
    assert only(seventv.build(cfg, source_deps(set_states=NoStore(), persist_event=persist)).sources) is None


def test_the_shards_accounts_with_their_ids(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, sections={"seventv": {"enabled": "true"}, **ACCOUNTS})
    src = only(seventv.build(cfg, source_deps(set_states=NoStore(), persist_event=persist)).sources)
    assert src is not None and src.name == "source-seventv"
    assert src.url == "wss://events.7tv.io/v3" and src.api_url == "https://7tv.io/v3"
    got = {(f.account_id, f.twitch_user_id, f.user_id, f.pinned_set, f.cost) for f in src.accounts}
    assert got == {(1, "101", None, None, 2), (2, None, "01HUSER0000000000000000002", None, 2),
                   (4, None, "01HUSER0000000000000000004", "01HSET00000000000000000004", 1)}
    sharded = make_config(tmp_path, sections={"daemon": {"shard": "0/2"}, "seventv": {"enabled": "true"},
                                              **ACCOUNTS})
    assert [f.account_id for f in followed_accounts(sharded)] == [2, 4]
