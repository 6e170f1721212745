"""A private Redis Sentinel setup on loopback: one primary, two replicas, three Sentinels.

Five `redis-server` processes (each a `RedisServer` of servers.py, so the
harness's cleanup covers them): the primary, two `--replicaof` it, and three
`redis-server SENTINEL.CONF --sentinel` monitoring it as `mymaster` with a
quorum of 2. `down-after-milliseconds` is short, so a killed primary is
replaced within a few seconds (`kill_primary`). `start()` returns once both
replicas finished their first sync and every Sentinel knows them and the
other Sentinels: a replica promoted before its sync would hold nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis

from .servers import HarnessError, RedisServer, free_port, wait_until

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000

_REPLICA_ARGS = ("--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1")


class _SentinelServer(RedisServer):
    """`redis-server CONF --sentinel`: Sentinel mode needs a config file it may rewrite."""

    def __init__(self, workdir: Path, primary_port: int) -> None:
        super().__init__(workdir)
        self.conf = self.workdir / "sentinel.conf"
        self.conf.write_text(
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 2\n")

    def _command(self) -> list[str]:
        command = super()._command()
        return [command[0], str(self.conf), "--sentinel", *command[1:]]


class RedisSentinelServers:
    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.primary_port = free_port()
        self.nodes = [RedisServer(self.workdir / "node-0", port=self.primary_port,
                                  extra_args=_REPLICA_ARGS)]
        self.nodes += [RedisServer(self.workdir / f"node-{i}", extra_args=(
            *_REPLICA_ARGS, "--replicaof", "127.0.0.1", str(self.primary_port))) for i in (1, 2)]
        self.sentinels = [_SentinelServer(self.workdir / f"sentinel-{i}", self.primary_port)
                          for i in range(3)]

    @property
    def addresses(self) -> str:
        """The `[redis] sentinels` value."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def start(self) -> Self:
        for server in [*self.nodes, *self.sentinels]:
            server.start()
        if not wait_until(self._ready, 30):
            raise HarnessError("the Sentinel setup did not settle (replicas synced, "
                               "Sentinels aware of each other)")
        return self

    def _sentinel_view(self, sentinel: RedisServer) -> dict[str, object] | None:
        client = sentinel.client()
        try:
            masters: Any = client.sentinel_masters()
        except redis.RedisError:
            return None
        finally:
            client.close()
        state = masters.get(SERVICE)
        return state if isinstance(state, dict) else None

    def _ready(self) -> bool:
        if not self.synced():
            return False
        for sentinel in self.sentinels:
            view = self._sentinel_view(sentinel)
            if (view is None or int(str(view.get("num-slaves", 0))) < 2
                    or int(str(view.get("num-other-sentinels", 0))) < 2):
                return False
        return True

    def primary(self) -> RedisServer:
        """The node the Sentinels name as primary now (the first that answers)."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            view = self._sentinel_view(sentinel)
            if view is None:
                continue
            for node in self.nodes:
                if node.port == int(str(view["port"])):
                    return node
        raise HarnessError("no Sentinel names a primary")

    def replicas(self) -> list[RedisServer]:
        """The running nodes that replicate the current primary."""
        primary = self.primary()
        found = []
        for node in self.nodes:
            if node is primary or not node.running or node.paused:
                continue
            client = node.client()
            try:
                info = client.info("replication")
            finally:
                client.close()
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary.port:
                found.append(node)
        return found

    def synced(self) -> bool:
        """Every running replica's link is up and holds all the primary wrote so far."""
        primary = self.primary()
        client = primary.client()
        try:
            offset = int(client.info("replication").get("master_repl_offset", 0))
        except redis.RedisError:
            return False
        finally:
            client.close()
        for node in self.nodes:
            if node is primary or not node.running:
                continue
            client = node.client()
            try:
                info = client.info("replication")
            except redis.RedisError:
                return False
            finally:
                client.close()
            if (info.get("role") != "slave" or int(info.get("master_port", 0)) != primary.port
                    or info.get("master_link_status") != "up"
                    or int(info.get("slave_repl_offset", -1)) < offset):
                return False
        return True

    def kill_primary(self, *, lag_secs: float = 0.0, timeout: float = 30.0) -> RedisServer:
        """SIGKILL the primary; returns once the Sentinels name a replica in its place.

        `lag_secs` > 0: the replicas are stopped (SIGSTOP) and their links cut
        (CLIENT KILL TYPE replica) that long before the kill, and let go right
        after it, so the one promoted lags the primary by that much.
        """
        victim = self.primary()
        lagging = self.replicas() if lag_secs > 0 else []
        for replica in lagging:
            replica.pause()
        if lagging:
            # A stopped replica alone lags nothing on loopback: the stream waits in its
            # socket buffer and is read on SIGCONT. Cutting the link too makes the
            # primary keep what follows in its backlog, which dies with it.
            _cut_replica_links(victim)
            time.sleep(lag_secs)  # the lag itself: writes the replicas do not get
        victim.kill()
        for replica in lagging:
            replica.resume()

        def promoted() -> bool:
            try:
                node = self.primary()
            except HarnessError:
                return False
            if node is victim or not node.running:
                return False
            client = node.client()
            try:
                return client.info("replication").get("role") == "master"
            except redis.RedisError:
                return False
            finally:
                client.close()

        if not wait_until(promoted, timeout):
            raise HarnessError(f"no replica took over from 127.0.0.1:{victim.port}")
        return victim

    def close(self) -> None:
        for server in [*self.sentinels, *self.nodes]:
            server.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _cut_replica_links(primary: RedisServer) -> None:
    client = primary.client()
    try:
        client.execute_command("CLIENT", "KILL", "TYPE", "replica")  # type: ignore[no-untyped-call]
    finally:
        client.close()
