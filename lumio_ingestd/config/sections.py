"""The parsed configuration: `Config` and one frozen dataclass per section.

Built once by the loader and passed down; nothing reads settings elsewhere.
Nothing durable here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from lumio_ingestd.config.kinds import ACCOUNT_SECTION, Secret, _default_instance_id, _redact
from lumio_ingestd.config.schema import _default

# ---------------------------------------------------------------------------
# The typed configuration. Field defaults come from SCHEMA, so that tests may
# build one with a few fields changed; load() is the way to get a checked one.


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    instance_id: str = field(default_factory=_default_instance_id)
    state_dir: Path = _default("daemon", "state_dir")
    log_level: str = _default("daemon", "log_level")
    shard_index: int = _default("daemon", "shard")[0]
    shard_count: int = _default("daemon", "shard")[1]
    shard_auto: bool = _default("daemon", "shard")[2]
    accounts_dir: Path = _default("daemon", "accounts_dir")
    spool_max_bytes: int = _default("daemon", "spool_max_bytes")
    shutdown_timeout_secs: float = _default("daemon", "shutdown_timeout_secs")
    heal_max_hours: float = _default("daemon", "heal_max_hours")
    seen_interval_secs: float = _default("daemon", "seen_interval_secs")


def _redacting_repr(obj: Any, url_field: str) -> str:
    parts = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        text = repr(_redact(value)) if f.name == url_field else repr(value)
        parts.append(f"{f.name}={text}")
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclass(frozen=True, slots=True)
class RedisConfig:
    url: str = _default("redis", "url")
    password: Secret | None = None
    socket_timeout_secs: float = _default("redis", "socket_timeout_secs")
    connect_timeout_secs: float = _default("redis", "connect_timeout_secs")
    cluster: bool = _default("redis", "cluster")
    sentinels: tuple[tuple[str, int], ...] = _default("redis", "sentinels")
    sentinel_service: str = _default("redis", "sentinel_service")
    min_replicas_acked: int = _default("redis", "min_replicas_acked")
    replica_ack_timeout_ms: int = _default("redis", "replica_ack_timeout_ms")

    def __repr__(self) -> str:
        return _redacting_repr(self, "url")


# How far back a late write can reach: a parked event or a chat dead letter
# is replayed up to 72 h after it was made (chat's dead letters for as long as
# [chat] deadletter_ttl_hours keeps them, when that is longer).
DEADLETTER_HORIZON_HOURS: Final = 72.0
# The chunk intervals migration 0002 gives the hypertables. Compression works
# on whole chunks, so a compression age must clear the horizon by one of the
# longer (events') intervals.
CHUNK_INTERVAL_HOURS: Final[Mapping[str, float]] = {"chat_messages": 24.0, "events": 168.0}


def min_compress_after_hours(chat_deadletter_ttl_hours: float) -> float:
    """The value `compress_after_hours` must exceed (when it is not 0)."""
    return max(DEADLETTER_HORIZON_HOURS, chat_deadletter_ttl_hours) + max(CHUNK_INTERVAL_HOURS.values())


@dataclass(frozen=True, slots=True)
class TimescaleConfig:
    dsn: str = _default("timescale", "dsn")
    password: Secret | None = None
    pool_size: int = _default("timescale", "pool_size")
    statement_timeout_secs: float = _default("timescale", "statement_timeout_secs")
    acquire_timeout_secs: float = _default("timescale", "acquire_timeout_secs")
    connect_timeout_secs: int = _default("timescale", "connect_timeout_secs")
    tcp_user_timeout_secs: float = _default("timescale", "tcp_user_timeout_secs")
    keepalive_idle_secs: int = _default("timescale", "keepalive_idle_secs")
    migration_lock_timeout_secs: float = _default("timescale", "migration_lock_timeout_secs")
    migration_retries: int = _default("timescale", "migration_retries")
    migration_retry_interval_secs: float = _default("timescale", "migration_retry_interval_secs")
    compress_after_hours: float = _default("timescale", "compress_after_hours")

    def __repr__(self) -> str:
        return _redacting_repr(self, "dsn")


@dataclass(frozen=True, slots=True)
class ChatConfig:
    flush_interval_secs: float = _default("chat", "flush_interval_secs")
    flush_batch_size: int = _default("chat", "flush_batch_size")
    flush_workers: int = _default("chat", "flush_workers")
    max_flush_failures: int = _default("chat", "max_flush_failures")
    deadletter_ttl_hours: float = _default("chat", "deadletter_ttl_hours")
    deadletter_drain_interval_secs: float = _default("chat", "deadletter_drain_interval_secs")
    retention_days: int = _default("chat", "retention_days")


@dataclass(frozen=True, slots=True)
class EventsConfig:
    insert_timeout_secs: float = _default("events", "insert_timeout_secs")
    retry_interval_secs: float = _default("events", "retry_interval_secs")
    retention_days: int = _default("events", "retention_days")


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listen_host: str = _default("metrics", "listen")[0]
    listen_port: int = _default("metrics", "listen")[1]


@dataclass(frozen=True, slots=True)
class HttpConfig:
    listen_host: str = _default("http", "listen")[0]
    listen_port: int = _default("http", "listen")[1]
    emit_token: Secret | None = None
    trusted_proxy_header: str | None = None
    max_connections_per_client: int = _default("http", "max_connections_per_client")


@dataclass(frozen=True, slots=True)
class TwitchConfig:
    eventsub_ws_url: str = _default("twitch", "eventsub_ws_url")
    helix_url: str = _default("twitch", "helix_url")
    heal_follows: bool = _default("twitch", "heal_follows")
    oauth_url: str = _default("twitch", "oauth_url")
    client_id: str = _default("twitch", "client_id")
    client_secret: Secret | None = None
    webhook_secret: Secret | None = None
    keepalive_timeout_secs: int = _default("twitch", "keepalive_timeout_secs")


@dataclass(frozen=True, slots=True)
class JetstreamConfig:
    url: str = _default("jetstream", "url")
    collections: tuple[str, ...] = _default("jetstream", "collections")
    rewind_secs: float = _default("jetstream", "rewind_secs")


@dataclass(frozen=True, slots=True)
class KickConfig:
    pusher_url: str = _default("kick", "pusher_url")
    api_url: str = _default("kick", "api_url")
    oauth_url: str = _default("kick", "oauth_url")
    client_id: str = _default("kick", "client_id")
    client_secret: Secret | None = None
    webhook_public_key_file: Path | None = None
    webhook_max_age_secs: float = _default("kick", "webhook_max_age_secs")
    manage_webhooks: bool = _default("kick", "manage_webhooks")


@dataclass(frozen=True, slots=True)
class StreamElementsConfig:
    astro_url: str = _default("streamelements", "astro_url")
    api_url: str = _default("streamelements", "api_url")
    topics: tuple[str, ...] = _default("streamelements", "topics")
    keep_donor_pii: bool = _default("streamelements", "keep_donor_pii")


@dataclass(frozen=True, slots=True)
class SevenTvConfig:
    enabled: bool = _default("seventv", "enabled")
    eventapi_url: str = _default("seventv", "eventapi_url")
    api_url: str = _default("seventv", "api_url")


@dataclass(frozen=True, slots=True)
class StreamStatusConfig:
    interval_secs: float = _default("streamstatus", "interval_secs")
    platforms: tuple[str, ...] = _default("streamstatus", "platforms")
    request_timeout_secs: float = _default("streamstatus", "request_timeout_secs")


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    rate_per_sec: float = _default("synthetic", "rate_per_sec")
    accounts: tuple[int, ...] = _default("synthetic", "accounts")
    event_every: int = _default("synthetic", "event_every")
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class AccountConfig:
    account_id: int
    twitch_user_id: str | None = None
    twitch_token_file: Path | None = None
    bluesky_did: str | None = None
    kick_broadcaster_user_id: str | None = None
    kick_chatroom_id: str | None = None
    kick_channel_id: str | None = None
    streamelements_channel_id: str | None = None
    streamelements_token_file: Path | None = None
    seventv_user_id: str | None = None
    seventv_emote_set_id: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    path: str
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    redis: RedisConfig = field(default_factory=RedisConfig)
    timescale: TimescaleConfig = field(default_factory=TimescaleConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    twitch: TwitchConfig = field(default_factory=TwitchConfig)
    jetstream: JetstreamConfig = field(default_factory=JetstreamConfig)
    kick: KickConfig = field(default_factory=KickConfig)
    streamelements: StreamElementsConfig = field(default_factory=StreamElementsConfig)
    seventv: SevenTvConfig = field(default_factory=SevenTvConfig)
    streamstatus: StreamStatusConfig = field(default_factory=StreamStatusConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    accounts: tuple[AccountConfig, ...] = ()
    #: With `shard = auto`: the accounts this replica holds now (set by the
    #: daemon from its membership, never read from a file); None = by INDEX/COUNT.
    #: With INDEX/COUNT, an empty set while this process does not hold its
    #: instance claim (cluster/instances.py): it runs no account until it does.
    owned: frozenset[int] | None = None

    def owns(self, account_id: int) -> bool:
        """Whether this replica runs the account's sources."""
        if self.owned is not None:
            return account_id in self.owned
        if self.daemon.shard_auto:
            return False  # nothing until the membership hands accounts out
        return account_id % self.daemon.shard_count == self.daemon.shard_index

    @property
    def leads(self) -> bool:
        """Whether this replica builds the one-per-deployment workers (Kick subscriptions).

        Replica 0 with INDEX/COUNT; every replica with `auto`, where a lease
        decides which one runs them (lease.LeaseGated).
        """
        return self.daemon.shard_auto or (self.daemon.shard_index == 0 and self.owned is None)


# Section name -> the dataclass built from it; Config has one attribute per fixed section.
_SECTION_CLASSES: Final[Mapping[str, type[Any]]] = {
    "daemon": DaemonConfig,
    "redis": RedisConfig,
    "timescale": TimescaleConfig,
    "chat": ChatConfig,
    "events": EventsConfig,
    "metrics": MetricsConfig,
    "http": HttpConfig,
    "twitch": TwitchConfig,
    "jetstream": JetstreamConfig,
    "kick": KickConfig,
    "streamelements": StreamElementsConfig,
    "seventv": SevenTvConfig,
    "streamstatus": StreamStatusConfig,
    "synthetic": SyntheticConfig,
    ACCOUNT_SECTION: AccountConfig,
}
