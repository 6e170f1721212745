"""Redis operations on parked events: park, claim, put back, settle, quarantine.

Keys (rediskeys): `lumio:events:deadletter:{A}` (parked events, oldest first),
`lumio:events:inflight:{A}:INSTANCE` (what one replayer has claimed and not
yet settled) and `lumio:events:quarantine:{A}` (what no retry can store). All
of one account's keys share the `{A}` hash tag, so each script below touches
one Redis Cluster slot.

A claim moves entries from the head of the dead-letter list to the claimer's
in-flight list in one script, and an entry leaves the in-flight list only
after the database committed it (or it went to the quarantine in the same
MULTI). A process killed at any line therefore leaves every entry in exactly
one of: the dead-letter list, an in-flight list, the database, the
quarantine. `put_back` moves an in-flight list back to the head of the
dead-letter list in its order; the retry worker uses it for its own remainder
after a transient error and for the in-flight lists of dead instances.

Durable when a function returns: whatever Redis acknowledged (subject to its
own AOF policy; docs/architecture.rst, "What Redis keeps"); with `[redis]
min_replicas_acked` on, `park` and `park_many` return only once WAIT says the
replicas hold the entries too, and raise `NotReplicated` (a Redis error, so
the caller spools) when they do not confirm in time; `put_back` and
`quarantine` likewise count as done only once confirmed. A claim or a settle
the promoted replica never got only leaves entries where they were before
(replication keeps the primary's order), to be replayed as recovered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import cast

import redis

from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.quarantine import quarantine_entry
from lumio_ingestd.stores.replicas import ReplicaAcks, eval_script

# The dead-letter key's TTL, refreshed on every park and every put-back. It
# is only a far safety net for a deployment whose replayers are all gone:
# entries are quarantined by their own created_at (reason "expired") long
# before it fires while any replica runs. 72 h as specified; the [events]
# section has no key for it (chat's deadletter_ttl_hours is chat's).
DEADLETTER_TTL_SECS = 72 * 3600

# KEYS[1] dead-letter list; ARGV[1] TTL in ms, ARGV[2..] entries. Appends them and
# refreshes the TTL in one step (a script rather than MULTI, so that a WAIT can
# follow it on the same connection). Pushed in chunks: unpack() is bounded.
_PARK = """
local n = #ARGV
for i = 2, n, 1000 do
    redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, n)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n - 1
"""

# KEYS[1] dead-letter list, KEYS[2] in-flight list; ARGV[1] how many.
# Returns the claimed entries, oldest first.
_CLAIM = """
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items > 0 then
    redis.call('LTRIM', KEYS[1], #items, -1)
    redis.call('RPUSH', KEYS[2], unpack(items))
end
return items
"""

# KEYS[1] dead-letter list, KEYS[2] in-flight list; ARGV[1] TTL in ms.
# Moves the whole in-flight list to the head of the dead-letter list, in its
# order, and refreshes the TTL (a list emptied by LTRIM lost its key and TTL).
_PUT_BACK = """
local items = redis.call('LRANGE', KEYS[2], 0, -1)
if #items > 0 then
    for i = #items, 1, -1 do
        redis.call('LPUSH', KEYS[1], items[i])
    end
    redis.call('DEL', KEYS[2])
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return #items
"""

# KEYS[1] in-flight list; ARGV[1..n] the SHA-1 of the n entries expected at its
# head, in order. Trims them off when they are exactly those (returns 1), else
# touches nothing (returns 0).
_SETTLE_HEAD = """
local n = #ARGV
local items = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #items ~= n then
    return 0
end
for i = 1, n do
    if redis.sha1hex(items[i]) ~= ARGV[i] then
        return 0
    end
end
redis.call('LTRIM', KEYS[1], n, -1)
return 1
"""

# KEYS[1] quarantine, KEYS[2] in-flight list; ARGV[1] the quarantine entry, ARGV[2] the
# in-flight entry. The MULTI of `quarantine` as one script, so a WAIT can follow it.
_QUARANTINE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[2], 1, ARGV[2])
return 1
"""

# How many entries one claim takes; bounds Lua's unpack() and what a put-back moves.
MAX_CLAIM = 500


class DeadLetters:
    """The dead-letter, in-flight and quarantine lists of every account."""

    def __init__(self, client: redis.Redis, ttl_secs: float = DEADLETTER_TTL_SECS, *,
                 acks: ReplicaAcks | None = None) -> None:
        self._client = client
        #: WAIT after a park (`min_replicas_acked`); None: a park is done once Redis took it.
        self._acks = acks
        self.ttl_ms = max(1, int(ttl_secs * 1000))
        self._claim = client.register_script(_CLAIM)
        self._put_back = client.register_script(_PUT_BACK)
        self._settle_head = client.register_script(_SETTLE_HEAD)

    def park(self, account_id: int, entries: Sequence[bytes]) -> None:
        """Append entries to the account's dead-letter list and refresh its TTL, atomically."""
        key = rediskeys.events_deadletter(account_id)
        if self._acks is None:
            pipe = self._client.pipeline(transaction=True)
            pipe.rpush(key, *entries)
            pipe.pexpire(key, self.ttl_ms)
            pipe.execute()
            return
        self._acks.run(key, lambda pipe: eval_script(pipe, _PARK, [key], [self.ttl_ms, *entries]),
                       write="event")

    def park_many(self, by_account: dict[int, list[bytes]]) -> None:
        """`park` for several accounts: one MULTI per account, so each touches one
        Redis Cluster slot (a MULTI across accounts is CROSSSLOT there).

        Raises at the first account Redis refuses; the accounts before it stay
        parked, and a caller's retry parks them again (the retry worker's insert
        is idempotent: the repeat counts as recovered, never a second row).
        """
        for account_id, entries in by_account.items():
            self.park(account_id, entries)

    def claim(self, account_id: int, instance: str, count: int) -> list[bytes]:
        """Move up to `count` entries from the head of the list into our in-flight list."""
        items = self._claim(
            keys=[rediskeys.events_deadletter(account_id),
                  rediskeys.events_inflight(account_id, instance)],
            args=[max(1, min(count, MAX_CLAIM))])
        return list(items)

    def settle(self, account_id: int, instance: str, raw: bytes) -> None:
        """Drop one entry from our in-flight list: the database has it."""
        # redis-py's annotations say str; bytes go to the server unchanged.
        self._client.lrem(rediskeys.events_inflight(account_id, instance), 1, cast(str, raw))

    def settle_many(self, account_id: int, instance: str, raws: Sequence[bytes]) -> None:
        """`settle` for several entries in one round trip.

        The replay settles entries in the order it claimed them, so they are
        normally the head of the in-flight list: one script compares them (by
        SHA-1) and trims them off. Otherwise a pipeline of LREMs (not a MULTI:
        each stands alone, and one left undone is only replayed as recovered).
        """
        key = rediskeys.events_inflight(account_id, instance)
        digests = [hashlib.sha1(raw).hexdigest() for raw in raws]  # noqa: S324 - an equality check
        if raws and self._settle_head(keys=[key], args=digests) == 1:
            return
        pipe = self._client.pipeline(transaction=False)
        for raw in raws:
            pipe.lrem(key, 1, cast(str, raw))
        pipe.execute()

    def quarantine(self, account_id: int, instance: str, raw: bytes, reason: str,
                   sqlstate: str | None) -> None:
        """Move one in-flight entry to the account's quarantine, atomically."""
        keys = [rediskeys.events_quarantine(account_id), rediskeys.events_inflight(account_id, instance)]
        entry = quarantine_entry(raw, reason, sqlstate)
        if self._acks is None:
            pipe = self._client.pipeline(transaction=True)
            pipe.rpush(keys[0], entry)
            pipe.lrem(keys[1], 1, cast(str, raw))
            pipe.execute()
            return
        self._acks.run(keys[0], lambda pipe: eval_script(pipe, _QUARANTINE, keys, [entry, raw]),
                       write="event_move")

    def put_back(self, account_id: int, instance: str) -> int:
        """Move `instance`'s in-flight entries back to the head of the list; how many moved."""
        keys = [rediskeys.events_deadletter(account_id),
                rediskeys.events_inflight(account_id, instance)]
        if self._acks is None:
            return int(self._put_back(keys=keys, args=[self.ttl_ms]))
        return int(self._acks.run(keys[0], lambda pipe: eval_script(pipe, _PUT_BACK, keys,
                                                                     [self.ttl_ms]),
                                  write="event_move")[0])
