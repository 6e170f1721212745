"""7TV: emote-set changes over the EventAPI v3, healed through the REST API.

- `api`: the REST calls (user by Twitch id, user, emote set).
- `follow`: one account's emote set; dispatches and REST snapshots -> events + state.
- `source`: `SevenTvSocket` (one connection, a group of accounts) and
  `SevenTvSource` (the worker that hands accounts out to sockets).

The wire protocol and the mapping are `lumio_ingestd.sources.seventv.protocol`; the
state table is `lumio_ingestd.stores.seventv` (given to the source by
the runtime as a `SetStateStore`, so nothing here touches the database).

`build()` makes the source when `[seventv] enabled` is true, for the
accounts of this shard that have `seventv_user_id`, `seventv_emote_set_id`
or `twitch_user_id`. Nothing durable here (see `follow` and `source`).
"""

from __future__ import annotations

from lumio_ingestd.config import Config
from lumio_ingestd.sources import Built, SourceDeps
from lumio_ingestd.sources.seventv.follow import Followed, Follower
from lumio_ingestd.sources.seventv.source import SevenTvSocket, SevenTvSource
from lumio_ingestd.sources.sink import EventSink


def followed_accounts(cfg: Config) -> list[Followed]:
    return [Followed(a.account_id, twitch_user_id=a.twitch_user_id, pinned_set=a.seventv_emote_set_id,
                     user_id=a.seventv_user_id, user_configured=a.seventv_user_id is not None)
            for a in cfg.accounts
            if (a.seventv_user_id or a.seventv_emote_set_id or a.twitch_user_id)
            and cfg.owns(a.account_id)]


def build(cfg: Config, deps: SourceDeps) -> Built:
    built = Built()
    if not cfg.seventv.enabled:
        return built
    accounts = followed_accounts(cfg)
    if not accounts:
        return built
    if deps.set_states is None:
        raise ValueError("7TV needs a set-state store")
    sink = EventSink(deps.persist_event, alerts=deps.alerts, sessions=None)
    built.sources.append(SevenTvSource(cfg.seventv.eventapi_url, cfg.seventv.api_url, accounts,
                                       store=deps.set_states, sink=sink, metrics=deps.metrics,
                                       frames=deps.frames))
    return built


__all__ = ["Followed", "Follower", "SevenTvSocket", "SevenTvSource", "build", "followed_accounts"]
