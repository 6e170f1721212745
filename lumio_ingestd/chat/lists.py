"""The Redis side of chat durability: claims, moves and heartbeats, each atomic.

Every move of entries between lists is one Lua script over keys that share
the account's `{ACCOUNT}` hash tag, so it is atomic (and legal on Redis
Cluster): an entry is always in exactly one of buffer, in-flight,
dead-letter or quarantine, whatever line a process is killed at.

- `claim`: resume the caller's own in-flight list if it holds anything (a
  previous try that did not finish), else move up to N entries from the head
  of a source list (a buffer or a dead-letter list) to it.
- `finish`: after the database committed the batch, push its culprits to the
  quarantine and delete the in-flight list, in one step.
- `move_all`: move a whole list onto another (dead-lettering a batch,
  putting a drain batch back, recovering a dead instance's in-flight list),
  optionally setting the target's TTL.

An in-flight list is `lumio:chat:inflight:{ACCOUNT}:OWNER`. The flusher's
OWNER is the instance id; the dead-letter drain's is the instance id plus
`.dl`, so the two never resume each other's batches. An instance is alive
while its heartbeat key `lumio:instance:INSTANCE` exists (both workers
refresh it); in-flight lists of a dead owner are recovered by the flusher.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from .. import rediskeys
from ..instances import heartbeat_value
from ..metrics import Metrics

DRAIN_SUFFIX = ".dl"

_BUFFER_PREFIX = "lumio:chat:buffer:{"
_DEADLETTER_PREFIX = "lumio:chat:deadletter:{"
_INFLIGHT_PREFIX = "lumio:chat:inflight:{"

# Lua's unpack() is limited by the C stack (about 8000 values): push in chunks.
_LUA_PUSH = """
local function push(key, items, first)
    local n = #items
    for i = first, n, 1000 do
        redis.call('RPUSH', key, unpack(items, i, math.min(i + 999, n)))
    end
end
"""

# KEYS: source, inflight. ARGV: max entries. Returns {resumed (0/1), entries}.
_CLAIM = _LUA_PUSH + """
local held = redis.call('LRANGE', KEYS[2], 0, -1)
if #held > 0 then
    return {1, held}
end
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items > 0 then
    push(KEYS[2], items, 1)
    redis.call('LTRIM', KEYS[1], #items, -1)
end
return {0, items}
"""

# KEYS: inflight, quarantine. ARGV: quarantine entries. Returns the number quarantined.
_FINISH = _LUA_PUSH + """
if #ARGV > 0 then
    push(KEYS[2], ARGV, 1)
end
redis.call('DEL', KEYS[1])
return #ARGV
"""

# KEYS: from, to. ARGV: ttl in ms (0 = leave the TTL alone), mode ("always" or
# "if_none": only when the target has no TTL). Returns the number moved.
_MOVE_ALL = _LUA_PUSH + """
local items = redis.call('LRANGE', KEYS[1], 0, -1)
if #items == 0 then
    return 0
end
push(KEYS[2], items, 1)
local ttl = tonumber(ARGV[1])
if ttl > 0 and (ARGV[2] == 'always' or redis.call('PTTL', KEYS[2]) < 0) then
    redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('DEL', KEYS[1])
return #items
"""


@dataclass
class ChatKeys:
    """The chat lists found by one SCAN."""

    buffers: set[int] = field(default_factory=set)
    deadletters: set[int] = field(default_factory=set)
    # (account, owner, key)
    inflight: list[tuple[int, str, str]] = field(default_factory=list)


def owner_instance(owner: str) -> str:
    """The instance whose heartbeat covers an in-flight owner id."""
    return owner[: -len(DRAIN_SUFFIX)] if owner.endswith(DRAIN_SUFFIX) else owner


class ChatLists:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._claim = client.register_script(_CLAIM)
        self._finish = client.register_script(_FINISH)
        self._move_all = client.register_script(_MOVE_ALL)

    def scan(self, count: int = 1000) -> ChatKeys:
        found = ChatKeys()
        for raw in self.client.scan_iter(match="lumio:chat:*", count=count):
            key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            try:
                if key.startswith(_BUFFER_PREFIX):
                    found.buffers.add(rediskeys.account_of(key))
                elif key.startswith(_DEADLETTER_PREFIX):
                    found.deadletters.add(rediskeys.account_of(key))
                elif key.startswith(_INFLIGHT_PREFIX):
                    found.inflight.append(
                        (rediskeys.account_of(key), rediskeys.instance_of_inflight(key), key))
            except ValueError:  # a key of ours with a malformed account id: not for us to touch
                continue
        return found

    def claim(self, source: str, inflight: str, limit: int) -> tuple[list[bytes], bool]:
        """(entries now in `inflight`, whether they were already there)."""
        reply: Any = self._claim(keys=[source, inflight], args=[max(1, limit)])
        return [bytes(e) for e in reply[1]], bool(reply[0])

    def finish(self, inflight: str, quarantine: str, entries: Sequence[bytes]) -> None:
        self._finish(keys=[inflight, quarantine], args=list(entries))

    def move_all(self, source: str, target: str, *, ttl_secs: float = 0.0,
                 only_if_no_ttl: bool = False) -> int:
        moved: Any = self._move_all(
            keys=[source, target],
            args=[int(ttl_secs * 1000), "if_none" if only_if_no_ttl else "always"])
        return int(moved)

    def lengths(self, keys: Iterable[str]) -> int:
        keys = list(keys)
        if not keys:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        return sum(int(n) for n in pipe.execute())

    def alive(self, instances: Iterable[str]) -> dict[str, bool]:
        names = sorted(set(instances))
        if not names:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.exists(rediskeys.instance_heartbeat(name))
        return {name: bool(n) for name, n in zip(names, pipe.execute(), strict=True)}


class Heartbeat:
    """This instance's liveness key, refreshed at most every third of its TTL."""

    def __init__(self, client: redis.Redis, instance: str, ttl_secs: float,
                 metrics: Metrics | None = None) -> None:
        self.key = rediskeys.instance_heartbeat(instance)
        self.ttl_secs = ttl_secs
        self._client = client
        self._metrics = metrics
        self._refreshed = float("-inf")

    def beat(self, force: bool = False) -> None:
        """SET with the TTL; raises REDIS_ERRORS."""
        now = time.monotonic()
        if force or now - self._refreshed >= self.ttl_secs / 3:
            self._client.set(self.key, heartbeat_value(), px=max(1, int(self.ttl_secs * 1000)))
            self._refreshed = now
            if self._metrics is not None:
                self._metrics.instance_heartbeat.set(time.time())

    def stop(self) -> None:
        """Delete the key: what this instance left in flight is recovered at once."""
        self._client.delete(self.key)
        self._refreshed = float("-inf")
