"""Bluesky Jetstream: the records of the accounts' DIDs, with a forward-only cursor.

- `protocol`: frames -> commits, identity and account events (pure).
- `source`: `JetstreamSource`, the one socket for every DID of this shard.

The records and the cursor are written through a `JetstreamStore`
(stores/jetstream.py, given by the runtime). `build()` makes the source when
`[jetstream] collections` is set and an account of this shard has a DID.
Nothing durable here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lumio_ingestd.config import Config
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.sources import Built, SourceDeps
from lumio_ingestd.sources.jetstream.source import ALERT_TYPE, JetstreamSource, OnPost


def cursor_name(cfg: Config) -> str:
    """One cursor per shard: each shard asks for other DIDs, so one cursor cannot serve two.

    With `shard = auto` the DIDs follow the membership, so the cursor is this
    instance's (an account that moves here starts at the new owner's cursor).
    """
    if cfg.daemon.shard_auto:
        return f"auto-{cfg.daemon.instance_id}"
    index, count = cfg.daemon.shard_index, cfg.daemon.shard_count
    return "default" if count == 1 else f"shard-{index}-of-{count}"


def post_alert(account_id: int, payload: dict[str, Any]) -> PlatformEvent:
    """The live alert of a post: a `bluesky.post` event keyed by the post's at:// URI."""
    body = {k: v for k, v in payload.items() if k not in ("type", "platform")}
    return PlatformEvent.new(
        account_id=account_id, platform="bluesky", type=ALERT_TYPE, payload=body,
        external_id=payload["uri"],
        created_at=datetime.fromtimestamp(payload["time_us"] / 1_000_000, UTC))


def build(cfg: Config, deps: SourceDeps) -> Built:
    """The source, when `[jetstream] collections` is set and an account of this shard has a DID."""
    built = Built()
    accounts = [a for a in cfg.accounts if a.bluesky_did and cfg.owns(a.account_id)]
    if not cfg.jetstream.collections or not accounts:
        return built
    if deps.jetstream is None:
        raise ValueError("Jetstream needs a store")
    on_post: OnPost | None = None
    if deps.alerts is not None:
        sink = deps.alerts

        def on_post(account_id: int, payload: dict[str, Any]) -> None:
            sink.publish(post_alert(account_id, payload))

    built.sources.append(JetstreamSource(cfg.jetstream, accounts, deps.jetstream, deps.metrics,
                                         on_post=on_post, cursor_name=cursor_name(cfg),
                                         name="source-jetstream", frames=deps.frames))
    return built


__all__ = ["JetstreamSource", "build", "cursor_name", "post_alert"]
