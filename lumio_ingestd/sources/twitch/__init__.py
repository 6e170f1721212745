"""Twitch: EventSub over WebSocket (one source per account), EventSub webhooks, Helix, OAuth.

- `mapping`: frames -> chat, events, control messages (pure).
- `eventsub`, `ws`: the WebSocket protocol (welcome, keepalive, hand-off, dedup).
- `source`: `TwitchSource`, the per-account thread (subscriptions, close codes).
- `helix`, `oauth`, `httpclient`: subscriptions and the user token.
- `subscriber`, `livesessions`: a new session's subscriptions, taken back from
  a session lost without a clean close when Twitch answers 409.
- `gifts`, `sink`, `sessions`: gift-bomb linking, persisting + alerts, stream_sessions.
- `webhook`: `POST /webhooks/twitch`.
- `followers`: `FollowerHistory`, the healer of a gap's follows (Helix
  `GET /channels/followers`, with `[twitch] heal_follows`).

`build()` makes all of it from the configuration: a source for every
account of this shard that has `twitch_user_id` and `twitch_token_file`
(when `[twitch] client_id` is set), and the webhook receiver, which knows
every configured account (webhooks may arrive at any replica).
"""

from __future__ import annotations

from lumio_ingestd.config import Config
from lumio_ingestd.sources import Built, SourceDeps
from lumio_ingestd.sources.twitch.followers import FollowerHistory
from lumio_ingestd.sources.twitch.livesessions import LiveSessions
from lumio_ingestd.sources.twitch.mapping import PLATFORM
from lumio_ingestd.sources.twitch.oauth import TokenStore
from lumio_ingestd.sources.twitch.sink import TwitchSink
from lumio_ingestd.sources.twitch.source import TwitchSource
from lumio_ingestd.sources.twitch.webhook import MAX_BODY_BYTES, PATH, TwitchWebhook


def build(cfg: Config, deps: SourceDeps) -> Built:
    metrics = deps.metrics
    sink = TwitchSink(deps.persist_event, metrics, alerts=deps.alerts, sessions=deps.sessions,
                      held=deps.held_gifts)
    built = Built()
    accounts = {a.twitch_user_id: a.account_id for a in cfg.accounts if a.twitch_user_id}
    webhook = TwitchWebhook(cfg.twitch.webhook_secret, accounts, sink, deps.persist_chat,
                            deps.seen(PLATFORM), metrics, frames=deps.frames)
    built.routes.append(("POST", PATH, webhook.handle, MAX_BODY_BYTES))
    if not cfg.twitch.client_id:
        return built
    live = LiveSessions()  # the sessions this build's sockets hold open: never taken for orphans
    for account in cfg.accounts:
        if account.twitch_user_id is None or account.twitch_token_file is None:
            continue
        if not cfg.owns(account.account_id):
            continue
        tokens = TokenStore(account.twitch_token_file, cfg.twitch.oauth_url, cfg.twitch.client_id,
                            cfg.twitch.client_secret, metrics)
        name = f"source-twitch-{account.account_id}"
        source = TwitchSource(account, cfg.twitch, chat_queue=deps.chat_queue(name), sink=sink,
                              tokens=tokens, metrics=metrics, frames=deps.frames, live=live)
        if cfg.twitch.heal_follows:
            # Healed follows take persist_event only: they are late, no live alert.
            source.healer = FollowerHistory(account, cfg.twitch, tokens, deps.persist_event, metrics)
        built.sources.append(source)
    return built

__all__ = ["TwitchSource", "TwitchWebhook", "build"]
