"""Twitch: EventSub over WebSocket (one source per account), EventSub webhooks, Helix, OAuth.

- `mapping`: frames -> chat, events, control messages (pure).
- `eventsub`, `ws`: the WebSocket protocol (welcome, keepalive, hand-off, dedup).
- `source`: `TwitchSource`, the per-account thread (subscriptions, close codes).
- `helix`, `oauth`, `httpclient`: subscriptions and the user token.
- `gifts`, `sink`, `sessions`: gift-bomb linking, persisting + alerts, stream_sessions.
- `webhook`: `POST /webhooks/twitch`.

`build_twitch()` makes all of it from the configuration: a source for every
account of this shard that has `twitch_user_id` and `twitch_token_file`
(when `[twitch] client_id` is set), and the webhook receiver, which knows
every configured account (webhooks may arrive at any replica).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage, PersistResult, PlatformEvent
from lumio_ingestd.sources.interfaces import Alerts, ChatQueueLike, SeenIds, SessionStore
from lumio_ingestd.sources.twitch.oauth import TokenStore
from lumio_ingestd.sources.twitch.sink import HeldCopies, TwitchSink
from lumio_ingestd.sources.twitch.source import TwitchSource
from lumio_ingestd.sources.twitch.webhook import MAX_BODY_BYTES, PATH, TwitchWebhook
from lumio_ingestd.web.server import Routes


@dataclass
class TwitchParts:
    sources: list[TwitchSource] = field(default_factory=list)
    webhook: TwitchWebhook | None = None
    sessions: SessionStore | None = None

    def add_routes(self, routes: Routes) -> None:
        if self.webhook is not None:
            routes.add("POST", PATH, self.webhook.handle, max_body_bytes=MAX_BODY_BYTES)


def build_twitch(cfg: Config, metrics: Metrics, *, sessions: SessionStore, seen: SeenIds,
                 chat_queue: Callable[[str], ChatQueueLike], chat: Callable[[ChatMessage], str],
                 persist_event: Callable[[PlatformEvent], PersistResult],
                 alerts: Alerts | None, held: HeldCopies | None = None) -> TwitchParts:
    sink = TwitchSink(persist_event, metrics, alerts=alerts, sessions=sessions, held=held)
    parts = TwitchParts(sessions=sessions)
    accounts = {a.twitch_user_id: a.account_id for a in cfg.accounts if a.twitch_user_id}
    parts.webhook = TwitchWebhook(cfg.twitch.webhook_secret, accounts, sink, chat, seen, metrics)
    if not cfg.twitch.client_id:
        return parts
    for account in cfg.accounts:
        if account.twitch_user_id is None or account.twitch_token_file is None:
            continue
        if not cfg.owns(account.account_id):
            continue
        tokens = TokenStore(account.twitch_token_file, cfg.twitch.oauth_url, cfg.twitch.client_id,
                            cfg.twitch.client_secret, metrics)
        name = f"source-twitch-{account.account_id}"
        parts.sources.append(TwitchSource(account, cfg.twitch, chat_queue=chat_queue(name), sink=sink,
                                          tokens=tokens, metrics=metrics))
    return parts


__all__ = ["TwitchParts", "TwitchSource", "TwitchWebhook", "build_twitch"]
