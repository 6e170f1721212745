"""How the composition root gets its Jetstream source: when, for which accounts, which cursor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lumio_ingestd.config import Config
from lumio_ingestd.db.pool import Pool
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.sources import jetstream
from lumio_ingestd.sources.jetstream import post_alert
from lumio_ingestd.stores.jetstream import JetstreamStore
from support import make_config, only, source_deps

ACCOUNTS = {
    "account.1": {"bluesky_did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"},
    "account.2": {"bluesky_did": "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"},
    "account.3": {"twitch_user_id": "42"},
    "account.4": {"bluesky_did": "did:plc:dddddddddddddddddddddddd"},
}


class Sink:
    def __init__(self) -> None:
        self.events: list[PlatformEvent] = []

    def publish(self, ev: PlatformEvent) -> None:
        self.events.append(ev)


def _source(cfg: Config, alerts: Sink | None) -> Any:
    deps = source_deps(jetstream=JetstreamStore(Pool(cfg.timescale)), alerts=alerts)
    return only(jetstream.build(cfg, deps).sources)


def test_no_source_without_collections_or_without_a_did(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, sections=dict(ACCOUNTS))
    assert _source(cfg, alerts=None) is None
    cfg = make_config(tmp_path, sections={"jetstream": {"collections": "app.bsky.feed.post"},
                                          "account.3": {"twitch_user_id": "42"}})
    assert _source(cfg, alerts=None) is None


def test_one_source_for_the_shards_accounts_with_the_shards_cursor(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, sections={"jetstream": {"collections": "app.bsky.feed.post"}, **ACCOUNTS})
    src = _source(cfg, alerts=None)
    assert src is not None and src.cursor_name == "default" and src.name == "source-jetstream"
    assert src.dids == ("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb",
                        "did:plc:dddddddddddddddddddddddd")
    sharded = make_config(tmp_path, sections={"daemon": {"shard": "0/2"},
                                              "jetstream": {"collections": "app.bsky.feed.post"}, **ACCOUNTS})
    src = _source(sharded, alerts=None)
    assert src is not None and src.cursor_name == "shard-0-of-2"
    assert src.dids == ("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", "did:plc:dddddddddddddddddddddddd")


def test_a_post_goes_out_as_a_bluesky_post_event(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, sections={"jetstream": {"collections": "app.bsky.feed.post"}, **ACCOUNTS})
    sink = Sink()
    src = _source(cfg, alerts=sink)
    assert src is not None and src.on_post is not None
    uri = "at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/3lzz2abcd7k2c"
    payload = {"type": "bluesky.post", "platform": "bluesky", "uri": uri, "time_us": 1_767_640_000_123_456,
               "record": {"text": "going live now!"}}
    src.on_post(1, payload)
    ev = sink.events[0]
    assert (ev.account_id, ev.platform, ev.type, ev.external_id) == (1, "bluesky", "bluesky.post", uri)
    assert ev.created_at.isoformat() == "2026-01-05T19:06:40.123456+00:00"
    assert ev.payload == {"uri": uri, "time_us": 1_767_640_000_123_456, "record": {"text": "going live now!"}}
    assert post_alert(4, payload).account_id == 4  # the same post, another account: its own event
