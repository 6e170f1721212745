"""The configuration's one table: `SCHEMA`, every key with its section, default, kind and help.

The loader, the dataclass defaults, the example file and the reference in
docs/configuration.rst are all made from it. Nothing durable here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from lumio_ingestd.config.kinds import (
    ACCOUNT_SECTION,
    _AbsPath,
    _Bool,
    _Choice,
    _Collections,
    _Context,
    _Dsn,
    _Float,
    _HostPorts,
    _IdList,
    _InstanceId,
    _Int,
    _Kind,
    _Listen,
    _Names,
    _ReadableFile,
    _RedisUrl,
    _SecretFile,
    _Shard,
    _Text,
    _Url,
)

# ---------------------------------------------------------------------------
# The schema


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of the configuration file.

    `default` is the text the key has when it is absent ("" = unset, or
    computed: see `help`); `example` is the text shown in the example file,
    commented out there when `commented`. `fields` are the attributes of the
    section's dataclass that the key fills (two for `shard` and `listen`).
    """

    section: str
    key: str
    default: str
    help: str
    kind: _Kind = field(repr=False, compare=False)
    fields: tuple[str, ...]
    example: str
    commented: bool = False
    secret: bool = False


def _s(
    section: str,
    key: str,
    default: str,
    kind: _Kind,
    help: str,
    *,
    fields: tuple[str, ...] | None = None,
    example: str | None = None,
    commented: bool = False,
) -> Setting:
    return Setting(
        section=section,
        key=key,
        default=default,
        help=help,
        kind=kind,
        fields=fields if fields is not None else (key,),
        example=example if example is not None else default,
        commented=commented,
        secret=isinstance(kind, _SecretFile),
    )


_CREDENTIAL_HELP = (
    "an absolute path, or a bare name looked up in $CREDENTIALS_DIRECTORY "
    "(systemd LoadCredential=). The file holds only the secret; a trailing "
    "newline is dropped."
)
_WS = _Url(("ws", "wss"))
_HTTP = _Url(("http", "https"))
_SECONDS = _Float()
_LISTEN = _Listen()

SECTION_HELP: Final[Mapping[str, str]] = {
    "daemon": "The process itself.",
    "redis": "Redis: the buffer for chat and the dead-letter lists for events.",
    "timescale": "TimescaleDB (or plain PostgreSQL): where chat and events are stored.",
    "chat": "Chat messages: buffered in Redis, written to the database in batches.",
    "events": "Platform events (subs, cheers, raids, ...): inserted at once, parked in Redis on failure.",
    "metrics": "Prometheus metrics, served at /metrics.",
    "http": "Webhooks, the emit API, live alert streams and health checks.",
    "twitch": "Twitch: EventSub over WebSocket and webhooks, Helix, OAuth.",
    "jetstream": "Bluesky Jetstream.",
    "kick": "Kick: the Pusher chat socket, the official webhooks and their subscriptions.",
    "streamelements": "StreamElements: tips and activities over the Astro WebSocket gateway.",
    "seventv": "7TV: emote-set changes over the EventAPI, checked against the REST API.",
    "streamstatus": (
        "Stream status: the live status and viewer count of every account of this shard, "
        "polled from the platforms' APIs (a safety net for missed online/offline events, "
        "and per-minute statistics)."
    ),
    "synthetic": (
        "A synthetic test source: steady made-up chat and events with ids "
        "syn-RUN-SEQ, for load tests and demos. Off unless rate_per_sec is above 0; "
        "never enable it on a production database."
    ),
    ACCOUNT_SECTION: (
        "One section per Lumio account, [account.N] with N the account id "
        "(a positive whole number). A platform is ingested for the account when "
        "its keys are set."
    ),
}

SCHEMA: Final[tuple[Setting, ...]] = (
    # [daemon]
    _s("daemon", "instance_id", "", _InstanceId(),
       "Name of this process in Redis (in-flight lists, heartbeats); unique among "
       "running processes, not ending in .dl or .f and a number (the names of its "
       "workers' lists). Empty = HOSTNAME:PID."),
    _s("daemon", "state_dir", "/var/lib/lumio-ingestd", _AbsPath(),
       "Directory of the local spool, the cursors and the quarantine files; an absolute path."),
    _s("daemon", "log_level", "info", _Choice(("debug", "info", "warning", "error")),
       "Lowest level that is logged: debug, info, warning or error."),
    _s("daemon", "shard", "0/1", _Shard(),
       "This replica's share of the accounts, as INDEX/COUNT: the replica's index "
       "(from 0) and the number of replicas. 0/1 = a single replica. auto = the live "
       "replicas (their lumio:instance heartbeats) split the accounts among themselves "
       "by rendezvous hashing, and move them when one stops, dies or joins.",
       fields=("shard_index", "shard_count", "shard_auto")),
    _s("daemon", "accounts_dir", "/etc/lumio/accounts.d", _AbsPath(),
       "Directory whose .ini files may hold more [account.N] sections (and nothing else); "
       "a missing directory holds none. Read at start and again on SIGHUP, which starts, "
       "stops and restarts the sources of the accounts added, removed and changed."),
    _s("daemon", "spool_max_bytes", "1073741824", _Int(1),
       "Largest size of the local spool, which holds chat and events while Redis "
       "and the database are both down, in bytes."),
    _s("daemon", "shutdown_timeout_secs", "8", _SECONDS,
       "Time a stop may take to hand what is in memory to Redis, flush and spool "
       "the rest, in seconds. Keep it below the unit's TimeoutStopSec."),
    _s("daemon", "heal_max_hours", "72", _Float(unit="hours"),
       "The longest stretch of a gap healed from a platform's history API, counted back from "
       "its end; the older part is recorded in source_gaps, not healed (status partial)."),
    _s("daemon", "seen_interval_secs", "5", _SECONDS,
       "How often each connected and subscribed source records in Redis that it is, in "
       "seconds; after a crash a gap starts at most this long before the last record."),
    # [redis]
    _s("redis", "url", "redis://127.0.0.1:6379/0", _RedisUrl(),
       "The Redis server: redis://HOST:PORT/DB, rediss:// for TLS, or "
       "unix:///path/to/redis.sock?db=N. Keep the password out of the URL: use password_file."),
    _s("redis", "password_file", "", _SecretFile(),
       "File holding the Redis password: " + _CREDENTIAL_HELP + " Unset = no password.",
       fields=("password",), example="redis_password", commented=True),
    _s("redis", "socket_timeout_secs", "2", _SECONDS,
       "Longest wait for the answer to one Redis command, in seconds."),
    _s("redis", "connect_timeout_secs", "2", _SECONDS,
       "Longest wait for a connection to Redis, in seconds."),
    _s("redis", "cluster", "false", _Bool(),
       "true: url names one node of a Redis Cluster; the client finds the others, follows "
       "MOVED and failovers. Every multi-key operation stays within one account's {ACCOUNT} slot."),
    _s("redis", "sentinels", "", _HostPorts(),
       "HOST:PORT,HOST:PORT,...: find the primary through these Redis Sentinels, and follow "
       "it when they fail over to a replica. url then gives only the database number, the "
       "user and TLS (its host and port are not used). Empty = no Sentinel.",
       example="10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379", commented=True),
    _s("redis", "sentinel_service", "mymaster", _Text(re.compile(r"[A-Za-z0-9._-]{1,100}"),
                                                      "a Sentinel service name (letters, digits, . _ -)"),
       "The name the Sentinels know the primary by (their 'sentinel monitor NAME ...')."),
    _s("redis", "min_replicas_acked", "0", _Int(0, 16),
       "0 = a write counts as done once the primary acknowledged it. N > 0: only once WAIT says "
       "N replicas hold it too; a write they do not confirm within replica_ack_timeout_ms takes "
       "the next tier (the database, then the spool), so a primary that dies before "
       "replicating loses nothing. See docs/operating.rst, 'Redis failover'."),
    _s("redis", "replica_ack_timeout_ms", "500", _Int(1, 60000, unit="milliseconds"),
       "Longest wait for the replicas' acknowledgement of one write (WAIT's timeout), in "
       "milliseconds; only with min_replicas_acked > 0."),
    # [timescale]
    _s("timescale", "dsn", "postgresql://lumio@127.0.0.1:5432/lumio", _Dsn(),
       "The database, as a libpq URI: postgresql://USER@HOST:PORT/DBNAME?PARAM=VALUE. "
       "Keep the password out of it: use password_file."),
    _s("timescale", "password_file", "", _SecretFile(),
       "File holding the database password: " + _CREDENTIAL_HELP + " Unset = no password "
       "(or ~/.pgpass, peer authentication).",
       fields=("password",), example="db_password", commented=True),
    _s("timescale", "pool_size", "5", _Int(1),
       "Database connections the daemon keeps open; a whole number >= 1."),
    _s("timescale", "statement_timeout_secs", "30", _Float(inclusive=True),
       "Longest time one SQL statement may run before the server cancels it, in "
       "seconds; 0 = no limit."),
    _s("timescale", "acquire_timeout_secs", "30", _SECONDS,
       "Longest wait for a free connection from the pool, in seconds."),
    _s("timescale", "connect_timeout_secs", "5", _Int(2, unit="seconds"),
       "Longest wait for a new database connection, in whole seconds (at least 2: "
       "libpq rounds lower values up)."),
    _s("timescale", "tcp_user_timeout_secs", "10", _Float(inclusive=True),
       "How long sent data may stay unacknowledged before a database connection "
       "counts as dead (TCP_USER_TIMEOUT), in seconds; 0 = the OS default."),
    _s("timescale", "keepalive_idle_secs", "10", _Int(1, unit="seconds"),
       "Idle time before TCP keepalive probes start on a database connection, in whole seconds."),
    _s("timescale", "migration_lock_timeout_secs", "5", _SECONDS,
       "How long a migration waits for a table lock before that attempt gives up "
       "(lock_timeout), in seconds."),
    _s("timescale", "migration_retries", "12", _Int(0),
       "Further attempts at the migrations after one gave up; 0 = try once."),
    _s("timescale", "migration_retry_interval_secs", "5", _SECONDS,
       "Pause between two migration attempts, in seconds."),
    _s("timescale", "compress_after_hours", "0", _Float(unit="hours", inclusive=True),
       "TimescaleDB only: chunks of chat_messages and events whose data is older than this "
       "are compressed (segmented by account, ordered by time), by a columnstore policy the "
       "daemon also runs itself. 0 = off. Must be above the dead-letter horizon (72 h, or "
       "[chat] deadletter_ttl_hours if longer) plus one chunk interval of events (7 days), "
       "so that a late replay finds its chunk uncompressed. On plain PostgreSQL a value "
       "above 0 only logs a warning.", example="0"),
    # [chat]
    _s("chat", "flush_interval_secs", "5", _SECONDS,
       "How often the chat buffers in Redis are written to the database, in seconds."),
    _s("chat", "flush_batch_size", "1000", _Int(1),
       "Most chat messages written in one database batch."),
    _s("chat", "flush_workers", "2", _Int(1, 16),
       "Chat flush threads of this process. Each claims its own batches (its own "
       "in-flight list per account), so while one waits on the database another "
       "claims and writes the next: one busy account's backlog, or many sockets' "
       "buffers, are written over that many connections of the pool at once."),
    _s("chat", "max_flush_failures", "5", _Int(1),
       "Failed flushes in a row after which an account's batch moves to its "
       "dead-letter list."),
    _s("chat", "deadletter_ttl_hours", "72", _Float(unit="hours"),
       "How long a chat dead-letter list is kept in Redis, in hours."),
    _s("chat", "deadletter_drain_interval_secs", "60", _SECONDS,
       "How often the chat dead-letter lists are replayed into the database, in seconds."),
    _s("chat", "retention_days", "30", _Int(1, unit="days"),
       "Chat messages older than this are deleted, in days."),
    # [events]
    _s("events", "insert_timeout_secs", "3", _SECONDS,
       "Longest time the inline insert of one event may take, waiting for a "
       "pooled connection included, before the event is parked, in seconds. "
       "Once one has failed, later events are parked without a try until the "
       "database answers again."),
    _s("events", "retry_interval_secs", "30", _SECONDS,
       "How often parked events are replayed into the database, in seconds."),
    _s("events", "retention_days", "365", _Int(1, unit="days"),
       "Events older than this are deleted, in days."),
    # [metrics]
    _s("metrics", "listen", "127.0.0.1:9464", _LISTEN,
       "Address of the metrics listener, HOST:PORT (IPv6 as [::1]:9464); port 0 = "
       "any free port. Do not expose it beyond the scraper.",
       fields=("listen_host", "listen_port")),
    # [http]
    _s("http", "listen", "127.0.0.1:8780", _LISTEN,
       "Address of the HTTP listener (webhooks, emit API, alert streams, /healthz, "
       "/readyz), HOST:PORT (IPv6 as [::1]:8780); port 0 = any free port.",
       fields=("listen_host", "listen_port")),
    _s("http", "emit_token_file", "", _SecretFile(),
       "File holding the bearer token of POST /v1/events/emit and the alert "
       "streams: " + _CREDENTIAL_HELP + " Unset = those endpoints answer 403.",
       fields=("emit_token",), example="emit_token", commented=True),
    _s("http", "trusted_proxy_header", "",
       _Text(re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}"), "an HTTP header name such as "
             "X-Forwarded-For", optional=True),
       "Header in which the reverse proxy in front of the listener names the client "
       "(the first address of X-Forwarded-For, or X-Real-IP). Set it only when every "
       "request comes through that proxy: it turns on max_connections_per_client, keyed "
       "on the header's value. Unset = no per-client cap (behind a proxy every request "
       "has the proxy's address).", example="X-Forwarded-For", commented=True),
    _s("http", "max_connections_per_client", "16", _Int(1),
       "With trusted_proxy_header: requests one client may have open at once (read, "
       "in flight or streaming); more are answered 429."),
    # [twitch]
    _s("twitch", "eventsub_ws_url", "wss://eventsub.wss.twitch.tv/ws", _WS,
       "EventSub WebSocket endpoint (ws:// or wss://)."),
    _s("twitch", "helix_url", "https://api.twitch.tv/helix", _HTTP,
       "Helix API base URL (http:// or https://)."),
    _s("twitch", "heal_follows", "true", _Bool(),
       "true: follows missed during a gap are read back from Helix GET /channels/followers "
       "(needs the moderator:read:followers scope); false: a gap is recorded, not healed."),
    _s("twitch", "oauth_url", "https://id.twitch.tv/oauth2", _HTTP,
       "OAuth base URL, for token refresh and validation (http:// or https://)."),
    _s("twitch", "client_id", "",
       _Text(re.compile(r"[!-~]{1,200}"), "a client id without spaces", empty_ok=True),
       "Client id of the Twitch application. Empty = Twitch is not used."),
    _s("twitch", "client_secret_file", "", _SecretFile(),
       "File holding the Twitch application's client secret: " + _CREDENTIAL_HELP,
       fields=("client_secret",), example="twitch_client_secret", commented=True),
    _s("twitch", "webhook_secret_file", "", _SecretFile(ascii_length=(10, 100)),
       "File holding the HMAC secret of the EventSub webhook subscriptions "
       "(10 to 100 ASCII characters): " + _CREDENTIAL_HELP,
       fields=("webhook_secret",), example="twitch_webhook_secret", commented=True),
    _s("twitch", "keepalive_timeout_secs", "30", _Int(10, 600, unit="seconds"),
       "Keepalive interval asked for in the EventSub WebSocket URL, in whole "
       "seconds from 10 to 600; the connection counts as dead when nothing "
       "arrives for longer."),
    # [jetstream]
    _s("jetstream", "url", "wss://jetstream2.us-east.bsky.network/subscribe", _WS,
       "Jetstream subscribe endpoint (ws:// or wss://)."),
    _s("jetstream", "collections", "", _Collections(),
       "Collections to receive, comma-separated NSIDs such as app.bsky.feed.post "
       "(or prefixes such as app.bsky.graph.*). Empty = Jetstream is not used; it runs when "
       "this is set and an account of this shard has a bluesky_did."),
    _s("jetstream", "rewind_secs", "5", _Float(inclusive=True),
       "On reconnect, resume this far before the saved cursor, in seconds "
       "(replays are idempotent)."),
    # [kick]
    _s("kick", "pusher_url",
       "wss://ws-us2.pusher.com/app/32cbd69e4b950bf97679?protocol=7&client=js&version=8.4.0&flash=false",
       _WS, "Kick's Pusher WebSocket endpoint for chat and channel events (ws:// or wss://)."),
    _s("kick", "api_url", "https://api.kick.com/public/v1", _HTTP,
       "Kick public API base URL: webhook subscriptions and livestream look-ups (http:// or https://)."),
    _s("kick", "oauth_url", "https://id.kick.com", _HTTP,
       "Kick OAuth base URL, for the app token (client credentials; http:// or https://)."),
    _s("kick", "client_id", "",
       _Text(re.compile(r"[!-~]{1,200}"), "a client id without spaces", empty_ok=True),
       "Client id of the Kick application (webhook subscriptions, livestream look-ups). "
       "Empty = no Kick API calls; the Pusher socket and webhooks need none."),
    _s("kick", "client_secret_file", "", _SecretFile(),
       "File holding the Kick application's client secret: " + _CREDENTIAL_HELP,
       fields=("client_secret",), example="kick_client_secret", commented=True),
    _s("kick", "webhook_public_key_file", "", _ReadableFile(),
       "PEM file with the public key Kick signs webhooks with. Unset = Kick's published key, "
       "shipped with the package.",
       example="/etc/lumio/kick_webhook_public_key.pem", commented=True),
    _s("kick", "webhook_max_age_secs", "600", _SECONDS,
       "Webhook deliveries older than this, or dated this far in the future, are refused, in seconds."),
    _s("kick", "manage_webhooks", "false", _Bool(),
       "true: create and keep the accounts' webhook subscriptions through the API (needs "
       "client_id and client_secret_file); false: leave them to the Kick app settings."),
    # [streamelements]
    _s("streamelements", "astro_url", "wss://astro.streamelements.com", _WS,
       "StreamElements Astro WebSocket gateway (ws:// or wss://)."),
    _s("streamelements", "api_url", "https://api.streamelements.com/kappa/v2", _HTTP,
       "StreamElements REST API base URL (http:// or https://): the activities and tips "
       "a gap missed are read back from it."),
    _s("streamelements", "topics", "channel.tips,channel.activities",
       _Names("topics like channel.tips", re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_-]+)+")),
       "Topics every account subscribes to, comma-separated."),
    _s("streamelements", "keep_donor_pii", "false", _Bool(),
       "true: keep donors' email, geo and IP address in stored tips and activities; false "
       "(the default): removed before they reach Redis, the spool or the database."),
    # [seventv]
    _s("seventv", "enabled", "false", _Bool(),
       "true: follow the 7TV emote sets of this shard's accounts (configured with "
       "seventv_user_id / seventv_emote_set_id, or found from twitch_user_id)."),
    _s("seventv", "eventapi_url", "wss://events.7tv.io/v3", _WS,
       "7TV EventAPI WebSocket endpoint (ws:// or wss://)."),
    _s("seventv", "api_url", "https://7tv.io/v3", _HTTP,
       "7TV REST API base URL (http:// or https://)."),
    # [streamstatus]
    _s("streamstatus", "interval_secs", "60", _SECONDS,
       "How often the live status of every account is polled, in seconds."),
    _s("streamstatus", "platforms", "twitch,kick",
       _Names("platforms from twitch, kick", choices=("twitch", "kick")),
       "Platforms polled, comma-separated (twitch, kick). A platform is polled only when its "
       "client_id and client_secret_file are set."),
    _s("streamstatus", "request_timeout_secs", "5", _SECONDS,
       "Longest time one status request to a platform API may take, in seconds."),
    # [synthetic]
    _s("synthetic", "rate_per_sec", "0", _Float(inclusive=True, unit="messages per second"),
       "Chat messages per second the synthetic source makes; 0 = the source is off."),
    _s("synthetic", "accounts", "1", _IdList(),
       "Account ids the synthetic messages are spread over, comma-separated."),
    _s("synthetic", "event_every", "10", _Int(1),
       "One synthetic event for every this many chat messages."),
    _s("synthetic", "run_id", "",
       _Text(re.compile(r"[A-Za-z0-9_.-]{1,64}"), "up to 64 letters, digits, _ . or -",
             optional=True),
       "Name of the run in the synthetic ids (syn-RUN-SEQ). Empty = a random one per start."),
    # [account.N]
    _s(ACCOUNT_SECTION, "twitch_user_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Twitch user id", optional=True),
       "The account's Twitch broadcaster user id (digits).",
       example="123456"),
    _s(ACCOUNT_SECTION, "twitch_token_file", "", _ReadableFile(),
       "JSON file with the account's Twitch access_token and refresh_token; the "
       "daemon rewrites it on refresh. An absolute path, or a bare name looked up "
       "in $CREDENTIALS_DIRECTORY.",
       example="/var/lib/lumio-ingestd/twitch-token-1.json", commented=True),
    _s(ACCOUNT_SECTION, "bluesky_did", "",
       _Text(re.compile(r"did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]"), "a DID like did:plc:...",
             optional=True),
       "The account's Bluesky DID (did:plc:... or did:web:...).",
       example="did:plc:abcdefghijklmnopqrstuvwx"),
    _s(ACCOUNT_SECTION, "kick_broadcaster_user_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Kick user id", optional=True),
       "The account's Kick user id (broadcaster.user_id in Kick's webhooks).",
       example="4377088", commented=True),
    _s(ACCOUNT_SECTION, "kick_chatroom_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Kick chatroom id", optional=True),
       "The account's Kick chatroom id: the Pusher channel chatrooms.ID.v2 (chat, subs, gifts).",
       example="4309481", commented=True),
    _s(ACCOUNT_SECTION, "kick_channel_id", "",
       _Text(re.compile(r"[0-9]{1,20}"), "a numeric Kick channel id", optional=True),
       "The account's Kick channel id: the Pusher channel channel.ID (live status, hosts); optional.",
       example="4378473", commented=True),
    _s(ACCOUNT_SECTION, "streamelements_channel_id", "",
       _Text(re.compile(r"[A-Za-z0-9_-]{1,64}"), "a StreamElements channel id", optional=True),
       "The account's StreamElements channel id (the Astro room).",
       example="5b2e2007760aeb7729487dab"),
    _s(ACCOUNT_SECTION, "streamelements_token_file", "", _ReadableFile(),
       'File with the account\'s StreamElements token: JSON {"token": ..., "token_type": '
       '"jwt", "oauth2" or "apikey"}, or the bare JWT. An absolute path, or a bare name '
       "looked up in $CREDENTIALS_DIRECTORY.",
       example="/var/lib/lumio-ingestd/streamelements-token-1.json", commented=True),
    _s(ACCOUNT_SECTION, "seventv_user_id", "",
       _Text(re.compile(r"[A-Za-z0-9]{1,64}"), "a 7TV user id", optional=True),
       "The account's 7TV user id. Empty = found from twitch_user_id through the 7TV API.",
       example="01F74BZYAR00069YQS4JB48G14"),
    _s(ACCOUNT_SECTION, "seventv_emote_set_id", "",
       _Text(re.compile(r"[A-Za-z0-9]{1,64}"), "a 7TV emote set id", optional=True),
       "The 7TV emote set to follow. Empty = the user's active emote set, from the 7TV API "
       "(and followed when the user switches it).",
       example="01FE3WJ4PR0009RT43H1DH4XQX"),
)

_BY_SECTION: Final[dict[str, dict[str, Setting]]] = {}
for _setting in SCHEMA:
    _BY_SECTION.setdefault(_setting.section, {})[_setting.key] = _setting
del _setting
_FIXED_SECTIONS: Final = tuple(s for s in _BY_SECTION if s != ACCOUNT_SECTION)
_ACCOUNT_NAME = re.compile(r"account\.([1-9][0-9]{0,18})")


def _default(section: str, key: str) -> Any:
    """The typed default of one key, parsed from SCHEMA's text (so the two cannot differ)."""
    setting = _BY_SECTION[section][key]
    return setting.kind.parse(setting.default, _Context(environ={}))
