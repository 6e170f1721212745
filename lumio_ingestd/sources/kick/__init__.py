"""Kick: the Pusher chat socket (one source per account), official webhooks and their subscriptions.

- `mapping`: Pusher frames and webhook bodies -> chat, events (pure).
- `source`: `KickSource`, the per-account Pusher thread (keepalive, close codes).
- `signature`: RSA PKCS#1 v1.5 SHA-256 verification with the standard library.
- `webhook`: `POST /webhooks/kick`.
- `subscriptions`: `KickSubscriptions`, the webhook subscriptions kept in line.

`build()` makes all of it from the configuration: a source for every
account of this shard that has `kick_chatroom_id`, the webhook receiver
(always routed: webhooks may arrive at any replica, for any configured
account), and, with `manage_webhooks = true` and the app credentials, the
subscriptions worker on shard 0.
"""

from __future__ import annotations

from lumio_ingestd.config import Config
from lumio_ingestd.sources import Built, SourceDeps
from lumio_ingestd.sources.apptoken import AppToken
from lumio_ingestd.sources.kick.mapping import PLATFORM
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

KEY_SETTING = "[kick] webhook_public_key_file"


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


def build(cfg: Config, deps: SourceDeps) -> Built:
    """Raises KeyFormatError when `deps` has no key and the configured key file is unusable."""
    metrics = deps.metrics
    sink = EventSink(deps.persist_event, alerts=deps.alerts, sessions=deps.sessions)
    built = Built()
    accounts = {a.kick_broadcaster_user_id: a.account_id for a in cfg.accounts if a.kick_broadcaster_user_id}
    webhook = KickWebhook(deps.kick_webhook_key or webhook_key(cfg), accounts, sink, deps.persist_chat,
                          deps.seen(PLATFORM), metrics, max_age_secs=cfg.kick.webhook_max_age_secs)
    built.routes.append(("POST", PATH, webhook.handle, MAX_BODY_BYTES))
    for account in cfg.accounts:
        if account.kick_chatroom_id is None or not cfg.owns(account.account_id):
            continue
        name = f"source-kick-{account.account_id}"
        built.sources.append(KickSource(account, cfg.kick, chat_queue=deps.chat_queue(name), sink=sink,
                                        metrics=metrics, frames=deps.frames))
    if cfg.kick.manage_webhooks and cfg.kick.client_id and cfg.kick.client_secret is not None \
            and cfg.leads:
        token = AppToken(cfg.kick.oauth_url.rstrip("/") + "/oauth/token", cfg.kick.client_id,
                         cfg.kick.client_secret)
        # With `shard = auto` every replica builds it and a lease picks the one that runs it.
        built.leader_timers.append(KickSubscriptions(cfg.kick.api_url, token, set(accounts), metrics))
    return built


__all__ = ["KickSource", "KickSubscriptions", "KickWebhook", "build", "webhook_key"]
