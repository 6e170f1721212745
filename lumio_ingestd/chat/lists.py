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
  optionally setting the target's TTL. With `[redis] min_replicas_acked` on
  it returns only once WAIT says the replicas hold the move
  (stores/replicas.py), else raises like a refused write.

Claims and `finish` need no WAIT: a replica holds a prefix of what its
primary did, so a claim or a delete the promoted replica never got leaves
the entries where they were before it (a buffer, an in-flight list), from
where they are stored again, and the idempotent insert makes the repeat a
no-op.

An in-flight list is `lumio:chat:inflight:{ACCOUNT}:OWNER`. The first flush
thread's OWNER is the instance id, flush thread N's (N >= 1, `[chat]
flush_workers`) the instance id plus `.fN`, the dead-letter drain's the
instance id plus `.dl`: no two of them ever resume each other's batches. An
instance is alive while its heartbeat key `lumio:instance:INSTANCE` exists
(the flusher and the drain refresh it); in-flight lists of a dead owner are
recovered by the flusher.

Claim tokens. Two processes started with the same instance id (an operator
copying an explicit `instance_id`) share every in-flight key: without more,
one could resume the other's batch and then delete the list after the other
had claimed a new batch into it (lost). So every process has its own claim
token: `claim` records it for the list in `lumio:chat:claims:{ACCOUNT}`
(owner -> token), and `finish` and `move_all` delete or move a list only
while the token is still theirs. A list held under another token is resumed
(adopted) only when this process holds the instance's claim
`lumio:claim:INSTANCE` (`InstanceClaim`): then the other token is a dead
incarnation's (a restart). A live second process cannot take that claim, so
it never touches the first one's lists, and `app.build` refuses to start it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from lumio_ingestd.cluster.instances import PROCESS_TOKEN, InstanceClaim
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.replicas import ReplicaAcks

log = logging.getLogger("lumio_ingestd.chat.lists")

DRAIN_SUFFIX = ".dl"
# A flush thread's owner suffix (`lane_owner`); config.py refuses instance ids that end so.
_LANE = re.compile(r"\.f([1-9][0-9]?)$")


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

# KEYS: source, inflight, claims. ARGV: max entries, owner, token, adopt ("1": this
# process holds the instance claim, another token on the list is a dead one's).
# Returns {resumed (0/1, or 2: held under another live process's token), entries}.
_CLAIM = _LUA_PUSH + """
local held = redis.call('LRANGE', KEYS[2], 0, -1)
if #held > 0 then
    local holder = redis.call('HGET', KEYS[3], ARGV[2])
    if holder and holder ~= ARGV[3] and ARGV[4] ~= '1' then
        return {2, {}}
    end
    redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
    return {1, held}
end
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items > 0 then
    push(KEYS[2], items, 1)
    redis.call('LTRIM', KEYS[1], #items, -1)
    redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
end
return {0, items}
"""

# KEYS: inflight, quarantine, claims. ARGV: owner, token, quarantine entries...
# Returns the number quarantined, or -1 when the list is not ours any more
# (nothing done: another process adopted it and finishes it).
_FINISH = _LUA_PUSH + """
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
    return -1
end
if #ARGV > 2 then
    push(KEYS[2], ARGV, 3)
end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return #ARGV - 2
"""

# KEYS: from, to, claims. ARGV: ttl in ms (0 = leave the TTL alone), mode
# ("always" or "if_none": only when the target has no TTL), owner, token ("" =
# any: the owner is dead). Returns the number moved, -1 when not ours.
_MOVE_ALL = _LUA_PUSH + """
local holder = redis.call('HGET', KEYS[3], ARGV[3])
if ARGV[4] ~= '' and holder and holder ~= ARGV[4] then
    return -1
end
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
redis.call('HDEL', KEYS[3], ARGV[3])
return #items
"""




def _queue_eval(pipe: Any, script: str, keys: Sequence[str], args: Sequence[object]) -> None:
    """Queue an EVAL on a pipeline, standalone or cluster.

    EVAL, not EVALSHA: a cluster pipeline cannot load scripts (and refuses
    `eval()`; `execute_command` routes it by its keys, which share the
    account's hash tag); the server caches a script by its text anyway.
    """
    pipe.execute_command("EVAL", script, len(keys), *keys, *args)


class ClaimLost(Exception):
    """An in-flight list is held under another process's claim token (same instance id)."""


@dataclass
class ChatKeys:
    """The chat lists found by one SCAN."""

    buffers: set[int] = field(default_factory=set)
    deadletters: set[int] = field(default_factory=set)
    # (account, owner, key)
    inflight: list[tuple[int, str, str]] = field(default_factory=list)


def lane_owner(instance: str, lane: int) -> str:
    """The in-flight owner id of flush thread `lane` (0: the instance id itself)."""
    return instance if lane == 0 else f"{instance}.f{lane}"


def owner_instance(owner: str) -> str:
    """The instance whose heartbeat covers an in-flight owner id."""
    if owner.endswith(DRAIN_SUFFIX):
        return owner[: -len(DRAIN_SUFFIX)]
    lane = _LANE.search(owner)
    return owner[: lane.start()] if lane is not None else owner


def owner_lane(owner: str) -> int | None:
    """The flush thread an owner id names (0 for a bare instance id); None for the drain's."""
    if owner.endswith(DRAIN_SUFFIX):
        return None
    lane = _LANE.search(owner)
    return int(lane.group(1)) if lane is not None else 0


class ChatLists:
    def __init__(self, client: redis.Redis, token: str = PROCESS_TOKEN,
                 instance_claim: InstanceClaim | None = None, *,
                 acks: ReplicaAcks | None = None) -> None:
        self.client = client
        #: `min_replicas_acked`: a `move_all` counts as done only once the replicas hold it.
        self._acks = acks
        self.token = token
        #: Held by this process: lists under a dead incarnation's token are adopted.
        self.instance_claim = instance_claim
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
        """(entries now in `inflight`, whether they were already there).

        Nothing (and an error logged) when the list is held under the token of
        another live process with the same instance id.
        """
        return self.claim_many([(source, inflight)], limit)[0]

    def claim_many(self, pairs: Sequence[tuple[str, str]], limit: int,
                   ) -> list[tuple[list[bytes], bool]]:
        """`claim` for several (source, in-flight list) pairs in one round trip.

        A pipeline of EVALs (each claim is atomic on its own account's keys):
        the flusher thread then waits on Redis once a round, not once an
        account, and with many source threads each wait is a fight for the
        interpreter lock.
        """
        if not pairs:
            return []
        if self.instance_claim is not None and not self.instance_claim.held:
            return [([], False) for _ in pairs]  # another live process runs as this instance
        adopt = "1" if self.instance_claim is not None and self.instance_claim.held else "0"
        pipe = self.client.pipeline(transaction=False)
        for source, inflight in pairs:
            account, owner = rediskeys.account_of(inflight), rediskeys.instance_of_inflight(inflight)
            _queue_eval(pipe, _CLAIM, (source, inflight, rediskeys.chat_claims(account)),
                        (max(1, limit), owner, self.token, adopt))
        claimed: list[tuple[list[bytes], bool]] = []
        for (_, inflight), reply in zip(pairs, pipe.execute(), strict=True):
            if int(reply[0]) == 2:
                log.error("chat: %s is held by another process running with the same instance "
                          "id %r; left alone (give every replica its own [daemon] instance_id)",
                          inflight, rediskeys.instance_of_inflight(inflight))
                claimed.append(([], False))
                continue
            claimed.append(([bytes(e) for e in reply[1]], bool(reply[0])))
        return claimed

    def finish(self, inflight: str, quarantine: str, entries: Sequence[bytes]) -> None:
        """Quarantine `entries` and delete `inflight`; raises ClaimLost when it is not ours."""
        error = self.finish_many([(inflight, quarantine, entries)])[0]
        if error is not None:
            raise error

    def finish_many(self, batches: Sequence[tuple[str, str, Sequence[bytes]]],
                    ) -> list[Exception | None]:
        """`finish` for several (in-flight list, quarantine, entries) in one round trip.

        Each is atomic on its own; one may fail while the others are done, so
        the result says for each: None (done), ClaimLost, or the Redis error.
        Raises REDIS_ERRORS only when the round trip itself failed (then any
        of them may or may not be done: each is safe to finish again).
        """
        pipe = self.client.pipeline(transaction=False)
        for inflight, quarantine, entries in batches:
            account, owner = rediskeys.account_of(inflight), rediskeys.instance_of_inflight(inflight)
            _queue_eval(pipe, _FINISH, (inflight, quarantine, rediskeys.chat_claims(account)),
                        (owner, self.token, *entries))
        results: list[Exception | None] = []
        for (inflight, _, _), done in zip(batches, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(done, Exception):
                results.append(done)
            elif int(done) < 0:
                results.append(ClaimLost(f"{inflight} was adopted by another process with the "
                                         f"same instance id"))
            else:
                results.append(None)
        return results

    def move_all(self, source: str, target: str, *, ttl_secs: float = 0.0,
                 only_if_no_ttl: bool = False, any_owner: bool = False) -> int:
        """Move all of `source` (an in-flight list) onto `target`; 0 when it is not ours
        (unless `any_owner`: its owner is dead)."""
        account, owner = rediskeys.account_of(source), rediskeys.instance_of_inflight(source)
        keys = [source, target, rediskeys.chat_claims(account)]
        args = [int(ttl_secs * 1000), "if_none" if only_if_no_ttl else "always", owner,
                "" if any_owner else self.token]
        moved: Any
        if self._acks is None:
            moved = self._move_all(keys=keys, args=args)
        else:
            moved = self._acks.run(source, lambda pipe: _queue_eval(pipe, _MOVE_ALL, keys, args),
                                   write="chat_move")[0]
        if int(moved) < 0:
            log.error("chat: %s is held by another process with the same instance id; not moved",
                      source)
            return 0
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






