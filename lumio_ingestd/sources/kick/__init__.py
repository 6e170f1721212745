"""Kick: the Pusher chat socket (one source per account), official webhooks and their subscriptions.

- `mapping`: Pusher frames and webhook bodies -> chat, events (pure).
- `source`: `KickSource`, the per-account Pusher thread (keepalive, close codes).
- `signature`: RSA PKCS#1 v1.5 SHA-256 verification with the standard library.
- `webhook`: `POST /webhooks/kick`.
- `subscriptions`: `KickSubscriptions`, the webhook subscriptions kept in line.

`build_kick()` makes all of it from the configuration: a source for every
account of this shard that has `kick_chatroom_id`, the webhook receiver
(always routed: webhooks may arrive at any replica, for any configured
account), and, with `manage_webhooks = true` and the app credentials, the
subscriptions worker on shard 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lumio_ingestd.config import Config
from lumio_ingestd.metrics import Metrics
from lumio_ingestd.model import ChatMessage, PersistResult, PlatformEvent
from lumio_ingestd.sources.apptoken import AppToken
from lumio_ingestd.sources.interfaces import Alerts, ChatQueueLike, SeenIds, SessionStore
from lumio_ingestd.sources.kick.signature import (
    KeyFormatError,
    RsaPublicKey,
    packaged_key,
    parse_public_key_pem,
)
from lumio_ingestd.sources.kick.source import KickSource
from lumio_ingestd.sources.kick.subscriptions import KickSubscriptions
from lumio_ingestd.sources.kick.webhook import MAX_BODY_BYTES, PATH, KickWebhook
from lumio_ingestd.sources.sink import EventSink
from lumio_ingestd.web.server import Routes

KEY_SETTING = "[kick] webhook_public_key_file"


@dataclass
class KickParts:
    sources: list[KickSource] = field(default_factory=list)
    webhook: KickWebhook | None = None
    subscriptions: KickSubscriptions | None = None

    def add_routes(self, routes: Routes) -> None:
        if self.webhook is not None:
            routes.add("POST", PATH, self.webhook.handle, max_body_bytes=MAX_BODY_BYTES)


def webhook_key(cfg: Config) -> RsaPublicKey:
    """The configured webhook key, else Kick's published one; raises KeyFormatError naming the file."""
    path = cfg.kick.webhook_public_key_file
    if path is None:
        return packaged_key()
    try:
        return parse_public_key_pem(path.read_text("ascii"))
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFormatError(f"{KEY_SETTING} {path}: cannot read it: {exc}") from None
    except KeyFormatError as exc:
        raise KeyFormatError(f"{KEY_SETTING} {path}: {exc}") from None


def build_kick(cfg: Config, metrics: Metrics, *, sessions: SessionStore, seen: SeenIds,
               chat_queue: Callable[[str], ChatQueueLike], chat: Callable[[ChatMessage], str],
               persist_event: Callable[[PlatformEvent], PersistResult],
               alerts: Alerts | None, key: RsaPublicKey | None = None) -> KickParts:
    """Raises KeyFormatError when `key` is not given and the configured key file is unusable."""
    sink = EventSink(persist_event, alerts=alerts, sessions=sessions)
    parts = KickParts()
    accounts = {a.kick_broadcaster_user_id: a.account_id for a in cfg.accounts if a.kick_broadcaster_user_id}
    parts.webhook = KickWebhook(key or webhook_key(cfg), accounts, sink, chat, seen, metrics,
                                max_age_secs=cfg.kick.webhook_max_age_secs)
    for account in cfg.accounts:
        if account.kick_chatroom_id is None or not cfg.owns(account.account_id):
            continue
        name = f"source-kick-{account.account_id}"
        parts.sources.append(KickSource(account, cfg.kick, chat_queue=chat_queue(name), sink=sink,
                                        metrics=metrics))
    if cfg.kick.manage_webhooks and cfg.kick.client_id and cfg.kick.client_secret is not None \
            and cfg.leads:
        token = AppToken(cfg.kick.oauth_url.rstrip("/") + "/oauth/token", cfg.kick.client_id,
                         cfg.kick.client_secret)
        parts.subscriptions = KickSubscriptions(cfg.kick.api_url, token, set(accounts), metrics)
    return parts


__all__ = ["KickParts", "KickSource", "KickSubscriptions", "KickWebhook", "build_kick", "webhook_key"]
