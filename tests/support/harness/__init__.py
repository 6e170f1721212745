"""Test harness for lumio-ingestd: real PostgreSQL/Redis servers and a TCP fault proxy.

Import as ``from harness import ...`` (tests/conftest.py puts tests/ on sys.path).
"""

from .cluster import RedisClusterServers
from .proxy import FaultProxy, FaultProxyFactory
from .servers import (
    HarnessError,
    PostgresServer,
    RedisServer,
    cleanup_all,
    find_pg_bindir,
    find_redis_server,
    free_port,
    harness_root,
    install_signal_cleanup,
    timescaledb_installed,
    wait_until,
)

__all__ = [
    "FaultProxy",
    "FaultProxyFactory",
    "HarnessError",
    "PostgresServer",
    "RedisClusterServers",
    "RedisServer",
    "cleanup_all",
    "find_pg_bindir",
    "find_redis_server",
    "free_port",
    "harness_root",
    "install_signal_cleanup",
    "timescaledb_installed",
    "wait_until",
]
