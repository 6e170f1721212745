"""The tests' names for the private servers, which live in `lumio_ingestd.devkit.servers`.

The launcher moved into the package so that `lumio-ingestd demo`, the
benchmarks and the tests share one copy; the tests keep importing it from
here (`from harness.servers import PostgresServer, wait_until`).
"""

from __future__ import annotations

from lumio_ingestd.devkit.servers import (
    DevServerError,
    PostgresServer,
    RedisServer,
    cleanup_all,
    find_pg_bindir,
    find_redis_server,
    free_port,
    install_signal_cleanup,
    scratch_root,
    timescaledb_installed,
    wait_until,
)

#: The harness's older names for the same things.
HarnessError = DevServerError
harness_root = scratch_root

__all__ = [
    "HarnessError",
    "PostgresServer",
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
