"""A private Redis Cluster on loopback: three primaries and three replicas.

Six `redis-server --cluster-enabled yes` on free ports (each a `RedisServer`
of servers.py, so the harness's cleanup covers them), joined by
`redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`. A short
`cluster-node-timeout` makes a replica take over within seconds when its
primary is killed (`kill_primary_of(key)`).

`start()` returns only once every replica has finished its first full sync
(`synced()`): `cluster_state:ok` comes seconds before that (the replicas'
diskless sync waits `repl-diskless-sync-delay`), and a replica promoted
before it holds nothing at all, so a kill then loses the whole primary's
data, not a replication lag's worth. A restarted node is a replica that
syncs again: wait on `synced()` before the next kill too.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import redis
from redis.cluster import ClusterNode, RedisCluster

from .servers import HarnessError, RedisServer, find_redis_server, free_port, wait_until

NODE_TIMEOUT_MS = 1000


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (so at most 55535)."""
    for _ in range(200):
        port = free_port()
        if port > 55535:
            continue
        try:
            with socket.create_server(("127.0.0.1", port + 10000)):
                return port
        except OSError:
            continue
    raise HarnessError("no free port pair for a cluster node")


class RedisClusterServers:
    def __init__(self, workdir: Path, *, nodes: int = 6) -> None:
        self.workdir = Path(workdir)
        self.servers = [
            RedisServer(self.workdir / f"node-{i}", port=_cluster_port(), extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.workdir / f"node-{i}" / "nodes.conf"),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--cluster-replica-validity-factor", "0",
                # A restarted node syncs at once instead of after 5 s.
                "--repl-diskless-sync-delay", "0",
                "--appendonly", "yes", "--appendfsync", "everysec"))
            for i in range(nodes)]

    @property
    def url(self) -> str:
        """One node's URL: the cluster client finds the others from it."""
        return self.servers[0].url

    def start(self) -> Self:
        for server in self.servers:
            server.start()
        cli = str(Path(find_redis_server()).with_name("redis-cli"))
        result = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in self.servers),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0:
            raise HarnessError(f"redis-cli --cluster create failed: {result.stdout}\n{result.stderr}")
        if not wait_until(self._ok, 30):
            raise HarnessError("the cluster did not reach cluster_state:ok")
        self.wait_synced()
        return self

    def wait_synced(self, timeout: float = 30.0) -> None:
        if not wait_until(self.synced, timeout):
            raise HarnessError("the cluster's replicas did not finish their sync")

    def synced(self) -> bool:
        """Every running replica's link is up and it holds all its primary wrote so far."""
        offsets: dict[int, int] = {}
        replicas: list[tuple[int, int]] = []
        for server in self.servers:
            if not server.running:
                continue
            client = server.client()
            try:
                info = client.info("replication")
            except redis.RedisError:
                return False
            finally:
                client.close()
            if info.get("role") == "master":
                offsets[server.port] = int(info.get("master_repl_offset", 0))
            elif info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
                return False
            else:
                replicas.append((int(info["master_port"]), int(info.get("slave_repl_offset", -1))))
        return all(offset >= offsets.get(primary, 0) for primary, offset in replicas)

    def replicas_of(self, primary: RedisServer) -> list[RedisServer]:
        """The running servers that replicate `primary`."""
        found = []
        for server in self.servers:
            if server is primary or not server.running:
                continue
            client = server.client()
            try:
                info = client.info("replication")
            finally:
                client.close()
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary.port:
                found.append(server)
        return found

    def _ok(self) -> bool:
        """Every running node says cluster_state:ok."""
        for server in self.servers:
            if not server.running:
                continue
            try:
                client = server.client()
                try:
                    info = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
                finally:
                    client.close()
            except redis.RedisError:
                return False
            if isinstance(info, dict):  # redis-py parses the reply
                state = info.get("cluster_state", info.get(b"cluster_state"))
                if state not in ("ok", b"ok"):
                    return False
            elif b"cluster_state:ok" not in (info if isinstance(info, bytes) else str(info).encode()):
                return False
        return True

    def client(self) -> RedisCluster:
        """A client that starts from every running node (the first may be a killed one)."""
        nodes = [ClusterNode(s.host, s.port)  # type: ignore[no-untyped-call]
                 for s in self.servers if s.running and not s.paused]
        return RedisCluster(startup_nodes=nodes, socket_timeout=2.0, socket_connect_timeout=1.0)

    def primary_of(self, key: str) -> RedisServer:
        client = self.client()
        try:
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        finally:
            client.close()
        for server in self.servers:
            if server.port == node.port:
                return server
        raise HarnessError(f"no server on port {node.port}")

    def kill_primary_of(self, key: str, *, timeout: float = 20.0,
                        lag_secs: float = 0.0) -> RedisServer:
        """SIGKILL the primary serving `key`; returns once a replica took its slots over.

        `lag_secs` > 0: its replicas are stopped (SIGSTOP) and their links cut
        (CLIENT KILL TYPE replica) that long before the kill, and let go right
        after it, so the one promoted lags the primary by that much (what a
        network blip or a slow replica does).
        """
        victim = self.primary_of(key)
        lagging = self.replicas_of(victim) if lag_secs > 0 else []
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
        deadline = time.monotonic() + timeout

        def promoted() -> bool:
            try:
                return self.primary_of(key).port != victim.port and self._ok()
            except (redis.RedisError, HarnessError):
                return False

        if not wait_until(promoted, max(0.0, deadline - time.monotonic())):
            raise HarnessError(f"no replica took over from 127.0.0.1:{victim.port}")
        return victim

    def close(self) -> None:
        for server in self.servers:
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
