"""7TV: emote-set changes over the EventAPI v3, healed through the REST API.

- `api`: the REST calls (user by Twitch id, user, emote set).
- `follow`: one account's emote set; dispatches and REST snapshots -> events + state.
- `source`: `SevenTvSocket` (one connection, a group of accounts) and
  `SevenTvSource` (the worker that hands accounts out to sockets).

The wire protocol and the mapping are `lumio_ingestd.sources.seventv.protocol`; the
state table is `lumio_ingestd.stores.seventv` (given to the source by
`build()` in app.py as a `SetStateStore`, so nothing here touches the database).

`build_seventv()` makes the source when `[seventv] enabled` is true, for the
accounts of this shard that have `seventv_user_id`, `seventv_emote_set_id`
or `twitch_user_id`. Nothing durable here (see `follow` and `source`).
"""

from __future__ import annotations

from collections.abc import Callable

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import PersistResult, PlatformEvent
from lumio_ingestd.sources.interfaces import Alerts, SetStateStore
from lumio_ingestd.sources.seventv.follow import Followed, Follower
from lumio_ingestd.sources.seventv.source import SevenTvSocket, SevenTvSource
from lumio_ingestd.sources.sink import EventSink


def followed_accounts(cfg: Config) -> list[Followed]:
    return [Followed(a.account_id, twitch_user_id=a.twitch_user_id, pinned_set=a.seventv_emote_set_id,
                     user_id=a.seventv_user_id, user_configured=a.seventv_user_id is not None)
            for a in cfg.accounts
            if (a.seventv_user_id or a.seventv_emote_set_id or a.twitch_user_id)
            and cfg.owns(a.account_id)]


def build_seventv(cfg: Config, metrics: Metrics, *, store: SetStateStore,
                  persist_event: Callable[[PlatformEvent], PersistResult],
                  alerts: Alerts | None) -> SevenTvSource | None:
    """The source, when `[seventv] enabled` and this shard has an account to follow."""
    if not cfg.seventv.enabled:
        return None
    accounts = followed_accounts(cfg)
    if not accounts:
        return None
    sink = EventSink(persist_event, alerts=alerts, sessions=None)
    return SevenTvSource(cfg.seventv.eventapi_url, cfg.seventv.api_url, accounts, store=store,
                         sink=sink, metrics=metrics)


__all__ = ["Followed", "Follower", "SevenTvSocket", "SevenTvSource", "build_seventv",
           "followed_accounts"]
