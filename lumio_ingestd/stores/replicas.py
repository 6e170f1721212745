"""Writes that count as done only once replicas hold them (`[redis] min_replicas_acked`).

Redis replicates asynchronously: a primary acknowledges a write before any
replica has it, and a primary that dies in that window takes the write with
it (a failover promotes a replica that never saw it). With
`min_replicas_acked` N > 0, `ReplicaAcks.run` sends a group of writes and
then `WAIT N replica_ack_timeout_ms` on the SAME connection, in one
pipeline: WAIT answers how many replicas acknowledged everything that
connection wrote. Fewer than N (or no answer) raises `NotReplicated`, a
`redis.RedisError`, so every caller treats it exactly as a write Redis
refused: the data takes its next tier (the database, the spool) and is never
counted done. The write may still be in Redis then, and reach the database
twice; the idempotent inserts keep it one row.

On a Redis Cluster the group goes to the primary of its slot as the client's
slot table names it, through that node's own client, so the WAIT is answered
by the node that took the writes. A redirection (MOVED: the slot moved) or a
dead node fails the group, which takes its next tier, and makes the cluster
client read the slot table again; no command is re-sent elsewhere, where the
WAIT would not cover it. Under Sentinel the client's connection pool only
hands out connections to the current primary.

With N = 0 `run` is one ordinary pipeline on the client (a Cluster client
routes and redirects it as usual), no WAIT. Nothing durable here beyond what
the caller's writes make durable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis

from lumio_ingestd.config import RedisConfig
from lumio_ingestd.metrics import Metrics

log = logging.getLogger("lumio_ingestd.replicas")

Queue = Callable[[Any], None]


class NotReplicated(redis.RedisError):
    """WAIT did not confirm a write on enough replicas in time (a refused write)."""


class ReplicaAcks:
    def __init__(self, client: redis.Redis, cfg: RedisConfig, metrics: Metrics | None = None,
                 ) -> None:
        self._client = client
        self.replicas = cfg.min_replicas_acked
        self.timeout_ms = cfg.replica_ack_timeout_ms
        self._metrics = metrics
        self._cluster = not isinstance(client, redis.Redis)

    @property
    def enabled(self) -> bool:
        return self.replicas > 0

    def groups(self, keys: Sequence[str]) -> list[list[str]]:
        """`keys` cut into the groups one `run` each takes: one per node on a Cluster with
        WAIT on, else all of them together (order kept within a group)."""
        if not keys:
            return []
        if not (self.enabled and self._cluster):
            return [list(keys)]
        by_node: dict[str, list[str]] = {}
        for key in keys:
            try:
                name = self._client.get_node_from_key(key).name  # type: ignore[attr-defined]
            except (redis.RedisError, AttributeError):
                name = ""  # no slot owner known: its run fails and refreshes the table
            by_node.setdefault(name, []).append(key)
        return list(by_node.values())

    def run(self, key: str, queue: Queue, *, write: str, raise_on_error: bool = True) -> list[Any]:
        """Queue commands (`queue(pipe)`) on a pipeline for the node of `key`'s slot, send
        them, and with WAIT on, confirm them on `replicas` replicas.

        Returns the commands' replies (exceptions in place when not `raise_on_error`).
        Raises NotReplicated when WAIT did not confirm (whatever the replies), and
        REDIS_ERRORS when the round trip failed.
        """
        if not self.enabled:
            pipe = self._client.pipeline(transaction=False)
            queue(pipe)
            return list(pipe.execute(raise_on_error=raise_on_error))
        node = self._node_client(key)
        pipe = node.pipeline(transaction=False)
        queue(pipe)
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)  # type: ignore[no-untyped-call]
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._refresh()
            self._count(write)
            raise
        acked = replies.pop()
        if any(isinstance(r, (redis.exceptions.MovedError, redis.exceptions.AskError,
                              redis.exceptions.ClusterDownError, redis.exceptions.ReadOnlyError))
               for r in [*replies, acked]):
            self._refresh()
        if isinstance(acked, Exception) or int(acked) < self.replicas:
            self._count(write)
            got = f"WAIT failed: {acked}" if isinstance(acked, Exception) else (
                f"{int(acked)} of {self.replicas} replica(s) acknowledged it within "
                f"{self.timeout_ms} ms")
            raise NotReplicated(f"a write not confirmed by the replicas ({got})")
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _node_client(self, key: str) -> redis.Redis:
        if not self._cluster:
            return self._client
        cluster: Any = self._client
        try:
            node = cluster.get_node_from_key(key)
        except redis.RedisError:
            self._refresh()
            raise
        return cluster.get_redis_connection(node)  # type: ignore[no-any-return]

    def _refresh(self) -> None:
        """A Cluster's slot table is read again (a failover or a moved slot)."""
        if not self._cluster:
            return
        try:
            self._client.nodes_manager.initialize()  # type: ignore[attr-defined]
        except redis.RedisError as exc:
            log.debug("cannot read the cluster's slot table yet: %s", exc)

    def _count(self, write: str) -> None:
        if self._metrics is not None:
            self._metrics.redis_replica_ack_failures.labels(write).inc()


def replica_acks(client: redis.Redis, cfg: RedisConfig, metrics: Metrics | None = None,
                 ) -> ReplicaAcks | None:
    """A `ReplicaAcks` when `min_replicas_acked` is on, else None (writes as before)."""
    return ReplicaAcks(client, cfg, metrics) if cfg.min_replicas_acked > 0 else None


def eval_script(pipe: Any, script: str, keys: Sequence[str], args: Sequence[object]) -> None:
    """Queue an EVAL on a pipeline, standalone or cluster (`execute_command` routes it
    by its keys; the server caches a script by its text)."""
    pipe.execute_command("EVAL", script, len(keys), *keys, *args)
