"""Building the Redis client and checking the server's durability settings.

The client has short socket timeouts and no automatic retries: a refused or
slow Redis must surface at once so the caller can take the next tier (direct
insert, spool) instead of waiting inside redis-py's retry loop. Its
connections write a packed command or pipeline in one `sendall`
(`OneWriteConnection`). Nothing durable here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.connection import (
    AbstractConnection,
    Connection,
    PythonRespSerializer,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection
from redis.utils import HIREDIS_AVAILABLE

from lumio_ingestd.config import RedisConfig
from lumio_ingestd.metrics import Metrics

log = logging.getLogger("lumio_ingestd.redisclient")

# What a Redis failure looks like to the tiers above: down, timed out, OOM
# (maxmemory), READONLY (a replica), MISCONF (cannot persist), busy scripts.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, OSError)


class RespPacker:
    """redis-py's `PythonRespSerializer.pack`, byte for byte, in one piece and cheaper.

    redis-py's packer grows a buffer by re-joining it for each argument (up to
    its 6 KB cutoff) and runs each through a chain of type checks: for a
    source's hand-over (one RPUSH of 200 entries) that was most of the ~7 us
    per message its pipeline cost. Here each bytes, str, int or float argument
    is formatted once and the command joined once. Anything else (a
    memoryview, a bool, a subclass, whose encoding or refusal redis-py
    decides) sends the whole command to redis-py's packer. The joined output
    is identical; only the cut into pieces differs, and `OneWriteConnection`
    joins the pieces anyway.
    """

    def __init__(self, fallback: PythonRespSerializer, encoding: str, errors: str) -> None:
        self._fallback: Callable[..., list[bytes]] = fallback.pack
        self._encoding = encoding
        self._errors = errors

    def pack(self, *args: Any) -> list[bytes]:
        name = args[0]
        if type(name) is not str:
            return self._fallback(*args)
        # As redis-py: literal arguments in the name ("CONFIG GET") are sent apart.
        head = name.encode().split()
        out = [b"*%d\r\n" % (len(head) + len(args) - 1)]
        for word in head:
            out.append(b"$%d\r\n%s\r\n" % (len(word), word))
        encoding, errors = self._encoding, self._errors
        for arg in args[1:]:
            kind = type(arg)
            if kind is str:
                arg = arg.encode(encoding, errors)
            elif kind is int or kind is float:
                arg = repr(arg).encode()
            elif kind is not bytes:
                return self._fallback(*args)
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
        return [b"".join(out)]


#: The most one `recv` takes from Redis (redis-py reads 64 KiB). A flusher claim
#: of several accounts' full batches is megabytes; every read releases the interpreter
#: lock, and with many busy source threads each one cost the flusher tens of
#: milliseconds to win it back (a claim of 16,000 entries took 1.3 s).
READ_SIZE = 1 << 20


class OneWriteConnection(AbstractConnection):
    """Mixed into redis-py's connection classes: a packed command goes out in one write.

    redis-py cuts a command into ~6 KB pieces and calls `sendall` for each: a
    source's hand-over (one RPUSH of up to 200 entries) was about 19 writes,
    each waking the server for a part of the command. Joined, the same RPUSH
    took 2.8-3.5 us per entry of wall time instead of 5.7-9.6 (on loopback,
    2-core machine), time the source's thread spent not reading its socket.
    """

    def _construct_command_packer(self, packer: Any) -> Any:
        if packer is not None or HIREDIS_AVAILABLE:  # hiredis packs in C already
            return super()._construct_command_packer(packer)  # type: ignore[no-untyped-call]
        encoder = self.encoder
        return RespPacker(PythonRespSerializer(self._buffer_cutoff, encoder.encode),
                          encoder.encoding, encoder.encoding_errors)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if isinstance(command, list) and len(command) > 1:
            command = [b"".join(command)]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class _OneWriteTcp(OneWriteConnection, Connection):
    pass


class _OneWriteTls(OneWriteConnection, SSLConnection):
    pass


class _OneWriteUnix(OneWriteConnection, UnixDomainSocketConnection):
    pass


class _OneWriteSentinel(OneWriteConnection, SentinelManagedConnection):
    pass


class _OneWriteSentinelTls(OneWriteConnection, SentinelManagedSSLConnection):
    pass


def _connection_class(url: str) -> type[AbstractConnection]:
    """The one-write variant of the class redis-py picks for `url`'s scheme."""
    chosen = parse_url(url).get("connection_class", Connection)  # type: ignore[no-untyped-call]
    if chosen is SSLConnection:
        return _OneWriteTls
    return _OneWriteUnix if chosen is UnixDomainSocketConnection else _OneWriteTcp


def connect(cfg: RedisConfig) -> redis.Redis:
    """The client of `[redis]`: one server, the primary the Sentinels name (`sentinels`),
    or with `cluster = true` a Redis Cluster client.

    Under Sentinel each new connection asks the Sentinels where the primary is;
    a connection to a primary that died fails (the write takes its next tier)
    and the next one goes to the replica the Sentinels promoted. A connection
    to a former primary that came back as a replica answers READONLY, which
    redis-py turns into a failed connection too.

    The cluster client is typed as redis.Redis for the callers: it answers the
    same commands (scripts, pipelines without MULTI across slots, SCAN over
    every primary), and every multi-key call here stays in one `{ACCOUNT}` slot.
    """
    if cfg.cluster:
        from redis.cluster import RedisCluster

        cluster = RedisCluster.from_url(
            cfg.url,
            # (A rediss:// URL overrides this with plain SSLConnection: correct, one write less.)
            connection_class=_connection_class(cfg.url),
            password=cfg.password.reveal() if cfg.password is not None else None,
            socket_timeout=cfg.socket_timeout_secs,
            socket_connect_timeout=cfg.connect_timeout_secs,
            socket_keepalive=True,
            socket_read_size=READ_SIZE,
            decode_responses=False,
            # A failed node is dropped from the slot table and the table is
            # re-read on the next call; a failover costs the calls in between.
            retry=Retry(NoBackoff(), 0),
        )
        return cast(redis.Redis, cluster)
    if cfg.sentinels:
        return _sentinel_client(cfg)
    connection_class = _connection_class(cfg.url)
    # TCP only: redis-py's Unix-socket connection refuses keepalive options (TypeError).
    tcp: dict[str, Any] = {} if connection_class is _OneWriteUnix else {"socket_keepalive": True}
    return redis.Redis.from_url(
        cfg.url,
        connection_class=connection_class,
        password=cfg.password.reveal() if cfg.password is not None else None,
        socket_timeout=cfg.socket_timeout_secs,
        socket_connect_timeout=cfg.connect_timeout_secs,
        **tcp,
        socket_read_size=READ_SIZE,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        decode_responses=False,
    )


def _sentinel_client(cfg: RedisConfig) -> redis.Redis:
    # The URL gives the database, the user and TLS; its host and port are the Sentinels' to say.
    options: dict[str, Any] = {
        key: value for key, value in parse_url(cfg.url).items()  # type: ignore[no-untyped-call]
        if key not in ("host", "port", "connection_class", "path")}
    tls = cfg.url.startswith("rediss://")
    timeouts = {"socket_timeout": cfg.socket_timeout_secs,
                "socket_connect_timeout": cfg.connect_timeout_secs}
    sentinel = Sentinel(list(cfg.sentinels),
                        sentinel_kwargs={**timeouts, "retry": Retry(NoBackoff(), 0)})
    if cfg.password is not None:
        options["password"] = cfg.password.reveal()
    client: redis.Redis = sentinel.master_for(
        cfg.sentinel_service,
        connection_class=_OneWriteSentinelTls if tls else _OneWriteSentinel,
        socket_keepalive=True,
        socket_read_size=READ_SIZE,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        decode_responses=False,
        socket_timeout=cfg.socket_timeout_secs,
        socket_connect_timeout=cfg.connect_timeout_secs,
        **options)
    return client


def describe_primary(cfg: RedisConfig, client: redis.Redis) -> str:
    """Where writes go now, for `status`: the primary the Sentinels name, the Cluster's
    primaries, or the one server. Raises REDIS_ERRORS (no Sentinel answered)."""
    if cfg.sentinels:
        host, port = client.connection_pool.get_master_address()  # type: ignore[attr-defined]
        return f"{_address(str(host), int(port))} (from Sentinel, service {cfg.sentinel_service!r})"
    if cfg.cluster:
        nodes = client.get_primaries()  # type: ignore[attr-defined]
        return ", ".join(sorted(_address(n.host, int(n.port)) for n in nodes)) + " (Cluster primaries)"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return _address(str(kwargs.get("host", "")), int(kwargs.get("port", 6379)))


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_durability(client: redis.Redis, metrics: Metrics) -> list[str]:
    """Warn (and export) when Redis may evict or forget our keys. Never raises."""
    warnings: list[str] = []
    try:
        policy = _config_get(client, "maxmemory-policy")
        aof = _config_get(client, "appendonly")
    except REDIS_ERRORS as exc:
        log.warning("cannot read the Redis configuration (%s); eviction policy unknown", exc)
        metrics.redis_noeviction.set(0)
        return [f"redis configuration unreadable: {exc}"]
    metrics.redis_noeviction.set(1 if policy == "noeviction" else 0)
    metrics.redis_aof_enabled.set(1 if aof == "yes" else 0)
    if policy != "noeviction":
        warnings.append(
            f"Redis maxmemory-policy is {policy!r}, not 'noeviction': under memory pressure "
            "Redis may evict buffered chat and parked events (dead-letter keys, which carry a "
            "TTL, go first under volatile-* policies). Set maxmemory-policy noeviction.")
    if aof != "yes":
        warnings.append(
            "Redis runs without AOF (appendonly no): what it holds is lost if it restarts. "
            "Set appendonly yes and appendfsync everysec.")
    for text in warnings:
        log.warning("%s", text)
    return warnings


def _config_get(client: redis.Redis, name: str) -> str:
    reply: Any = client.config_get(name)
    value = reply.get(name, reply.get(name.encode(), ""))
    return value.decode() if isinstance(value, bytes) else str(value)
