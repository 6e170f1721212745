"""A durable copy of every gift bomb held in memory for its recipients.

A gift bomb (`channel.subscription.gift`) is held by `GiftLinker` for up to
its window (3 s) so that its gifted subs can be written in the same
transaction. EventSub does not redeliver, so a crash in that window used to
lose it. Now, before it is held, its entry is written to
`lumio:events:held:{ACCOUNT}:INSTANCE` (a hash: `TOKEN|EVENT_ID` -> entry,
TOKEN the process's claim token); once the final event (with its recipients)
was taken by `persist_event`, the copy is deleted.

Recovery (`recover`, run by the events retry leader each pass): the copies
of an instance whose heartbeat is gone, and this instance's copies written by
an earlier process (another token: a restart with the same instance id),
move to the account's dead-letter list in one script, where the retry worker
stores them with their original id. So a held gift is stored once: from its
final form, or from the copy (without the recipients linked in memory; the
recipients are their own rows either way). A crash after the final was
persisted and before the copy was deleted makes the copy a repeat, which the
idempotent insert counts as recovered, never a second row.

When Redis refuses the copy the gift is held in memory only, as before
(logged); the linking never waits for Redis beyond its socket timeout.

Durable when `keep` returns True: what Redis acknowledged.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from lumio_ingestd.cluster.instances import PROCESS_TOKEN
from lumio_ingestd.events.deadletter import DEADLETTER_TTL_SECS
from lumio_ingestd.logs import Throttled
from lumio_ingestd.model import PlatformEvent
from lumio_ingestd.stores import rediskeys
from lumio_ingestd.stores.redisclient import REDIS_ERRORS
from lumio_ingestd.stores.replicas import ReplicaAcks

log = logging.getLogger("lumio_ingestd.events.held")

_PATTERN = "lumio:events:held:{*}:*"

# KEYS: held hash, dead-letter list. ARGV: ttl ms, token prefix ("" = every
# field, else only fields NOT starting with it). Returns how many moved.
_RECOVER = """
local flat = redis.call('HGETALL', KEYS[1])
local moved = 0
for i = 1, #flat, 2 do
    local field = flat[i]
    if ARGV[2] == '' or string.sub(field, 1, #ARGV[2]) ~= ARGV[2] then
        redis.call('RPUSH', KEYS[2], flat[i + 1])
        redis.call('HDEL', KEYS[1], field)
        moved = moved + 1
    end
end
if moved > 0 then
    redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[1]))
end
return moved
"""


class HeldGifts:
    def __init__(self, client: redis.Redis, instance: str, *, token: str = PROCESS_TOKEN,
                 acks: ReplicaAcks | None = None) -> None:
        self._client = client
        #: `min_replicas_acked`: a copy counts only once WAIT says the replicas hold it.
        self._acks = acks
        self.instance = instance
        self.token = token
        self._recover = client.register_script(_RECOVER)
        self._failed_log = Throttled(log)

    def _field(self, ev: PlatformEvent) -> str:
        return f"{self.token}|{ev.id}"

    def keep(self, ev: PlatformEvent) -> bool:
        """Write the copy before the gift is held; False (logged) when Redis refused it."""
        try:
            key = rediskeys.events_held(ev.account_id, self.instance)
            if self._acks is None:
                self._client.hset(key, self._field(ev), ev.to_entry())
            else:
                self._acks.run(key, lambda pipe: pipe.hset(key, self._field(ev), ev.to_entry()),
                               write="held_gift")
        except REDIS_ERRORS as exc:
            self._failed_log.log(logging.WARNING, "held gift %s (account %d) has no durable copy "
                                 "(Redis: %s); it is held in memory only", ev.id, ev.account_id,
                                 type(exc).__name__)
            return False
        return True

    def done(self, ev: PlatformEvent) -> None:
        """The final gift was taken: delete the copy (a copy left behind is a harmless repeat)."""
        try:
            self._client.hdel(rediskeys.events_held(ev.account_id, self.instance), self._field(ev))
        except REDIS_ERRORS as exc:
            log.debug("held gift %s: copy not deleted (%s); it will be replayed as a repeat",
                      ev.id, type(exc).__name__)

    def recover(self) -> int:
        """Park the copies of dead instances and of this instance's earlier processes."""
        moved_total = 0
        for raw_key in self._client.scan_iter(match=_PATTERN, count=1000):
            key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
            try:
                account, owner = rediskeys.account_of(key), rediskeys.instance_of_inflight(key)
            except ValueError:
                continue
            if owner == self.instance:
                keep_prefix = self.token + "|"  # ours are live: only older processes' copies
            elif self._client.exists(rediskeys.instance_heartbeat(owner)):
                continue
            else:
                keep_prefix = ""
            moved: Any = self._recover(keys=[key, rediskeys.events_deadletter(account)],
                                       args=[DEADLETTER_TTL_SECS * 1000, keep_prefix])
            if int(moved):
                log.warning("recovered %d held gift bomb(s) of instance %s (account %d) into the "
                            "dead-letter list", int(moved), owner, account)
                moved_total += int(moved)
        return moved_total
