"""What the demo starts before the daemon: servers, stand-ins, secrets and a real config file.

Everything lives in one temporary directory (`root`, under /tmp, mode 0755 so
that PostgreSQL, which runs as the unprivileged `postgres` user when the demo
runs as root, can reach its data directory):

    root/redis/                 a private redis-server (AOF on, noeviction: as in production)
    root/pg/                    a private PostgreSQL, database `lumio`, migrated
    root/secrets/               the Twitch client secret, webhook secret, emit token, user tokens
    root/ingestd.ini            the daemon's configuration, checked by `config.load`
    root/state/                 the daemon's state directory (its spool)
    root/daemon.log             the daemon's log

plus the stand-in Twitch (EventSub WebSocket, Helix, OAuth), the stand-in
Jetstream, the stand-in StreamElements Astro gateway and the stand-in 7TV
(EventAPI and REST, one emote set per account) on loopback ports.
`start_stack` registers every stop on the given ExitStack as soon as the
thing is started, so a failure half-way still stops what was started.
Nothing here is meant to outlive the demo.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from lumio_ingestd.config import Config, load
from lumio_ingestd.db.migrate import migrate
from lumio_ingestd.devkit.demo import streamelements as se
from lumio_ingestd.devkit.servers import PostgresServer, RedisServer
from lumio_ingestd.devkit.standins.jetstream import JetstreamStandin
from lumio_ingestd.devkit.standins.kick import KickStandin
from lumio_ingestd.devkit.standins.seventv import SevenTvStandin
from lumio_ingestd.devkit.standins.streamelements import AstroStandin
from lumio_ingestd.devkit.standins.twitch import TwitchStandin

DATABASE = "lumio"
POST = "app.bsky.feed.post"
LIKE = "app.bsky.feed.like"
COLLECTIONS = (POST, LIKE)
#: Redis as production wants it (docs/deployment.rst, "Redis and PostgreSQL in production"),
#: so the daemon has nothing to warn about.
REDIS_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction")


@dataclass(frozen=True)
class DemoAccount:
    """One Lumio account of the demo: a Twitch channel, a Bluesky DID, a 7TV user and emote set."""

    account_id: int
    twitch_user_id: str
    login: str
    did: str
    seventv_user_id: str = ""
    emote_set_id: str = ""


ACCOUNTS = (
    DemoAccount(1, "100001", "lumio_demo_alpha", "did:plc:demoalphaaaaaaaaaaaaaaaa",
                "01JDEMOUSERA0000000000000A", "01JDEMOSETA00000000000000A"),
    DemoAccount(2, "100002", "lumio_demo_beta", "did:plc:demobetabbbbbbbbbbbbbbbb",
                "01JDEMOUSERB0000000000000B", "01JDEMOSETB00000000000000B"),
)
#: The emotes each demo set starts with (7TV emote ids are ULIDs).
START_EMOTES = {"01JDEMOEMOTE00000000000001": "peepoHappy", "01JDEMOEMOTE00000000000002": "KEKW",
                "01JDEMOEMOTE00000000000003": "Clap"}


@dataclass(frozen=True)
class DemoKick:
    """The demo's Kick channel, beside account 1's Twitch channel."""

    account_id: int
    broadcaster_user_id: int
    username: str
    chatroom_id: int
    channel_id: int

    @property
    def chat_channel(self) -> str:
        return f"chatrooms.{self.chatroom_id}.v2"

    @property
    def event_channel(self) -> str:
        return f"channel.{self.channel_id}"


KICK = DemoKick(1, 700001, "lumio_demo_kick", 800001, 900001)


@dataclass
class Stack:
    root: Path
    redis: RedisServer
    pg: PostgresServer
    twitch: TwitchStandin
    jetstream: JetstreamStandin
    config_path: Path
    cfg: Config
    kick: KickStandin
    seventv: SevenTvStandin | None = None
    accounts: tuple[DemoAccount, ...] = ACCOUNTS
    astro: AstroStandin | None = None  # the stand-in StreamElements Astro gateway
    kick_channel: DemoKick = KICK

    @property
    def database_url(self) -> str:
        return self.pg.url(DATABASE)


def start_stack(root: Path, cleanup: ExitStack, notice: Callable[[str], None], *,
                pg_settings: Mapping[str, str] | None = None) -> Stack:
    """`pg_settings` override the PostgreSQL server's (`-c` on its command line, which
    wins over ALTER SYSTEM): the soak turns durability back on with them."""
    redis_server = RedisServer(root / "redis", extra_args=REDIS_ARGS)
    cleanup.callback(redis_server.close)
    redis_server.start()
    pg = PostgresServer(root / "pg", settings=pg_settings)
    cleanup.callback(pg.close)
    pg.start()
    pg.create_database(DATABASE)
    notice(f"started redis-server on port {redis_server.port} and PostgreSQL on port {pg.port}")

    twitch = TwitchStandin(client_id="lumio-demo-client")
    twitch.record_sent = False  # the demo may run for hours
    cleanup.callback(twitch.close)
    twitch.start()
    jetstream = JetstreamStandin()
    cleanup.callback(jetstream.close)
    jetstream.start()
    astro = se.start_astro(cleanup)
    seventv = SevenTvStandin(heartbeat_interval_ms=5000)
    seventv.record_inbound = False
    cleanup.callback(seventv.close)
    seventv.start()
    for account in ACCOUNTS:
        seventv.add_set(account.emote_set_id, START_EMOTES)
        seventv.add_user(account.seventv_user_id, twitch_id=account.twitch_user_id,
                         set_id=account.emote_set_id, username=account.login)
    kick = KickStandin(client_id="lumio-demo-kick")
    cleanup.callback(kick.close)
    kick.start()
    notice(f"started the stand-in Twitch (EventSub ws://127.0.0.1:{twitch.ws_port}, Helix and OAuth "
           f"on port {twitch.http_port}), the stand-in Jetstream (port {jetstream.port}), the "
           f"stand-in StreamElements Astro gateway (port {astro.port}), the stand-in 7TV "
           f"(EventAPI port {seventv.ws_port}, REST port {seventv.http_port}) and the stand-in Kick "
           f"(Pusher port {kick.ws_port}, API port {kick.http_port})")

    config_path = write_config(root, redis_server, pg, twitch, jetstream, astro, seventv, kick=kick)
    cfg = load(str(config_path), {})
    applied = migrate(cfg.timescale)
    notice(f"database {DATABASE!r} migrated ({len(applied)} migrations); configuration {config_path}")
    return Stack(root, redis_server, pg, twitch, jetstream, config_path, cfg, kick, seventv=seventv,
                 astro=astro)


def _secret(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def write_config(root: Path, redis_server: RedisServer, pg: PostgresServer, twitch: TwitchStandin,
                 jetstream: JetstreamStandin, astro: AstroStandin | None = None,
                 seventv: SevenTvStandin | None = None, *, kick: KickStandin) -> Path:
    """A complete configuration for the daemon, with short intervals so the demo moves quickly."""
    secrets = root / "secrets"
    secrets.mkdir(mode=0o700)
    client_secret = _secret(secrets, "twitch_client_secret", twitch.client_secret)
    webhook_secret = _secret(secrets, "twitch_webhook_secret", "lumio-demo-webhook-secret")
    emit_token = _secret(secrets, "emit_token", "lumio-demo-emit-token")
    # The stand-in Kick signs its webhooks with its own key pair, not Kick's.
    kick_key = _secret(secrets, "kick_webhook_public_key.pem", kick.public_pem())
    account_sections = []
    se_section, se_lines = se.config_text(astro, secrets, [a.account_id for a in ACCOUNTS]) \
        if astro is not None else ("", {})
    for account in ACCOUNTS:
        token = _secret(secrets, f"twitch-token-{account.account_id}.json", json.dumps(
            {"access_token": twitch.access_token, "refresh_token": twitch.refresh_token}))
        account_sections.append(
            f"[account.{account.account_id}]\n"
            f"twitch_user_id = {account.twitch_user_id}\n"
            f"twitch_token_file = {token}\n"
            f"bluesky_did = {account.did}\n" + se_lines.get(account.account_id, "")
            + (f"kick_broadcaster_user_id = {KICK.broadcaster_user_id}\n"
               f"kick_chatroom_id = {KICK.chatroom_id}\n"
               f"kick_channel_id = {KICK.channel_id}\n" if account.account_id == KICK.account_id else ""))
    text = f"""\
# Written by `lumio-ingestd demo`: the daemon against private servers and stand-ins.
# Intervals are short so that a flush, a replay or a drain happens while you watch.

[daemon]
instance_id = demo
state_dir = {root / "state"}
log_level = info

[redis]
url = {redis_server.url}

[timescale]
dsn = {pg.url(DATABASE)}
pool_size = 5
acquire_timeout_secs = 2
connect_timeout_secs = 2
statement_timeout_secs = 10

[chat]
flush_interval_secs = 0.5
max_flush_failures = 3
deadletter_drain_interval_secs = 1

[events]
# insert_timeout_secs stays at its 3 s: below 3 the pool may not open a connection inside it.
retry_interval_secs = 1

[metrics]
listen = 127.0.0.1:0

[http]
listen = 127.0.0.1:0
emit_token_file = {emit_token}

[twitch]
eventsub_ws_url = {twitch.ws_url}
helix_url = {twitch.helix_url}
oauth_url = {twitch.oauth_url}
client_id = {twitch.client_id}
client_secret_file = {client_secret}
webhook_secret_file = {webhook_secret}
keepalive_timeout_secs = 10

[kick]
pusher_url = {kick.pusher_url}
api_url = {kick.api_url}
oauth_url = {kick.oauth_url}
webhook_public_key_file = {kick_key}

[streamstatus]
interval_secs = 2
platforms = twitch

[jetstream]
url = {jetstream.url}
collections = {", ".join(COLLECTIONS)}
rewind_secs = 5

""" + (se_section + "\n" if se_section else "") + (f"""\
[seventv]
enabled = true
eventapi_url = {seventv.eventapi_url}
api_url = {seventv.api_url}

""" if seventv is not None else "") + "\n".join(account_sections)
    path = root / "ingestd.ini"
    path.write_text(text)
    return path
